import { abortable } from '../../../src/host/abortable.ts'
import { b64, decodeKv, type EtcdClient, type KeyValue, prefixEnd, type WatchEvent } from './etcd-client.ts'

/**
 * EtcdWatch: one etcd watch (POST /v3/watch) kept open for as long as it is wanted. The gateway
 * answers with a stream of JSON objects, one per line (`{"result":{header, created, events,
 * canceled, compact_revision}}`), parsed as they arrive. When the stream breaks the watch
 * reconnects from the revision after the last event it delivered, so no event is lost or repeated;
 * when that revision was compacted away it asks its owner to re-read the state (`onCompacted`,
 * which answers the revision it read at) and goes on from there, as clientv3's watcher does.
 * Bun's fetch ends a response silent for 300 s (its idle timeout): a quiet watch is then simply
 * reopened, which also retires a stream left half-open by a network fault.
 */
export interface WatchOptions {
  key: string
  prefix?: boolean
  /** startRevision: the first revision delivered. */
  startRevision: number
  onEvents: (events: WatchEvent[]) => void
  /** onCompacted re-reads what the watch covers and answers the revision it read at. */
  onCompacted: (compactRevision: number) => Promise<number>
  /** onTrouble is told of a broken stream (for a log line); the watch reconnects by itself. */
  onTrouble?: (err: unknown) => void
}

const RETRY_MIN_MS = 100
const RETRY_MAX_MS = 2000

class Compacted extends Error {
  constructor(readonly revision: number) {
    super(`watch revision compacted at ${revision}`)
  }
}

export class EtcdWatch {
  private next: number
  private readonly stopped = new AbortController()
  private conn = new AbortController()
  private restarting = false
  /** done settles when the watch has stopped (after stop()). */
  readonly done: Promise<void>

  constructor(
    private readonly client: EtcdClient,
    private readonly o: WatchOptions,
  ) {
    this.next = o.startRevision
    this.done = this.run()
  }

  /** restart drops the current stream and opens a new one from where it was (a stream may be half-open). */
  restart(): void {
    this.restarting = true
    this.conn.abort()
  }

  stop(): Promise<void> {
    this.stopped.abort()
    this.conn.abort()
    return this.done
  }

  private async run(): Promise<void> {
    let delay = RETRY_MIN_MS
    const over = () => this.stopped.signal.aborted || this.client.closed.aborted
    while (!over()) {
      this.restarting = false
      this.conn = new AbortController()
      try {
        await this.follow(this.conn.signal, () => {
          delay = RETRY_MIN_MS
        })
      } catch (err) {
        if (over()) return
        if (this.restarting) {
          this.restarting = false
          continue
        }
        if (err instanceof Compacted) {
          this.o.onTrouble?.(err)
          const read = await this.o.onCompacted(err.revision).catch((e: unknown) => {
            this.o.onTrouble?.(e)
            return undefined
          })
          if (read !== undefined) {
            this.next = read + 1
            continue
          }
        } else this.o.onTrouble?.(err)
      }
      if (over()) return
      const pause = Promise.withResolvers<void>()
      const t = setTimeout(pause.resolve, delay)
      await abortable(pause.promise, { signal: this.stopped.signal }).catch(() => {})
      clearTimeout(t)
      delay = Math.min(delay * 2, RETRY_MAX_MS)
    }
  }

