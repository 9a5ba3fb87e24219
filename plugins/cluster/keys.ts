import { Elysia, t } from 'elysia'
import type { EventBus } from '../../src/host/bus.ts'
import type { Logger } from '../../src/host/logger.ts'
import type { KeyRecord } from '../../src/http/keys/key.ts'
import {
  cursorOf,
  cursorText,
  type UsageWindow,
  usageAnswer,
  usageQuery,
} from '../../src/http/keys/routes.ts'
import { UsageAnswer, UsageQuerySchema } from '../../src/http/keys/schemas.ts'
import type { InferenceKeys, KeySpend } from '../../src/http/keys/service.ts'
import type { UsageCursor, UsagePage, UsageRow } from '../../src/http/keys/usage-book.ts'
import { ControllerError } from '../../src/http/schemas.ts'
import type { PeerCalls, PeerTarget } from './peer-client.ts'

/**
 * Inference keys across the cluster: a key made, changed or revoked on any pod holds on every pod
 * within a second, and a key's budget holds across them.
 *
 * - told: a change on this pod (`keys.changed`, origin local) is sent at once to every other pod,
 *   `POST /internal/keys/sync` with the changed records (the secret's digest, never the secret);
 * - the leader's sync: when a pod (re)joins, the leader sends it every record it has, as it does
 *   presets; the other pods ask it for its records; and a pod that starts asks the others for theirs
 *   (`GET /internal/keys`), so one that was down learns what it missed, and what it alone knew
 *   reaches the others;
 * - every pod keeps the newer version of a record, and a revocation (a tombstone) is never undone
 *   (KeyBook.merge), so the order in which pods hear of changes does not matter;
 * - budgets: every second each pod tells the others what it spent of each budgeted key's current
 *   period (`POST /internal/keys/spend`, the keys that changed; all of them every SPEND_ALL_TICKS and
 *   to a pod that joins), and each counts the others' spends against the budget. Rate limits and
 *   concurrency stay per pod: each pod holds a key to them for the requests that enter it.
 *
 * Any pod may change keys, whatever term it has seen (a revocation only ever refuses more), so these
 * routes skip the term fence; they are signed and addressed like every internal call.
 */
export const KEYS_PATH = '/internal/keys'
/** Records per POST (a full sync of many keys goes in several). */
const BATCH = 5000
const SPEND_MS = 1000
/** Every this many spend ticks, every spend is sent again (a pod that missed one catches up). */
const SPEND_ALL_TICKS = 10

export interface KeySyncDeps {
  keys: InferenceKeys
  podId: string
  peers: Pick<PeerCalls, 'request'>
  /** The other pods this pod knows (ClusterService.members.peers()). */
  others: () => PeerTarget[]
  isLeader: () => boolean
  bus: EventBus
  log: Logger
  timeoutMs: number
}

export class KeySync {
  private readonly offs: (() => void)[] = []
  private readonly pending = new Set<Promise<unknown>>()
  private timer: Timer | null = null
  private ticks = 0

  constructor(private readonly d: KeySyncDeps) {}

  async start(): Promise<void> {
    this.offs.push(
      this.d.bus.on('keys.changed', (e) => {
        if (e.origin === 'local') this.tell(this.d.keys.records(e.keys.map((k) => k.id)), this.d.others())
      }),
      this.d.bus.on('cluster.pod.joined', (pod) => {
        if (this.d.isLeader()) this.tell(this.d.keys.records(), [pod])
        this.track(this.learnFrom(pod))
        this.sendSpends([pod], true)
      }),
    )
    await Promise.all(this.d.others().map((pod) => this.learnFrom(pod)))
    this.timer = setInterval(() => {
      this.ticks++
      this.sendSpends(this.d.others(), this.ticks % SPEND_ALL_TICKS === 0)
    }, SPEND_MS)
    this.timer.unref()
  }

  async stop(deadline: AbortSignal): Promise<void> {
    for (const off of this.offs.splice(0)) off()
    if (this.timer) clearInterval(this.timer)
    this.timer = null
    await Promise.race([
      Promise.allSettled([...this.pending]),
      new Promise((r) => deadline.addEventListener('abort', r, { once: true })),
    ])
  }

  /** tell sends records to `pods` (one that cannot be reached learns them when it (re)joins). */
  private tell(records: KeyRecord[], pods: PeerTarget[]): void {
    if (records.length === 0) return
    for (const pod of pods)
      for (let i = 0; i < records.length; i += BATCH)
        this.track(
          this.d.peers
            .request(
              pod,
              'POST',
              `${KEYS_PATH}/sync`,
              { keys: records.slice(i, i + BATCH) },
              {
                timeoutMs: this.d.timeoutMs,
              },
            )
            .catch((err: unknown) =>
              this.d.log.warn(
                'a pod was not told of inference key changes (it learns them when it rejoins)',
                {
                  pod: pod.podId,
                  error: err instanceof Error ? err.message : String(err),
                },
              ),
            ),
        )
  }

