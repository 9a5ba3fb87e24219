import type { Server } from 'bun'
import { type AppError, internalError } from '../http/errors.ts'
import { probeConnect } from './connect-probe.ts'
import { TICK_MS, unwatch, type Watched, watch } from './ticker.ts'
import { sendUpstream, type Transport, type UpstreamCall, usesFetch } from './upstream.ts'
import {
  errorCode,
  upstreamConnectTimeout,
  upstreamDisconnected,
  upstreamTimeout,
  upstreamUnavailable,
} from './upstream-errors.ts'

/**
 * forward sends one client request to an upstream URL and returns the response to give the client.
 * It is the hot path shared by the gateway's inference routes and the router plugin, and knows
 * nothing about models or instances: the caller resolves the upstream and learns the outcome from
 * `onEnd`, called exactly once when the response has fully ended (last byte, client gone, or
 * upstream failure). forward never throws; upstream failures come back in the proxy error shape.
 *
 * - Transport (upstream.ts): the own HTTP/1.1 client for http:// upstreams (no 256-request cap
 *   as with Bun's fetch, socket-level backpressure, immediate aborts), fetch for https://.
 * - The request body is read once as bytes (or taken from `opts.body`) and sent unchanged.
 * - Headers pass through minus hop-by-hop ones; the method is the client's, path and query are
 *   the caller's URL.
 * - A response with a Content-Length (and not an event stream) is read whole and returned in one
 *   write; anything else is piped chunk by chunk with backpressure.
 * - Deadlines: no connection within `connectTimeoutMs` is a 504 `upstream_connect_timeout`; no
 *   first byte within `firstByteTimeoutMs` (headers of a buffered reply, first body chunk of a
 *   stream) a 504 `upstream_timeout` — this also ends requests stuck on a half-open pooled socket
 *   (bun#31894). Once bytes flow there is no deadline: a long generation is never cut.
 * - The client connection's idle timeout is suspended while the request runs (Bun.serve would close
 *   a connection waiting on a slow engine or a backpressured stream, bun#27479; on a reused
 *   keep-alive connection its timer can fire at any moment) and restored at the end.
 * - A client that goes away aborts the upstream request at once, seen through request.signal and
 *   the response stream's cancel (bun#25919, bun#28636), so the engine stops generating.
 * - Slow-path checks run from one shared ticker (ticker.ts), so a short request arms no timer and
 *   no listener; deadlines are honoured within TICK_MS.
 */
export interface ForwardEnd {
  /**
   * Outcome status: the upstream's status; 499 when the client went away before the end; the
   * 502/504 of the proxy error when the upstream failed (even after a 200 stream had started).
   */
  status: number
  /** Response body bytes handed to the client. */
  bytes: number
  durationMs: number
  /** Streams only: time from the request's arrival to the first body bytes. */
  ttftMs: number | null
  /** The body was piped (event stream or unknown length) rather than returned whole. */
  streamed: boolean
  /** The client went away before the response ended. */
  aborted: boolean
  /** Proxy error code when the upstream failed (upstream_unavailable, upstream_timeout, …). */
  error?: string
}

export interface ForwardOptions {
  /** The listener's server: lets long requests suspend the connection's idle timeout. */
  server?: Server<unknown> | null
  /** The request body when the caller has already read it (it is forwarded unchanged). */
  body?: Uint8Array<ArrayBuffer> | null
  /** Deadline for the first byte from the upstream (gateway default 600 s: prefill can be long). */
  firstByteTimeoutMs: number
  /** Deadline for connecting to the upstream (gateway default 5 s); 0 disables it. */
  connectTimeoutMs?: number
  /** The listener's keep-alive idle timeout, restored on the connection after a long request. */
  idleTimeoutSeconds?: number
  /** performance.now() when the request arrived (defaults to when forward was called). */
  startedAt?: number
  /**
   * 'auto' (default): the own HTTP/1.1 client for http:// upstreams, fetch for others; 'fetch':
   * always Bun's fetch (e.g. to honour HTTP_PROXY-style routing), which caps a process at 256
   * requests in flight.
   */
  transport?: Transport
  onEnd(info: ForwardEnd): void
}

/** BUFFER_LIMIT: replies up to this size with a Content-Length are returned in one piece. */
const BUFFER_LIMIT = 8 * 1024 * 1024
const DEFAULT_IDLE_SECONDS = 120
/** WATCH_CLIENT_MS: requests running longer than this listen for the client going away. */
const WATCH_CLIENT_MS = TICK_MS

export function forward(req: Request, upstreamUrl: string, opts: ForwardOptions): Promise<Response> {
  return new Exchange(req, upstreamUrl, opts).run()
}

enum Phase {
  /** waiting for the response head */
  Head,
  /** streaming, before the first body byte */
  FirstByte,
  /** bytes are flowing or the reply is being read whole */
  Body,
  Done,
}

class Exchange implements Watched {
  private readonly started: number
  private call: UpstreamCall | null = null
  private phase = Phase.Head
  private expired: 'first_byte' | 'connect' | null = null
  private clientGone = false
  private listening = false
  private probing = false
  private streamed = false
  private ttftMs: number | null = null
  private status = 0
  private readonly progress = { bytes: 0 }
  /** fetching: the upstream is reached through fetch, whose connect deadline is probed for. */
  private readonly fetching: boolean

  constructor(
    private readonly req: Request,
    private readonly url: string,
    private readonly opts: ForwardOptions,
  ) {
    this.started = opts.startedAt ?? performance.now()
    this.fetching = usesFetch(url, opts.transport)
  }

