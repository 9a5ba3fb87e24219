import { t } from 'elysia'

/** The TypeBox schemas of the keys API (validation and /docs). Limits are positive integers; null: none. */
const LIMIT_MAX = 1_000_000_000_000
const limit = (description: string) => t.Integer({ minimum: 1, maximum: LIMIT_MAX, description })
/** The most model names one key may list (a longer list is refused). */
export const MAX_KEY_MODELS = 1000

const Models = t.Array(t.String({ minLength: 1, maxLength: 512 }), {
  maxItems: MAX_KEY_MODELS,
  description:
    'model names this key may use, as clients send them in `model` (served name, alias or instance id); absent or null: every model',
})
const Period = t.Union([t.Literal('day'), t.Literal('month')], {
  description: 'the budget’s period, in UTC (default month)',
})
const Priority = t.Union([t.Literal('high'), t.Literal('normal'), t.Literal('low')], {
  description:
    'the order of this key’s requests in every queue that holds requests (a wake, an on-demand load); default normal',
})
const Expires = t.String({
  maxLength: 64,
  description: 'ISO 8601 date-time; requests after it: 401 invalid_api_key',
})

const fields = {
  models: Models,
  rpm: limit('requests per minute, per pod where requests enter'),
  tpm: limit('tokens (prompt + completion) per minute, per pod where requests enter'),
  max_concurrent: limit('requests in flight at once, per pod where requests enter'),
  budget_tokens: limit('tokens per budget period; once spent: 429 insufficient_quota until the next period'),
  budget_period: Period,
  priority: Priority,
  expires_at: Expires,
}

const Name = t.String({ minLength: 1, maxLength: 128, description: 'a name for people, metrics and usage' })

export const KeyCreateBody = t.Object(
  {
    name: Name,
    models: t.Optional(t.Nullable(fields.models)),
    rpm: t.Optional(t.Nullable(fields.rpm)),
    tpm: t.Optional(t.Nullable(fields.tpm)),
    max_concurrent: t.Optional(t.Nullable(fields.max_concurrent)),
    budget_tokens: t.Optional(t.Nullable(fields.budget_tokens)),
    budget_period: t.Optional(t.Nullable(fields.budget_period)),
    priority: t.Optional(fields.priority),
    expires_at: t.Optional(t.Nullable(fields.expires_at)),
  },
  { additionalProperties: false },
)

export const KeyPatchBody = t.Object(
  {
    name: t.Optional(Name),
    models: t.Optional(t.Nullable(fields.models)),
    rpm: t.Optional(t.Nullable(fields.rpm)),
    tpm: t.Optional(t.Nullable(fields.tpm)),
    max_concurrent: t.Optional(t.Nullable(fields.max_concurrent)),
    budget_tokens: t.Optional(t.Nullable(fields.budget_tokens)),
    budget_period: t.Optional(t.Nullable(fields.budget_period)),
    priority: t.Optional(fields.priority),
    expires_at: t.Optional(t.Nullable(fields.expires_at)),
  },
  { additionalProperties: false },
)

export const KeyViewSchema = t.Object({
  id: t.String(),
  name: t.String(),
  models: t.Nullable(t.Array(t.String())),
  rpm: t.Nullable(t.Integer()),
  tpm: t.Nullable(t.Integer()),
  max_concurrent: t.Nullable(t.Integer()),
  budget_tokens: t.Nullable(t.Integer()),
  budget_period: t.Nullable(Period),
  priority: Priority,
  expires_at: t.Nullable(t.String()),
  created_at: t.String(),
  updated_at: t.String(),
})

export const KeyCreated = t.Composite([
  KeyViewSchema,
  t.Object({ key: t.String({ description: 'the secret: shown in this answer only, never again' }) }),
])

export const KeyDetail = t.Composite([
  KeyViewSchema,
  t.Object({
    state: t.Object({
      in_flight: t.Integer({ description: 'requests of this key running on this pod' }),
      budget_used: t.Nullable(t.Integer({ description: 'tokens of the budget used in the current period' })),
      budget_period_end: t.Nullable(t.String()),
    }),
  }),
])

export const UsageRowSchema = t.Object({
  start: t.String({ description: 'start of the hour or day (UTC)' }),
  key_id: t.Optional(t.String()),
  key_name: t.Optional(t.String()),
  model: t.Optional(t.String()),
  requests: t.Integer(),
  prompt_tokens: t.Integer(),
  completion_tokens: t.Integer(),
  errors: t.Integer({ description: 'requests that ended with a status of 400 or more' }),
})

export const UsageQuerySchema = t.Object({
  from: t.Optional(t.String({ maxLength: 64, description: 'ISO 8601 start (default: `to` minus a day)' })),
  to: t.Optional(t.String({ maxLength: 64, description: 'ISO 8601 end, exclusive (default: now)' })),
  granularity: t.Optional(t.Union([t.Literal('hour'), t.Literal('day')], { description: 'default hour' })),
  group_by: t.Optional(t.Union([t.Literal('key'), t.Literal('model')], { description: 'default key' })),
  limit: t.Optional(t.Integer({ minimum: 1, maximum: 10_000, description: 'rows per page (default 1000)' })),
  cursor: t.Optional(
    t.String({ maxLength: 1024, description: 'the next_cursor of the page before (absent: the first page)' }),
  ),
})

export const UsageAnswer = t.Object({
  from: t.String(),
  to: t.String(),
  granularity: t.Union([t.Literal('hour'), t.Literal('day')]),
  group_by: t.Union([t.Literal('key'), t.Literal('model')]),
  rows: t.Array(UsageRowSchema),
  next_cursor: t.Nullable(
    t.String({
      description: 'where the next page begins (send it as `cursor`); null: this page is the last',
    }),
  ),
})