  /** learnFrom asks `pod` for every record it has and keeps what is newer. */
  private async learnFrom(pod: PeerTarget): Promise<void> {
    try {
      const answer = await this.d.peers.request<{ keys: KeyRecord[] }>(pod, 'GET', KEYS_PATH, undefined, {
        timeoutMs: this.d.timeoutMs,
      })
      const changed = this.d.keys.merge(answer.keys)
      if (changed > 0) this.d.log.info('inference keys learnt from a pod', { pod: pod.podId, count: changed })
    } catch (err) {
      this.d.log.debug('could not ask a pod for its inference keys', {
        pod: pod.podId,
        error: err instanceof Error ? err.message : String(err),
      })
    }
  }

  private sendSpends(pods: PeerTarget[], all: boolean): void {
    if (pods.length === 0) return
    const spends = this.d.keys.spends(all)
    if (spends.length === 0) return
    const body = { pod: this.d.podId, spends }
    for (const pod of pods)
      this.track(
        this.d.peers
          .request(pod, 'POST', `${KEYS_PATH}/spend`, body, { timeoutMs: this.d.timeoutMs })
          .catch((err: unknown) =>
            this.d.log.debug('a pod was not told of budget spends', {
              pod: pod.podId,
              error: err instanceof Error ? err.message : String(err),
            }),
          ),
      )
  }

  private track(p: Promise<unknown>): void {
    this.pending.add(p)
    void p.finally(() => this.pending.delete(p))
  }
}

const Limit = t.Nullable(t.Integer({ minimum: 1 }))
const KeyRecordSchema = t.Object({
  id: t.String({ minLength: 1, maxLength: 64 }),
  name: t.String({ minLength: 1, maxLength: 128 }),
  digest: t.String({ pattern: '^[0-9a-f]{64}$' }),
  models: t.Nullable(t.Array(t.String({ minLength: 1, maxLength: 512 }), { maxItems: 1000 })),
  rpm: Limit,
  tpm: Limit,
  max_concurrent: Limit,
  budget_tokens: Limit,
  budget_period: t.Nullable(t.Union([t.Literal('day'), t.Literal('month')])),
  priority: t.Union([t.Literal('high'), t.Literal('normal'), t.Literal('low')]),
  expires_at: t.Nullable(t.Integer()),
  created_at: t.Integer(),
  version: t.Integer(),
  revoked_at: t.Nullable(t.Integer()),
})
const SpendSchema = t.Object({
  id: t.String({ maxLength: 64 }),
  period_start: t.Integer(),
  tokens: t.Integer({ minimum: 0 }),
})
const errors = { 400: ControllerError, 401: ControllerError, 403: ControllerError }

/** keyInternalRoutes: the receiving side of KeySync, and this pod's usage for the cluster's view. */
export function keyInternalRoutes(keys: InferenceKeys) {
  const tags = ['internal']
  return new Elysia({ name: 'cluster-key-routes' })
    .get(KEYS_PATH, () => ({ keys: keys.records() }), {
      response: { 200: t.Object({ keys: t.Array(KeyRecordSchema) }), ...errors },
      detail: {
        tags,
        summary: 'Every inference key record of this pod (revoked ones included), for a pod that starts',
      },
    })
    .post(`${KEYS_PATH}/sync`, ({ body }) => ({ changed: keys.merge(body.keys as KeyRecord[]) }), {
      body: t.Object({ keys: t.Array(KeyRecordSchema, { maxItems: BATCH }) }),
      response: { 200: t.Object({ changed: t.Integer() }), ...errors },
      detail: {
        tags,
        summary: 'Inference key records from another pod: each kept when newer; a revocation is never undone',
      },
    })
    .post(
      `${KEYS_PATH}/spend`,
      ({ body }) => {
        keys.peerSpent(body.pod, body.spends as KeySpend[])
        return { ok: true }
      },
      {
        body: t.Object({
          pod: t.String({ maxLength: 256 }),
          spends: t.Array(SpendSchema, { maxItems: 1_000_000 }),
        }),
        response: { 200: t.Object({ ok: t.Boolean() }), ...errors },
        detail: { tags, summary: 'What another pod spent of each budgeted key’s current period' },
      },
    )
    .post(
      `${KEYS_PATH}/usage`,
      ({ body }) => {
        const q = usageQuery(body)
        return usageAnswer(q, keys.usage.rows(q))
      },
      {
        // In the body: a signed call's query names its destination pod in `to`.
        body: UsageQuerySchema,
        response: { 200: UsageAnswer, ...errors },
        detail: {
          tags,
          summary: 'This pod’s usage of inference keys (GET /api/cluster/usage asks every pod)',
        },
      },
    )
}

