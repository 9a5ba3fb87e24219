import { abortable } from '../../../src/host/abortable.ts'

/**
 * EtcdClient: the few calls of etcd's v3 API that a session and an election need (lease grant,
 * keepalive and revoke; kv put, range, delete and txn; watch), over etcd's own JSON gateway
 * (grpc-gateway, served under /v3/ since 3.4) with the runtime's `fetch`. Not the `etcd3` npm
 * package: it speaks gRPC through @grpc/grpc-js and loads etcd's .proto files from disk at run
 * time, which a `bun build --compile` single binary does not carry. The gateway is part of every
 * etcd server, maps the same protobuf messages to JSON (bytes as base64, int64 as decimal
 * strings, zero values omitted) and needs nothing beyond HTTP.
 *
 * Endpoints are tried in order on a connection failure (the last one that answered is tried
 * first next time); every call has a deadline (`timeoutMs`, or the caller's); with a username the
 * client authenticates (POST /v3/auth/authenticate) and sends the token in `Authorization`,
 * authenticating again when etcd says the token is no longer valid.
 */
export interface EtcdClientOptions {
  endpoints: string[]
  timeoutMs: number
  username?: string
  password?: string
}

export interface CallOptions {
  signal?: AbortSignal
  timeoutMs?: number
}

export interface KeyValue {
  key: string
  value: string
  createRevision: number
  modRevision: number
  /** lease: the lease ID as etcd prints it (a decimal int64), '0' without a lease. */
  lease: string
}

export interface WatchEvent {
  type: 'put' | 'delete'
  kv: KeyValue
}

export interface RangeOptions {
  prefix?: boolean
  limit?: number
  sort?: { target: 'KEY' | 'VERSION' | 'CREATE' | 'MOD' | 'VALUE'; order: 'ASCEND' | 'DESCEND' }
  maxCreateRevision?: number
}

export interface Compare {
  key: string
  target: 'CREATE' | 'MOD' | 'VERSION' | 'VALUE'
  result: 'EQUAL' | 'GREATER' | 'LESS' | 'NOT_EQUAL'
  value: number | string
}

export type TxnOp =
  | { put: { key: string; value: string; lease?: string } }
  | { range: { key: string } & RangeOptions }
  | { deleteRange: { key: string; prefix?: boolean } }

export interface TxnResult {
  succeeded: boolean
  revision: number
  /** responses: one per op of the branch taken; a range gives its kvs. */
  responses: { kvs?: KeyValue[]; deleted?: number }[]
}

/** EtcdError: etcd answered with an error (`code` is the gRPC code: 5 not found, 11 compacted, 16 auth). */
export class EtcdError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code: number,
  ) {
    super(message)
    this.name = 'EtcdError'
  }
}

const GRPC_NOT_FOUND = 5
const GRPC_UNAUTHENTICATED = 16

interface RawKv {
  key?: string
  value?: string
  create_revision?: string
  mod_revision?: string
  lease?: string
}
interface Header {
  revision?: string
}

export const b64 = (s: string): string => Buffer.from(s, 'utf8').toString('base64')
const unb64 = (s: string | undefined): string => (s ? Buffer.from(s, 'base64').toString('utf8') : '')
const int = (s: string | undefined): number => (s ? Number(s) : 0)

/** prefixEnd: the range_end that selects every key starting with `prefix` (etcd's GetPrefixRangeEnd). */
export function prefixEnd(prefix: string): string {
  const b = Buffer.from(prefix, 'utf8')
  for (let i = b.length - 1; i >= 0; i--) {
    if (b[i]! < 0xff) {
      const end = Buffer.from(b.subarray(0, i + 1))
      end[i]! += 1
      return end.toString('base64')
    }
  }
  return Buffer.from([0]).toString('base64')
}

export function decodeKv(kv: RawKv): KeyValue {
  return {
    key: unb64(kv.key),
    value: unb64(kv.value),
    createRevision: int(kv.create_revision),
    modRevision: int(kv.mod_revision),
    lease: kv.lease ?? '0',
  }
}

