import { Elysia, t } from 'elysia'
import { badRequest } from '../errors.ts'
import { ControllerError } from '../schemas.ts'
import {
  KeyCreateBody,
  KeyCreated,
  KeyDetail,
  KeyPatchBody,
  KeyViewSchema,
  UsageAnswer,
  UsageQuerySchema,
} from './schemas.ts'
import type { InferenceKeys } from './service.ts'
import type { Granularity, GroupBy, UsageCursor, UsagePage, UsageQuery } from './usage-book.ts'

/**
 * keysRoutes: inference keys as an admin resource, and their usage. Thin: InferenceKeys decides.
 * Reads are open to admin-readonly; no answer but the one that creates a key carries its secret.
 */
const tags = ['keys']
const IdParams = t.Object({ id: t.String({ maxLength: 64 }) })
const errors = { 400: ControllerError, 401: ControllerError, 403: ControllerError, 404: ControllerError }

const HOUR_MS = 3_600_000
const DAY_MS = 86_400_000
/** The longest range one usage query may span, per granularity (hours: 31 days; days: 400). */
const MAX_RANGE_MS: Record<Granularity, number> = { hour: 31 * DAY_MS, day: 400 * DAY_MS }

export interface UsageWindow {
  from?: string | undefined
  to?: string | undefined
  granularity?: Granularity | undefined
  group_by?: GroupBy | undefined
  /** Rows per page (default USAGE_PAGE_ROWS, at most USAGE_MAX_ROWS). */
  limit?: number | undefined
  /** The `next_cursor` of the page before. */
  cursor?: string | undefined
}

/** Rows in one answer of the usage API unless `limit` says otherwise, and the most it may say. */
export const USAGE_PAGE_ROWS = 1000
export const USAGE_MAX_ROWS = 10_000

/** cursorText: a page's end as the opaque `next_cursor` a client sends back (null: no next page). */
export function cursorText(c: UsageCursor | null): string | null {
  return c === null ? null : Buffer.from(JSON.stringify([c.start, c.group])).toString('base64url')
}

/** cursorOf: the cursor a client sent (400 for one that no answer of this API gave). */
export function cursorOf(text: string | undefined): UsageCursor | null {
  if (text === undefined) return null
  try {
    const v = JSON.parse(Buffer.from(text, 'base64url').toString()) as unknown
    if (Array.isArray(v) && v.length === 2 && Number.isSafeInteger(v[0]) && typeof v[1] === 'string')
      return { start: v[0] as number, group: v[1] }
  } catch {
    // Not a cursor this API made: refused below.
  }
  throw badRequest('query.cursor: must be the next_cursor of an earlier answer')
}

/**
 * usageQuery reads a usage window: [from, to) widened to whole hours (`to` defaults to now, `from`
 * to a day before `to`, or 30 days with daily rows); 400 for a date it cannot read, an empty range
 * or one longer than MAX_RANGE_MS.
 */
export function usageQuery(q: UsageWindow, now = Date.now()): UsageQuery {
  const granularity = q.granularity ?? 'hour'
  const at = (name: string, v: string | undefined, fallback: number) => {
    if (v === undefined) return fallback
    const ms = Date.parse(v)
    if (!Number.isFinite(ms)) throw badRequest(`query.${name}: must be an ISO 8601 date-time`)
    return ms
  }
  const toMs = at('to', q.to, now)
  const fromMs = at('from', q.from, toMs - (granularity === 'day' ? 30 * DAY_MS : DAY_MS))
  const from = Math.floor(fromMs / HOUR_MS) * HOUR_MS
  const to = Math.ceil(toMs / HOUR_MS) * HOUR_MS
  if (to <= from) throw badRequest('query.from: must be before query.to')
  if (to - from > MAX_RANGE_MS[granularity])
    throw badRequest(
      `query: a range of at most ${MAX_RANGE_MS[granularity] / DAY_MS} days with ${granularity}ly rows`,
    )
  return {
    from,
    to,
    granularity,
    groupBy: q.group_by ?? 'key',
    limit: Math.min(USAGE_MAX_ROWS, q.limit ?? USAGE_PAGE_ROWS),
    after: cursorOf(q.cursor),
  }
}

/** usageAnswer: a page of rows of a query with the window they cover and where the next page starts. */
export function usageAnswer(query: UsageQuery, page: UsagePage) {
  return {
    from: new Date(query.from).toISOString(),
    to: new Date(query.to).toISOString(),
    granularity: query.granularity,
    group_by: query.groupBy,
    rows: page.rows,
    next_cursor: cursorText(page.next),
  }
}