/** ClusterUsagePods: what the cluster's usage view reads of the cluster. */
export interface ClusterUsagePods {
  readonly podId: string
  others(): PeerTarget[]
}

/**
 * clusterUsageRoutes: `GET /api/cluster/usage`, every pod's usage (as GET /api/usage answers it on
 * each) added up row by row, with which pods answered.
 */
export function clusterUsageRoutes(
  keys: InferenceKeys,
  cluster: ClusterUsagePods,
  peers: Pick<PeerCalls, 'request'>,
  timeoutMs: number,
) {
  return new Elysia({ name: 'cluster-usage-routes' }).get(
    '/api/cluster/usage',
    async ({ query }) => {
      const q = usageQuery(query)
      const window: UsageWindow = {
        from: new Date(q.from).toISOString(),
        to: new Date(q.to).toISOString(),
        granularity: q.granularity,
        group_by: q.groupBy,
        limit: q.limit,
        cursor: cursorText(q.after) ?? undefined,
      }
      const pods = [{ pod_id: cluster.podId, ok: true as boolean, error: undefined as string | undefined }]
      const all: UsagePage[] = [keys.usage.rows(q)]
      await Promise.all(
        cluster.others().map(async (pod) => {
          try {
            const answer = await peers.request<{ rows: UsageRow[]; next_cursor?: string | null }>(
              pod,
              'POST',
              `${KEYS_PATH}/usage`,
              window,
              {
                timeoutMs,
              },
            )
            all.push({ rows: answer.rows, next: cursorOf(answer.next_cursor ?? undefined) })
            pods.push({ pod_id: pod.podId, ok: true, error: undefined })
          } catch (err) {
            pods.push({
              pod_id: pod.podId,
              ok: false,
              error: err instanceof Error ? err.message : String(err),
            })
          }
        }),
      )
      return {
        ...usageAnswer(q, addPages(all, q.groupBy)),
        pods: pods.map(({ error, ...p }) => (error ? { ...p, error } : p)),
      }
    },
    {
      query: UsageQuerySchema,
      response: {
        200: t.Composite([
          UsageAnswer,
          t.Object({
            pods: t.Array(t.Object({ pod_id: t.String(), ok: t.Boolean(), error: t.Optional(t.String()) })),
          }),
        ]),
        ...errors,
      },
      detail: {
        tags: ['cluster'],
        summary: 'Usage of inference keys across every pod of the cluster',
        description:
          'Each pod counts the requests that entered it; this asks every pod this pod knows and adds their rows ' +
          '(per hour or day, per key or model). `pods` says which answered; a pod that did not is left out of ' +
          'the sums. Same query as GET /api/usage.',
      },
    },
  )
}

/** addRows: rows of several pods added up by (start, key or model). */
/**
 * addPages: the pods' pages of one query added up row by row. Each pod's page ends where its own
 * rows did, so the sum is whole only up to the earliest end among pods that have more: rows past it
 * are left to the next page, which starts there (every pod orders its rows alike).
 */
function addPages(pages: UsagePage[], groupBy: 'key' | 'model'): UsagePage {
  let end: UsageCursor | null = null
  for (const p of pages) if (p.next && (end === null || before(p.next, end))) end = p.next
  const rows = addRows(
    pages.map((p) => p.rows),
    groupBy,
  )
  if (end === null) return { rows, next: null }
  const stop = end
  return { rows: rows.filter((r) => !before(stop, cursorAt(r, groupBy))), next: stop }
}

const cursorAt = (r: UsageRow, groupBy: 'key' | 'model'): UsageCursor => ({
  start: Date.parse(r.start),
  group: (groupBy === 'key' ? r.key_id : r.model) ?? '',
})

/** before: cursor a orders before b (by start, then by key id or model, as SQLite's binary order does). */
function before(a: UsageCursor, b: UsageCursor): boolean {
  return a.start < b.start || (a.start === b.start && a.group < b.group)
}

function addRows(lists: UsageRow[][], groupBy: 'key' | 'model'): UsageRow[] {
  const out = new Map<string, UsageRow>()
  for (const rows of lists)
    for (const r of rows) {
      const id = `${r.start}\u0000${groupBy === 'key' ? r.key_id : r.model}`
      const sum = out.get(id)
      if (!sum) out.set(id, { ...r })
      else {
        sum.requests += r.requests
        sum.prompt_tokens += r.prompt_tokens
        sum.completion_tokens += r.completion_tokens
        sum.errors += r.errors
      }
    }
  const at = (r: UsageRow) => cursorAt(r, groupBy)
  return [...out.values()].sort((a, b) => (before(at(a), at(b)) ? -1 : before(at(b), at(a)) ? 1 : 0))
}
