import { abortable } from '../host/abortable.ts'

/**
 * VllmClient is the one client of an engine's HTTP endpoints other than inference: /health,
 * /sleep, /wake_up, /is_sleeping, /metrics and /tokenize. The gateway, the router and the
 * benchmarks' prompt builder all use it. Every call has a deadline, so a hung engine never hangs a
 * request of ours, and may also take the caller's AbortSignal (the router's calls end when it
 * stops). Engines are addressed directly, never through an HTTP_PROXY from the environment.
 */
export class EngineCallError extends Error {
  constructor(
    message: string,
    /** the engine's HTTP status, or null when it gave no answer */
    readonly status: number | null,
  ) {
    super(message)
    this.name = 'EngineCallError'
  }
}

export interface CallOptions {
  /** deadline of this call in ms (each method has its own default) */
  timeoutMs?: number
  /** ends the call early; it then fails as the client's `abortedAs` says */
  signal?: AbortSignal
}

export interface VllmClientOptions {
  /** what a call ended by its signal is reported as (e.g. "the router is stopping") */
  abortedAs?: string
}

/** HealthProbe: a /health answer with its round trip, or why there was none. */
export type HealthProbe = { ok: true; seconds: number } | { ok: false; error: string }

export interface Tokenized {
  count: number
  /** max_model_len as the engine reported it, when it did */
  maxModelLen: number | null
}

/**
 * engineOrigin: the base URL of an engine listening on host:port, as a local client reaches it.
 * A wildcard address is reached on loopback (0.0.0.0 → 127.0.0.1, :: → [::1]); an IPv6 address is
 * bracketed once.
 */
export function engineOrigin(host: string, port: number): string {
  let h = host
  if (h === '0.0.0.0') h = '127.0.0.1'
  else if (h === '::' || h === '[::]') h = '[::1]'
  else if (h.includes(':') && !h.startsWith('[')) h = `[${h}]`
  return `http://${h}:${port}`
}

/** The sleep-mode endpoints: a 404 on one of them means the engine runs without sleep mode. */
const SLEEP_PATH = /^\/(sleep|wake_up|is_sleeping)(\?|$)/
/** Statuses meaning the engine has no /tokenize at all. */
const NO_TOKENIZE = new Set([404, 405, 501])

export class VllmClient {
  /**
   * sleepMode: whether the engine has sleep mode, as its answers on the sleep endpoints showed
   * (null: not known yet; false after a 404 there).
   */
  sleepMode: boolean | null = null

  constructor(
    readonly baseUrl: string,
    private readonly timeoutMs = 10000,
    private readonly opts: VllmClientOptions = {},
  ) {}

  /**
   * send makes one call and returns the engine's answer, whatever its status, or why there was
   * none. Answers on the sleep endpoints teach `sleepMode`.
   */
  private async send(
    method: string,
    path: string,
    o: CallOptions,
    defaultMs: number,
    body?: string,
  ): Promise<Response | { failure: string }> {
    const timeoutMs = o.timeoutMs ?? defaultMs
    const deadline = AbortSignal.timeout(timeoutMs)
    const init: BunFetchRequestInit = {
      method,
      signal: o.signal ? AbortSignal.any([deadline, o.signal]) : deadline,
      proxy: false,
    }
    if (body !== undefined) {
      init.body = body
      init.headers = { 'content-type': 'application/json' }
    }
    let res: Response
    try {
      res = await fetch(`${this.baseUrl}${path}`, init)
    } catch (err) {
      return { failure: this.describeFailure(err, timeoutMs) }
    }
    if (SLEEP_PATH.test(path)) {
      if (res.status === 404) this.sleepMode = false
      else if (res.ok) this.sleepMode = true
    }
    return res
  }

  private describeFailure(err: unknown, timeoutMs: number): string {
    const e = err as { name?: string; code?: string; message?: string }
    if (e?.name === 'TimeoutError') return `no answer within ${timeoutMs} ms`
    if (e?.name === 'AbortError') return this.opts.abortedAs ?? 'the call was cancelled'
    if (e?.code === 'ConnectionRefused' || e?.code === 'ECONNREFUSED') return 'connection refused'
    return e?.code ?? e?.message ?? 'connection failed'
  }

  /** answer: send, where no answer throws EngineCallError. */
  private async answer(method: string, path: string, o: CallOptions, defaultMs: number, body?: string) {
    const res = await this.send(method, path, o, defaultMs, body)
    if ('failure' in res) throw new EngineCallError(`engine ${method} ${path} failed: ${res.failure}`, null)
    return res
  }

  /** call: answer, where anything but 2xx throws EngineCallError with the start of the body. */
  private async call(method: string, path: string, o: CallOptions, defaultMs: number, body?: string) {
    return requireOk(await this.answer(method, path, o, defaultMs, body), method, path)
  }