function rangeBody(key: string, o: RangeOptions = {}): Record<string, unknown> {
  const body: Record<string, unknown> = { key: b64(key) }
  if (o.prefix) body['range_end'] = prefixEnd(key)
  if (o.limit) body['limit'] = String(o.limit)
  if (o.sort) Object.assign(body, { sort_target: o.sort.target, sort_order: o.sort.order })
  if (o.maxCreateRevision !== undefined) body['max_create_revision'] = String(o.maxCreateRevision)
  return body
}

function opBody(op: TxnOp): Record<string, unknown> {
  if ('put' in op) {
    const { key, value, lease } = op.put
    return { request_put: { key: b64(key), value: b64(value), ...(lease ? { lease } : {}) } }
  }
  if ('range' in op) return { request_range: rangeBody(op.range.key, op.range) }
  const { key, prefix } = op.deleteRange
  return { request_delete_range: { key: b64(key), ...(prefix ? { range_end: prefixEnd(key) } : {}) } }
}

const COMPARE_FIELD = { CREATE: 'create_revision', MOD: 'mod_revision', VERSION: 'version', VALUE: 'value' }

export class EtcdClient {
  private preferred = 0
  private token: Promise<string> | undefined
  private readonly closing = new AbortController()

  constructor(readonly opts: EtcdClientOptions) {}

  /** endpoints: the configured endpoints, for error messages. */
  get endpoints(): string {
    return this.opts.endpoints.join(', ')
  }

  async grant(ttlSeconds: number, o?: CallOptions): Promise<{ id: string; ttl: number }> {
    const r = await this.call<{ ID: string; TTL?: string }>('/lease/grant', { TTL: String(ttlSeconds) }, o)
    return { id: r.ID, ttl: int(r.TTL) }
  }

  /** keepAlive renews a lease once; it answers the lease's new TTL, 0 when the lease is gone. */
  async keepAlive(id: string, o?: CallOptions): Promise<number> {
    const r = await this.call<{ result?: { TTL?: string }; error?: { message?: string } }>(
      '/lease/keepalive',
      { ID: id },
      o,
    )
    if (!r.result) throw new EtcdError(`etcd keepalive failed: ${r.error?.message ?? 'no result'}`, 200, 0)
    return int(r.result.TTL)
  }

  /** revoke ends a lease and deletes its keys; a lease already gone is not an error. */
  async revoke(id: string, o?: CallOptions): Promise<void> {
    try {
      await this.call('/lease/revoke', { ID: id }, o)
    } catch (err) {
      if (!(err instanceof EtcdError && err.code === GRPC_NOT_FOUND)) throw err
    }
  }

  async put(key: string, value: string, lease?: string, o?: CallOptions): Promise<number> {
    const body = { key: b64(key), value: b64(value), ...(lease ? { lease } : {}) }
    const r = await this.call<{ header?: Header }>('/kv/put', body, o)
    return int(r.header?.revision)
  }

  async range(
    key: string,
    ro?: RangeOptions,
    o?: CallOptions,
  ): Promise<{ revision: number; kvs: KeyValue[] }> {
    const r = await this.call<{ header?: Header; kvs?: RawKv[] }>('/kv/range', rangeBody(key, ro), o)
    return { revision: int(r.header?.revision), kvs: (r.kvs ?? []).map(decodeKv) }
  }

  async deleteRange(key: string, prefix = false, o?: CallOptions): Promise<number> {
    const body = opBody({ deleteRange: { key, prefix } })['request_delete_range']
    const r = await this.call<{ deleted?: string }>('/kv/deleterange', body, o)
    return int(r.deleted)
  }

  async txn(
    t: { compare: Compare[]; success: TxnOp[]; failure?: TxnOp[] },
    o?: CallOptions,
  ): Promise<TxnResult> {
    const compare = t.compare.map((c) => ({
      key: b64(c.key),
      target: c.target,
      result: c.result,
      [COMPARE_FIELD[c.target]]: c.target === 'VALUE' ? b64(String(c.value)) : String(c.value),
    }))
    type RawOpResponse = { response_range?: { kvs?: RawKv[] }; response_delete_range?: { deleted?: string } }
    const r = await this.call<{ header?: Header; succeeded?: boolean; responses?: RawOpResponse[] }>(
      '/kv/txn',
      { compare, success: t.success.map(opBody), failure: (t.failure ?? []).map(opBody) },
      o,
    )
    return {
      succeeded: r.succeeded === true,
      revision: int(r.header?.revision),
      responses: (r.responses ?? []).map((x) => ({
        kvs: x.response_range ? (x.response_range.kvs ?? []).map(decodeKv) : undefined,
        deleted: x.response_delete_range ? int(x.response_delete_range.deleted) : undefined,
      })),
    }
  }