  /** follow reads one stream until it ends, fails, is aborted, or is cancelled by etcd. */
  private async follow(signal: AbortSignal, healthy: () => void): Promise<void> {
    const req: Record<string, unknown> = { key: b64(this.o.key), start_revision: String(this.next) }
    if (this.o.prefix) req['range_end'] = prefixEnd(this.o.key)
    const res = await this.client.stream('/watch', { create_request: req }, signal)
    if (!res.body) throw new Error('etcd watch answered without a body')
    const decoder = new TextDecoder()
    let buf = ''
    try {
      for await (const chunk of res.body) {
        buf += decoder.decode(chunk, { stream: true })
        for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
          const line = buf.slice(0, nl).trim()
          buf = buf.slice(nl + 1)
          if (line) this.message(line, healthy)
        }
      }
    } finally {
      // A stream left early (compacted, cancelled, garbled) is closed, not left to the pool.
      if (!signal.aborted) this.conn.abort()
    }
  }

  private message(line: string, healthy: () => void): void {
    type Result = {
      created?: boolean
      canceled?: boolean
      compact_revision?: string
      cancel_reason?: string
      events?: { type?: 'PUT' | 'DELETE'; kv?: Parameters<typeof decodeKv>[0] }[]
    }
    const msg = JSON.parse(line) as { result?: Result; error?: { message?: string } }
    const r = msg.result
    if (!r) throw new Error(`etcd watch stream error: ${msg.error?.message ?? line.slice(0, 200)}`)
    if (r.compact_revision && r.compact_revision !== '0') throw new Compacted(Number(r.compact_revision))
    if (r.canceled) {
      if (r.cancel_reason?.includes('auth')) this.client.forgetToken()
      throw new Error(`etcd cancelled the watch: ${r.cancel_reason ?? 'no reason given'}`)
    }
    if (r.created) healthy()
    const events = (r.events ?? []).map(
      (e): WatchEvent => ({ type: e.type === 'DELETE' ? 'delete' : 'put', kv: decodeKv(e.kv ?? {}) }),
    )
    if (events.length === 0) return
    this.next = events[events.length - 1]!.kv.modRevision + 1
    this.o.onEvents(events)
  }
}

/**
 * waitDelete resolves once `key` is deleted at or after `revision` (or its history was compacted,
 * after which the caller reads again), as concurrency's waitDelete does; it rejects when `signal`
 * aborts.
 */
export async function waitDelete(
  client: EtcdClient,
  key: string,
  revision: number,
  signal: AbortSignal,
): Promise<void> {
  const gone = Promise.withResolvers<void>()
  const watch = new EtcdWatch(client, {
    key,
    startRevision: revision,
    onEvents: (events) => {
      if (events.some((e) => e.type === 'delete')) gone.resolve()
    },
    onCompacted: async () => {
      gone.resolve()
      return revision
    },
  })
  try {
    await abortable(gone.promise, { signal, what: `the deletion of ${key}` })
  } finally {
    await watch.stop()
  }
}

/**
 * PrefixMirror keeps every key under a prefix in memory (a range, then a watch from the revision
 * after it; a fresh range when the watch's history was compacted), like clientv3's mirror.Syncer,
 * and calls `onChange` after each change with the events (or 'reset' after a re-read).
 */
export class PrefixMirror {
  readonly kvs = new Map<string, KeyValue>()
  private watch: EtcdWatch | undefined
  private stopped = false

  constructor(
    private readonly client: EtcdClient,
    readonly prefix: string,
    private readonly onChange: (change: WatchEvent[] | 'reset', revision: number) => void,
    private readonly onTrouble?: (err: unknown) => void,
  ) {}

  async start(signal?: AbortSignal): Promise<void> {
    const revision = await this.read(signal)
    if (this.stopped) return
    this.watch = new EtcdWatch(this.client, {
      key: this.prefix,
      prefix: true,
      startRevision: revision + 1,
      onEvents: (events) => {
        for (const e of events) {
          if (e.type === 'delete') this.kvs.delete(e.kv.key)
          else this.kvs.set(e.kv.key, e.kv)
        }
        this.onChange(events, events[events.length - 1]!.kv.modRevision)
      },
      onCompacted: async () => {
        const rev = await this.read()
        this.onChange('reset', rev)
        return rev
      },
      ...(this.onTrouble ? { onTrouble: this.onTrouble } : {}),
    })
  }

  /** restart reopens the watch (after the connection to etcd was in doubt). */
  restart(): void {
    this.watch?.restart()
  }

  async stop(): Promise<void> {
    this.stopped = true
    await this.watch?.stop()
  }

  private async read(signal?: AbortSignal): Promise<number> {
    const r = await this.client.range(this.prefix, { prefix: true }, signal ? { signal } : undefined)
    this.kvs.clear()
    for (const kv of r.kvs) this.kvs.set(kv.key, kv)
    return r.revision
  }
}