  /** probe: GET /health; 200 is healthy, with the round trip in seconds. Never throws. */
  async probe(o: CallOptions = {}): Promise<HealthProbe> {
    const t0 = performance.now()
    const res = await this.send('GET', '/health', o, 2000)
    if ('failure' in res) return { ok: false, error: res.failure }
    await res.body?.cancel()
    if (res.status === 200) return { ok: true, seconds: (performance.now() - t0) / 1000 }
    return { ok: false, error: `engine /health answered ${res.status}` }
  }

  /** health: true on 200, false on anything else (including connection refused). */
  async health(timeoutMs = 2000, o: { signal?: AbortSignal } = {}): Promise<boolean> {
    return (await this.probe({ timeoutMs, signal: o.signal })).ok
  }

  async sleep(level: 1 | 2, o: CallOptions = {}): Promise<void> {
    await (await this.call('POST', `/sleep?level=${level}`, o, 120000)).body?.cancel()
  }

  async wake(tags: string[] = [], o: CallOptions = {}): Promise<void> {
    const q = tags.map((t) => `tags=${encodeURIComponent(t)}`).join('&')
    await (await this.call('POST', `/wake_up${q ? `?${q}` : ''}`, o, 300000)).body?.cancel()
  }

  async isSleeping(o: CallOptions = {}): Promise<boolean> {
    const body = (await (await this.call('GET', '/is_sleeping', o, 5000)).json()) as { is_sleeping?: unknown }
    return body.is_sleeping === true
  }

  /** metric reads one gauge from the engine's /metrics (summed over label sets), or null. */
  async metric(names: string[], o: CallOptions = {}): Promise<number | null> {
    const text = await (await this.call('GET', '/metrics', o, 3000)).text()
    for (const name of names) {
      let sum = 0
      let seen = false
      for (const line of text.split('\n')) {
        if (!line.startsWith(name)) continue
        const rest = line.slice(name.length)
        if (rest[0] !== ' ' && rest[0] !== '{') continue
        const v = Number(line.slice(line.lastIndexOf(' ') + 1))
        if (Number.isFinite(v)) {
          sum += v
          seen = true
        }
      }
      if (seen) return sum
    }
    return null
  }

  /**
   * tokenize: POST /tokenize, the prompt's length as the engine's own tokenizer counts it; null
   * when the engine has no /tokenize (404, 405 or 501).
   */
  async tokenize(model: string, prompt: string, o: CallOptions = {}): Promise<Tokenized | null> {
    const body = JSON.stringify({ model, prompt })
    const res = await this.answer('POST', '/tokenize', o, this.timeoutMs, body)
    if (NO_TOKENIZE.has(res.status)) {
      await res.body?.cancel()
      return null
    }
    const r = (await (await requireOk(res, 'POST', '/tokenize')).json()) as {
      count?: unknown
      tokens?: unknown
      max_model_len?: unknown
    }
    const count = typeof r.count === 'number' ? r.count : Array.isArray(r.tokens) ? r.tokens.length : null
    if (count === null)
      throw new EngineCallError('engine POST /tokenize answered without a count', res.status)
    return { count, maxModelLen: typeof r.max_model_len === 'number' ? r.max_model_len : null }
  }
}

/** requireOk passes a 2xx answer; anything else throws EngineCallError with the start of the body. */
async function requireOk(res: Response, method: string, path: string): Promise<Response> {
  if (res.ok) return res
  const text = (await res.text().catch(() => '')).slice(0, 300)
  throw new EngineCallError(
    `engine ${method} ${path} answered ${res.status}${text ? `: ${text}` : ''}`,
    res.status,
  )
}

/**
 * waitHealthy polls /health with exponential backoff until 200, `stop()` says give up, `signal`
 * aborts, or the deadline. `probeMs` caps each probe's own deadline (default 2000).
 */
export async function waitHealthy(
  client: Pick<VllmClient, 'health'>,
  opts: {
    initialMs: number
    maxMs: number
    deadlineMs: number
    stop?: () => boolean
    probeMs?: number
    signal?: AbortSignal
  },
): Promise<'healthy' | 'stopped' | 'timeout'> {
  const { signal } = opts
  const stopped = () => opts.stop?.() === true || signal?.aborted === true
  const until = Date.now() + opts.deadlineMs
  let delay = opts.initialMs
  while (Date.now() < until) {
    if (stopped()) return 'stopped'
    const probeMs = Math.min(opts.probeMs ?? 2000, Math.max(200, until - Date.now()))
    if (await client.health(probeMs, { signal })) return 'healthy'
    if (stopped()) return 'stopped'
    await abortable(Bun.sleep(Math.min(delay, Math.max(0, until - Date.now()))), { signal }).catch(() => {})
    delay = Math.min(opts.maxMs, Math.round(delay * 1.5))
  }
  return 'timeout'
}
