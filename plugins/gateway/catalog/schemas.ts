import { type Static, Type as T, type TLiteral } from '@sinclair/typebox'
import { GPU_MEMORY_UTILIZATION_MIN } from '../../../src/engine/driver.ts'
import { ENGINE_KINDS, type EngineKind } from '../../../src/engine/kinds.ts'

/**
 * The catalogue's records as TypeBox schemas, the one declaration of each: an entry as the YAML
 * gives it (`plugins.gateway.catalog[]`), as `PUT /api/catalog/{name}` takes it (the same fields
 * without the name, which is the path), and as every reader gets it back (defaults applied, with
 * its source). The limits bound what one entry can cost to store, list and launch.
 */
export const CATALOG_NAME_MAX = 128
export const EXTRA_ARGS_MAX_ITEMS = 64
export const EXTRA_ARG_MAX_LENGTH = 1024

/** NAME_CHARS: the characters of a catalogue name (served names like `org/model:tag` are common). */
export const NAME_CHARS = /^[A-Za-z0-9._:/-]*$/

export const CatalogNameSchema = T.String({
  minLength: 1,
  maxLength: CATALOG_NAME_MAX,
  pattern: NAME_CHARS.source,
  description:
    'what clients put in `model`; unique whatever its case; 1–128 of A–Z a–z 0–9 . _ : / - and not a file path (no leading /, ' +
    'no empty, . or .. segment)',
  errorMessage:
    'must be 1–128 characters of A–Z a–z 0–9 . _ : / - (a served model name such as org/model:tag)',
})

/** The engines an entry may name, as a union whose static type is EngineKind. */
const engineKinds = () =>
  ENGINE_KINDS.map((k) => T.Literal(k)) as [TLiteral<EngineKind>, ...TLiteral<EngineKind>[]]

const fields = {
  engine_kind: T.Optional(
    T.Union(engineKinds(), {
      description: 'the engine its load runs (vllm, sglang); default: plugins.gateway.engine.kind',
    }),
  ),
  model_path: T.String({
    minLength: 1,
    maxLength: 1024,
    description: 'model hub path or local path, as a load takes it',
  }),
  max_tokens: T.Optional(
    T.Integer({ minimum: 1, description: "context length; default: the model's maximum" }),
  ),
  tensor_parallel_size: T.Optional(
    T.Integer({
      minimum: 1,
      maximum: 64,
      description: 'GPUs per engine; default: the number of gpu_ids, else 1',
    }),
  ),
  gpu_memory_utilization: T.Optional(
    T.Number({
      minimum: GPU_MEMORY_UTILIZATION_MIN,
      maximum: 1,
      description: 'default: plugins.gateway.engine.gpu_memory_utilization when it loads',
    }),
  ),
  enable_sleep_mode: T.Optional(
    T.Boolean({ default: false, description: 'start the engine able to sleep (vLLM --enable-sleep-mode)' }),
  ),
  extra_args: T.Optional(
    T.Array(T.String({ maxLength: EXTRA_ARG_MAX_LENGTH }), {
      maxItems: EXTRA_ARGS_MAX_ITEMS,
      default: [],
      description: `appended to the engine command line; at most ${EXTRA_ARGS_MAX_ITEMS} of at most ${EXTRA_ARG_MAX_LENGTH} characters`,
    }),
  ),
  gpu_ids: T.Optional(
    T.Array(T.Integer({ minimum: 0 }), {
      minItems: 1,
      maxItems: 64,
      description: 'the GPUs it must run on (as many as tensor_parallel_size); default: wherever it fits',
    }),
  ),
  pin: T.Optional(T.Boolean({ default: false, description: 'never evicted once loaded' })),
  preload: T.Optional(T.Boolean({ default: false, description: 'loaded when modelgate starts' })),
}

/** CatalogEntryBody: the body of `PUT /api/catalog/{name}` (the entry without its name). */
export const CatalogEntryBody = T.Object(fields, { additionalProperties: false })

/** CatalogConfigEntrySchema: one entry of `plugins.gateway.catalog` in the YAML. */
export const CatalogConfigEntrySchema = T.Object(
  { name: CatalogNameSchema, ...fields },
  { additionalProperties: false },
)

export const CatalogSourceSchema = T.Union([T.Literal('config'), T.Literal('api')], {
  description:
    '`config`: from plugins.gateway.catalog in the YAML (changed there, read-only through the API); `api`: saved ' +
    'through PUT /api/catalog/{name}, kept in the data dir',
})

const nullable = <S extends Parameters<typeof T.Union>[0][number]>(s: S) => T.Union([s, T.Null()])

/** CatalogEntrySchema: an entry as every reader gets it, defaults applied. */
export const CatalogEntrySchema = T.Object({
  name: T.String(),
  engine_kind: nullable(
    T.Union(engineKinds(), { description: "null: the gateway's engine.kind when it loads" }),
  ),
  model_path: T.String(),
  max_tokens: nullable(T.Integer({ description: "null: the model's maximum" })),
  tensor_parallel_size: T.Integer(),
  gpu_memory_utilization: nullable(T.Number({ description: "null: the gateway's default when it loads" })),
  enable_sleep_mode: T.Boolean(),
  extra_args: T.Array(T.String()),
  gpu_ids: nullable(T.Array(T.Integer(), { description: 'null: wherever it fits' })),
  pin: T.Boolean(),
  preload: T.Boolean(),
  source: CatalogSourceSchema,
  updated_at: nullable(T.String({ description: 'when it was last saved through the API; null for config' })),
})

/** CatalogSavedSchema: the answer of a save, the stored entry and a warning when its fit was not checked. */
export const CatalogSavedSchema = T.Composite([
  CatalogEntrySchema,
  T.Object({
    warning: T.Optional(
      T.String({
        description: 'present when the fit could not be checked (no GPU probe): saved all the same',
      }),
    ),
  }),
])

export const CatalogListSchema = T.Object({ entries: T.Array(CatalogEntrySchema), total: T.Integer() })

export type CatalogEntryFields = Static<typeof CatalogEntryBody>
export type CatalogConfigEntry = Static<typeof CatalogConfigEntrySchema>
export type CatalogEntry = Static<typeof CatalogEntrySchema>
export type CatalogSource = Static<typeof CatalogSourceSchema>
export type CatalogSaved = Static<typeof CatalogSavedSchema>

/** CatalogChange: what `gateway.catalog.changed` carries: the entry saved, or the name removed. */
export type CatalogChange =
  | { change: 'saved'; entry: CatalogEntry; created: boolean }
  | { change: 'removed'; name: string }