  /** run never rejects: an unexpected failure (a bug) still ends the exchange with a 500. */
  async run(): Promise<Response> {
    try {
      return await this.proxy()
    } catch (err) {
      console.error('proxy: unexpected failure', err)
      this.call?.abort(err)
      const error = internalError()
      this.status = error.status
      this.end(this.progress.bytes, error)
      return error.toResponse('proxy')
    }
  }

  private async proxy(): Promise<Response> {
    const { req, opts } = this
    const method = req.method
    let body = opts.body
    if (body === undefined && method !== 'GET' && method !== 'HEAD') {
      try {
        body = await req.bytes()
      } catch {
        // The client went away while sending its body.
        this.clientGone = true
        this.end(0)
        return new Response(null, { status: 499 })
      }
    }
    watch(this)
    opts.server?.timeout(req, 0)
    this.call = sendUpstream({
      url: this.url,
      method,
      headers: req.headers,
      body: body && body.byteLength > 0 ? body : null,
      connectTimeoutMs: this.fetching ? 0 : (opts.connectTimeoutMs ?? 0),
      transport: opts.transport ?? 'auto',
    })
    let reply: Awaited<UpstreamCall['reply']>
    try {
      reply = await this.call.reply
    } catch (cause) {
      return this.failBeforeBody(cause)
    }
    this.status = reply.status
    const sse = reply.contentType?.startsWith('text/event-stream') === true
    const headers = reply.clientHeaders()
    if (!reply.hasBody || (!sse && reply.length >= 0 && reply.length <= BUFFER_LIMIT)) {
      // The first-byte deadline still runs while the rest of a buffered reply arrives.
      this.phase = Phase.FirstByte
      let bytes: Uint8Array<ArrayBuffer> | null
      try {
        bytes = await reply.readAll()
      } catch (cause) {
        return this.failBeforeBody(cause)
      }
      this.end(bytes ? bytes.byteLength : 0)
      return new Response(bytes, { status: reply.status, headers })
    }
    this.streamed = true
    this.phase = Phase.FirstByte
    return new Response(
      reply.stream(this.progress, {
        sse,
        onFirstChunk: this.onFirstChunk,
        failure: this.streamFailure,
        onCancel: this.onClientAbort,
        onDone: this.onStreamDone,
      }),
      { status: reply.status, headers },
    )
  }

  /** tick: the slow path, every TICK_MS while the request runs (see ticker.ts). */
  tick(now: number): void {
    if (this.phase === Phase.Done) {
      unwatch(this)
      return
    }
    const age = now - this.started
    if (!this.listening && age >= WATCH_CLIENT_MS) {
      this.listening = true
      if (this.req.signal.aborted) {
        this.onClientAbort()
        return
      }
      this.req.signal.addEventListener('abort', this.onClientAbort)
    }
    if (
      (this.phase === Phase.Head || this.phase === Phase.FirstByte) &&
      age >= this.opts.firstByteTimeoutMs
    ) {
      this.expire('first_byte')
      return
    }
    const connectMs = this.opts.connectTimeoutMs ?? 0
    if (this.phase === Phase.Head && !this.probing && connectMs > 0 && age >= connectMs && this.fetching) {
      this.probing = true
      probeConnect(this.url, connectMs).then((result) => {
        if (result === 'timeout' && this.phase === Phase.Head) this.expire('connect')
      })
    }
    // A flowing stream needs nothing more once it listens for the client.
    if (this.phase === Phase.Body && this.listening) unwatch(this)
  }

  private expire(which: 'first_byte' | 'connect'): void {
    if (this.expired || this.phase === Phase.Done) return
    this.expired = which
    this.call?.abort(new Error(which))
  }

  private failBeforeBody(cause: unknown): Response {
    if (this.clientGone) {
      this.end(0)
      return new Response(null, { status: 499 })
    }
    const error = this.expiredError(cause) ?? upstreamUnavailable(cause)
    this.status = error.status
    this.end(0, error)
    return error.toResponse('proxy')
  }

  private expiredError(cause?: unknown): AppError | null {
    if (this.expired === 'first_byte') return upstreamTimeout(this.opts.firstByteTimeoutMs)
    if (this.expired === 'connect' || errorCode(cause) === 'ConnectTimeout')
      return upstreamConnectTimeout(this.opts.connectTimeoutMs ?? 0)
    return null
  }

  private readonly onClientAbort = () => {
    if (this.phase === Phase.Done || this.clientGone) return
    this.clientGone = true
    this.call?.abort(new Error('client went away'))
    // A stream ends here even if its reader is not waiting on the upstream right now.
    if (this.streamed) this.end(this.progress.bytes)
  }

  private readonly onFirstChunk = () => {
    this.ttftMs = performance.now() - this.started
    this.phase = Phase.Body
  }

  private readonly streamFailure = (cause: unknown): AppError =>
    this.expiredError(cause) ?? upstreamDisconnected(cause)

  private readonly onStreamDone = (error: AppError | null) => {
    if (error && !this.clientGone) this.status = error.status
    this.end(this.progress.bytes, this.clientGone ? undefined : (error ?? undefined))
  }

  private end(bytes: number, error?: AppError): void {
    if (this.phase === Phase.Done) return
    this.phase = Phase.Done
    unwatch(this)
    if (this.listening) this.req.signal.removeEventListener('abort', this.onClientAbort)
    if (!this.clientGone)
      this.opts.server?.timeout(this.req, this.opts.idleTimeoutSeconds ?? DEFAULT_IDLE_SECONDS)
    const info: ForwardEnd = {
      status: this.clientGone ? 499 : this.status,
      bytes,
      durationMs: performance.now() - this.started,
      ttftMs: this.ttftMs,
      streamed: this.streamed,
      aborted: this.clientGone,
    }
    if (error) info.error = error.code
    try {
      this.opts.onEnd(info)
    } catch (err) {
      console.error('proxy onEnd handler failed:', err)
    }
  }
}