  /**
   * stream opens a long-lived POST (watch) and returns the response once its headers arrived
   * within the deadline; the caller reads the body and aborts `signal` to end it.
   */
  async stream(path: string, body: unknown, signal: AbortSignal, o?: CallOptions): Promise<Response> {
    const s = AbortSignal.any([signal, this.closing.signal])
    return abortable(this.send(path, body, s), {
      signal: s,
      timeoutMs: o?.timeoutMs ?? this.opts.timeoutMs,
      what: `etcd /v3${path} at ${this.endpoints}`,
    })
  }

  /** forgetToken makes the next call authenticate again (a watch was cancelled for an expired token). */
  forgetToken(): void {
    this.token = undefined
  }

  /** closed aborts when the client is closed (a watch stops retrying). */
  get closed(): AbortSignal {
    return this.closing.signal
  }

  /** close aborts every call in flight and refuses new ones. */
  close(): void {
    this.closing.abort(new Error('etcd client closed'))
  }

  private async call<T>(path: string, body: unknown, o: CallOptions = {}): Promise<T> {
    const ctrl = new AbortController()
    const signal = o.signal ? AbortSignal.any([o.signal, this.closing.signal]) : this.closing.signal
    const work = async () => {
      const res = await this.send(path, body, AbortSignal.any([ctrl.signal, signal]))
      return (await res.json()) as T
    }
    try {
      return await abortable(work(), {
        signal,
        timeoutMs: o.timeoutMs ?? this.opts.timeoutMs,
        what: `etcd /v3${path} at ${this.endpoints}`,
      })
    } finally {
      ctrl.abort()
    }
  }

  /** send POSTs to the first endpoint that accepts a connection; a non-2xx answer becomes an EtcdError. */
  private async send(path: string, body: unknown, signal: AbortSignal, reauthed = false): Promise<Response> {
    const headers: Record<string, string> = { 'content-type': 'application/json' }
    if (this.opts.username !== undefined && path !== '/auth/authenticate')
      headers['authorization'] = await this.authToken(signal)
    const eps = this.opts.endpoints
    let cause: unknown
    for (let n = 0; n < eps.length; n++) {
      const i = (this.preferred + n) % eps.length
      let res: Response
      try {
        res = await fetch(`${eps[i]}/v3${path}`, {
          method: 'POST',
          headers,
          body: JSON.stringify(body),
          signal,
        })
      } catch (err) {
        if (signal.aborted) throw err
        cause = err
        continue
      }
      this.preferred = i
      if (res.ok) return res
      const e = await errorOf(res, `${eps[i]}/v3${path}`)
      if (e.code === GRPC_UNAUTHENTICATED && this.opts.username !== undefined && !reauthed) {
        this.forgetToken()
        return this.send(path, body, signal, true)
      }
      throw e
    }
    throw new Error(
      `cannot reach etcd at ${this.endpoints}: ${cause instanceof Error ? cause.message : cause}`,
    )
  }

  private authToken(signal: AbortSignal): Promise<string> {
    if (!this.token) {
      const body = { name: this.opts.username, password: this.opts.password ?? '' }
      const p = this.send('/auth/authenticate', body, signal).then(async (res) => {
        const r = (await res.json()) as { token?: string }
        if (!r.token) throw new EtcdError(`etcd at ${this.endpoints} gave no auth token`, res.status, 0)
        return r.token
      })
      p.catch(() => {
        if (this.token === p) this.token = undefined
      })
      this.token = p
    }
    return this.token
  }
}

async function errorOf(res: Response, url: string): Promise<EtcdError> {
  const text = await res.text()
  let message = text.slice(0, 300)
  let code = 0
  try {
    const j = JSON.parse(text) as { message?: string; error?: string; code?: number }
    message = j.message ?? j.error ?? message
    code = j.code ?? 0
  } catch {}
  return new EtcdError(`etcd ${url} answered ${res.status}: ${message}`, res.status, code)
}
