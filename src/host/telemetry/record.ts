/**
 * The span records modelgate exports, and the few things every span needs: random ids, a clock in
 * epoch milliseconds with sub-millisecond precision, and the sampling decision of a trace that
 * starts here. Spans are kept as plain records, written once into OTLP's JSON when their batch is
 * sent (otlp-json.ts): on the request path a span costs an object and its attributes, nothing more.
 */
export type AttributeValue =
  | string
  | number
  | boolean
  | readonly string[]
  | readonly number[]
  | readonly boolean[]

/** SpanAttributes: a span's attributes; an undefined value is not recorded. */
export type SpanAttributes = Record<string, AttributeValue | undefined>

/** SpanKind: OTLP's values (internal, server, client). */
export const KIND = { internal: 1, server: 2, client: 3 } as const
export type SpanKind = (typeof KIND)[keyof typeof KIND]

/** SpanEvent: a timestamped event on a span (`gen_ai.first_token`, `modelgate.wake.joined`). */
export interface SpanEvent {
  name: string
  time: number
  attributes: SpanAttributes | undefined
}

/**
 * AttributeList: a span's attributes as keys and values in turn (`[k0, v0, k1, v1, …]`): appended
 * to and written out in order, with no object shape to look up per span.
 */
export type AttributeList = (string | AttributeValue)[]

/** SpanRecord: one sampled span, from its start to its end (`end` 0 while it runs). */
export class SpanRecord {
  end = 0
  events: SpanEvent[] | null = null
  /** 0 unset, 2 error (OTLP's status codes; modelgate never sets OK). */
  status = 0
  statusMessage = ''

  constructor(
    readonly traceId: string,
    readonly spanId: string,
    /** '' for a root span. */
    readonly parentSpanId: string,
    readonly name: string,
    readonly kind: SpanKind,
    /** epoch ms */
    readonly start: number,
    /** the attributes it starts with, each key once */
    readonly attributes: AttributeList,
  ) {}

  /** set: an attribute's value (a key set again keeps its place with the new value; undefined: nothing). */
  set(key: string, value: AttributeValue | undefined): void {
    if (value === undefined) return
    const a = this.attributes
    for (let i = 0; i < a.length; i += 2)
      if (a[i] === key) {
        a[i + 1] = value
        return
      }
    a.push(key, value)
  }
}

/** attributeList: an attributes object as a list (undefined values left out). */
export function attributeList(attrs: SpanAttributes | undefined, into: AttributeList = []): AttributeList {
  if (attrs) for (const k in attrs) if (attrs[k] !== undefined) into.push(k, attrs[k]!)
  return into
}

/** now: the time in epoch milliseconds, to the microsecond (performance.now() from the process's origin). */
const ORIGIN = performance.timeOrigin
export function now(): number {
  return ORIGIN + performance.now()
}

/**
 * Random bytes are drawn in blocks (one call per 256 ids, not per id), and written as hex once per
 * block: an id is a slice of that text (a Buffer's toString per id cost more than the rest of a
 * span's start).
 */
const pool = Buffer.allocUnsafe(4096)
let poolHex = ''
let used = pool.length

/** randomHex: `bytes` random bytes as lower-case hex, never all zeros (W3C: an invalid id). */
export function randomHex(bytes: number): string {
  for (;;) {
    if (used + bytes > pool.length) {
      crypto.getRandomValues(pool)
      poolHex = pool.toString('hex')
      used = 0
    }
    const start = used
    used += bytes
    for (let i = start; i < used; i++) if (pool[i] !== 0) return poolHex.slice(start * 2, used * 2)
  }
}

/**
 * sampledByRatio: whether a trace that starts here is kept, decided by its id as OpenTelemetry's
 * TraceIdRatioBasedSampler decides (its four 32-bit words XORed, below ratio × 2^32 - 1), so every
 * service sampling at the same ratio keeps the same traces.
 */
export function sampledByRatio(traceId: string, ratio: number): boolean {
  if (ratio >= 1) return true
  if (ratio <= 0) return false
  let acc = 0
  for (let i = 0; i < 32; i += 8) acc = (acc ^ Number.parseInt(traceId.slice(i, i + 8), 16)) >>> 0
  return acc < Math.floor(ratio * 0xffffffff)
}