const USAGE_DOC =
  'Rows per hour or day (`granularity`, UTC) of [from, to) widened to whole hours: `requests`, the engine’s own ' +
  '`prompt_tokens` and `completion_tokens`, and `errors` (status 400 or more). Requests refused before a model ' +
  'took them are errors under a label, never a name a client sent: `(refused)` for a model nobody serves, ' +
  '`(refused: requests|tokens|concurrency|quota|model)` for a refusal for the key (rpm, tpm, concurrency, a spent ' +
  'budget, a model it may not use). Counted on this pod, where the requests entered; written at most a second after they end. ' +
  '400 for a date that is not ISO 8601, an empty range, or more than 31 days of hourly (400 of daily) rows.'

export function keysRoutes(keys: InferenceKeys) {
  return new Elysia({ name: 'keys' })
    .group('/api/keys', (g) =>
      g
        .post(
          '',
          ({ body, set }) => {
            set.status = 201
            return keys.create(body)
          },
          {
            body: KeyCreateBody,
            response: { 201: KeyCreated, ...errors },
            detail: {
              tags,
              summary: 'Create an inference key (its secret is in this answer only)',
              description:
                'Body {name, models?, rpm?, tpm?, max_concurrent?, budget_tokens?, budget_period?, priority?, ' +
                'expires_at?}; absent or null: no limit. 201 with the key’s `id` and its secret in `key` ' +
                '(`mg-` and 43 base64url characters: 32 random bytes), shown once: only its SHA-256 is kept. ' +
                'From the first key on, inference needs a key (revoking them all does not open it again). ' +
                '400 VALIDATION_ERROR for an unknown field, a limit below 1, more than 1000 models.',
            },
          },
        )
        .get('', ({ query }) => keys.list(query.offset ?? 0, query.limit ?? 1000), {
          query: t.Object({
            offset: t.Optional(t.Integer({ minimum: 0 })),
            limit: t.Optional(t.Integer({ minimum: 1, maximum: 10_000, description: 'default 1000' })),
          }),
          response: { 200: t.Object({ keys: t.Array(KeyViewSchema), total: t.Integer() }), ...errors },
          detail: { tags, summary: 'List the live inference keys (oldest first; never a secret)' },
        })
        .get('/:id', ({ params }) => keys.detail(params.id), {
          params: IdParams,
          response: { 200: KeyDetail, ...errors },
          detail: {
            tags,
            summary: 'One inference key, with what this pod holds of it now',
            description: '404 KEY_NOT_FOUND for an unknown or revoked key.',
          },
        })
        .patch('/:id', ({ params, body }) => keys.update(params.id, body), {
          params: IdParams,
          body: KeyPatchBody,
          response: { 200: KeyViewSchema, ...errors },
          detail: {
            tags,
            summary: 'Change an inference key’s name or limits',
            description:
              'Absent fields stay; null removes a limit. Requests running keep going; the next ones see the ' +
              'new limits (on every pod of a cluster within a second). 404 KEY_NOT_FOUND.',
          },
        })
        .delete('/:id', ({ params }) => keys.revoke(params.id), {
          params: IdParams,
          response: { 200: t.Object({ id: t.String(), revoked: t.Literal(true) }), ...errors },
          detail: {
            tags,
            summary: 'Revoke an inference key',
            description:
              'Its next request is 401 invalid_api_key (a request running finishes); on every pod of a cluster ' +
              'within a second. 404 KEY_NOT_FOUND.',
          },
        })
        .get(
          '/:id/usage',
          ({ params, query }) => {
            const q = { ...usageQuery({ ...query, group_by: 'model' }), keyId: keys.known(params.id) }
            return usageAnswer(q, keys.usage.rows(q))
          },
          {
            params: IdParams,
            query: t.Omit(UsageQuerySchema, ['group_by']),
            response: { 200: UsageAnswer, ...errors },
            detail: {
              tags,
              summary: 'One key’s usage per model (a revoked key’s too)',
              description: `${USAGE_DOC} 404 KEY_NOT_FOUND for a key that never existed.`,
            },
          },
        ),
    )
    .get(
      '/api/usage',
      ({ query }) => {
        const q = usageQuery(query)
        return usageAnswer(q, keys.usage.rows(q))
      },
      {
        query: UsageQuerySchema,
        response: { 200: UsageAnswer, ...errors },
        detail: {
          tags,
          summary: 'Usage of every key (revoked ones and the static key included), by key or model',
          description: USAGE_DOC,
        },
      },
    )
}
