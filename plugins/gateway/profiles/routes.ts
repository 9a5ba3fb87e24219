import { Elysia, t } from 'elysia'
import { badRequest, notFound } from '../../../src/http/errors.ts'
import { ControllerError } from '../../../src/http/schemas.ts'
import {
  PROFILE_BUNDLE_FORMAT,
  PROFILE_BUNDLE_VERSION,
  ProfileBundleSchema,
  ProfileSchema,
} from '../schemas.ts'
import { type CheckOptions, checkPreload, OK_FRACTION } from './check.ts'
import {
  type InstanceSource,
  instanceProfile,
  type ManualProfileInput,
  type MemoryProfile,
  manualProfile,
  type ProfileStore,
} from './service.ts'

/**
 * profileRoutes: the memory-profile endpoints, the pre-load check, and the export/import
 * bundle the cluster plugin reconciles pods with. Thin: ProfileStore and checkPreload decide.
 */
const tags = ['gateway']

const Envelope = t.Object({ profile: ProfileSchema })

const CreateBody = t.Object(
  {
    profileName: t.String({ minLength: 1, maxLength: 200 }),
    comments: t.Optional(t.String({ maxLength: 2000 })),
    instanceId: t.Optional(t.String({ minLength: 1, description: 'from a running instance' })),
    modelPath: t.Optional(t.String({ minLength: 1, description: 'manual' })),
    maxTokens: t.Optional(t.Integer({ minimum: 1, description: 'manual' })),
    totalGpuMemoryGib: t.Optional(t.Number({ exclusiveMinimum: 0, description: 'manual; per GPU' })),
    weightsMemoryGib: t.Optional(t.Number({ minimum: 0, description: 'manual; per GPU' })),
    cudaGraphsGib: t.Optional(t.Number({ minimum: 0, description: 'manual; per GPU' })),
    gpuName: t.Optional(t.String({ minLength: 1, description: 'manual; as nvidia-smi names it' })),
    gpuTotalMemoryGib: t.Optional(t.Number({ exclusiveMinimum: 0, description: 'manual' })),
    overheadMemoryGib: t.Optional(t.Number({ minimum: 0, description: 'manual, optional' })),
    kvCacheAvailableGib: t.Optional(t.Number({ minimum: 0, description: 'manual, optional' })),
    tensorParallelSize: t.Optional(t.Integer({ minimum: 1, description: 'manual, optional (default 1)' })),
    gpuMemoryUtilization: t.Optional(
      t.Number({ exclusiveMinimum: 0, maximum: 1, description: 'manual, optional' }),
    ),
  },
  { additionalProperties: false },
)

const MANUAL_REQUIRED = [
  'modelPath',
  'maxTokens',
  'totalGpuMemoryGib',
  'weightsMemoryGib',
  'cudaGraphsGib',
  'gpuName',
  'gpuTotalMemoryGib',
] as const
const MANUAL_FIELDS = [
  ...MANUAL_REQUIRED,
  'overheadMemoryGib',
  'kvCacheAvailableGib',
  'tensorParallelSize',
  'gpuMemoryUtilization',
] as const

const CheckBody = t.Object(
  {
    model_path: t.String({ minLength: 1 }),
    max_tokens: t.Optional(
      t.Integer({ minimum: 1, description: 'default: the profile with the largest max_tokens' }),
    ),
    gpu_ids: t.Optional(t.Array(t.Integer({ minimum: 0 }), { minItems: 1 })),
    gpu_name: t.Optional(t.String({ minLength: 1, description: 'instead of gpu_ids' })),
    tensor_parallel_size: t.Optional(t.Integer({ minimum: 1, maximum: 64 })),
    gpu_memory_utilization: t.Optional(t.Number({ exclusiveMinimum: 0, maximum: 1 })),
  },
  { additionalProperties: false },
)

const CheckResultSchema = t.Object({
  warning_level: t.Union([t.Literal('ok'), t.Literal('caution'), t.Literal('danger'), t.Literal('info')]),
  message: t.String(),
  profile_found: t.Boolean(),
  estimated_memory_gib: t.Nullable(t.Number({ description: 'per GPU' })),
  available_memory_gib: t.Nullable(t.Number({ description: 'free on the least free target GPU' })),
  gpu_name: t.Nullable(t.String()),
  gpu_total_memory_gib: t.Nullable(t.Number()),
  gpu_ids: t.Array(t.Number(), { description: 'the target GPUs on this host' }),
  profile_id: t.Nullable(t.String()),
})

const ImportResult = t.Object({
  imported: t.Integer(),
  skipped: t.Integer({ description: 'id already present, or a same-key profile at least as new' }),
})

const CHECK_DOCS =
  'Body: {model_path, max_tokens?, gpu_ids? | gpu_name?, tensor_parallel_size?, gpu_memory_utilization?}. ' +
  'Targets: gpu_ids; else the tensor_parallel_size GPUs of gpu_name with the most free memory; else the GPUs ' +
  'a load would pick (most free). The profile is the newest with the same model_path, max_tokens (absent: ' +
  'the largest), tensor parallelism and the target GPU name. Its per-GPU footprint is compared with the free ' +
  `memory of the least free target: ok ≤ ${OK_FRACTION * 100}%, caution ≤ 100%, danger above; info without ` +
  'a profile. A profile recorded at another gpu_memory_utilization (or device size) is re-sized to ' +
  'max(weights + CUDA graphs + overhead, utilization × device), as vLLM claims; a budget below the non-KV part ' +
  'is danger (no room for a KV cache). With gpu_name absent from this host, an empty GPU of that kind is ' +
  'assumed. The load endpoint applies the same check and refuses danger with 400 INSUFFICIENT_MEMORY unless ' +
  '`force: true`.'

export function profileRoutes(
  store: ProfileStore,
  service: InstanceSource,
  opts: CheckOptions & { version?: string } = {},
) {
  return new Elysia({ name: 'gateway-profile-routes' }).group('/api/memory/profiles', (g) =>
    g
      .get(
        '',
        () => {
          const profiles = store.list()
          return { profiles, total: profiles.length }
        },
        {
          response: t.Object({ profiles: t.Array(ProfileSchema), total: t.Number() }),
          detail: { tags, summary: 'List memory profiles (newest first)' },
        },
      )
      .post(
        '',
        async ({ body, set }) => {
          const given = MANUAL_FIELDS.filter((k) => body[k] !== undefined)
          let profile: MemoryProfile
          if (body.instanceId !== undefined) {
            if (given.length)
              throw badRequest(
                `body: give instanceId or the manual figures, not both (got ${given.join(', ')})`,
              )
            profile = store.insert(await instanceProfile(service, { ...body, instanceId: body.instanceId }))
          } else {
            const missing = MANUAL_REQUIRED.filter((k) => body[k] === undefined)
            if (missing.length)
              throw badRequest(
                `body.${missing[0]}: is required for a manual profile (missing: ${missing.join(', ')}; or give instanceId)`,
              )
            profile = store.insert(manualProfile(body as ManualProfileInput))
          }
          set.status = 201
          return { profile }
        },
        {
          body: CreateBody,
          response: {
            201: Envelope,
            400: ControllerError,
            404: ControllerError,
            409: ControllerError,
            503: ControllerError,
          },
          detail: {
            tags,
            // Memory profiles: both roles may create one, only admin may delete.
            'x-required-role': 'admin-readonly',
            summary: 'Create a memory profile (from a running instance or manually)',
            description:
              'From an instance: {instanceId, profileName, comments?}: its memory_metrics (per GPU) and its first ' +
              'GPU’s name and total from nvidia-smi; 404 MODEL_NOT_FOUND, 409 NO_MEMORY_METRICS while starting. ' +
              'Manually: {profileName, modelPath, maxTokens, totalGpuMemoryGib, weightsMemoryGib, cudaGraphsGib, ' +
              'gpuName, gpuTotalMemoryGib} plus optional overheadMemoryGib, kvCacheAvailableGib, tensorParallelSize ' +
              '(default 1), gpuMemoryUtilization, comments. Figures are per GPU; weights + graphs ≤ total ≤ GPU total. ' +
              'The remainder total − weights − graphs is split into overhead and KV cache: when neither is given it ' +
              'is all KV cache; when both are given they must add up (±0.05 GiB).',
          },
        },
      )
      .get(
        '/lookup',
        ({ query }) => {
          const profile = store.find({
            model_path: query.model_path,
            max_tokens: query.max_tokens,
            gpu_name: query.gpu_name,
            tensor_parallel_size: query.tensor_parallel_size,
          })
          if (!profile)
            throw notFound(
              `No memory profile for ${query.model_path} with max_tokens ${query.max_tokens} on ${query.gpu_name}`,
              'PROFILE_NOT_FOUND',
            )
          return { profile }
        },
        {
          query: t.Object({
            model_path: t.String({ minLength: 1 }),
            max_tokens: t.Numeric({ minimum: 1, multipleOf: 1 }),
            gpu_name: t.String({ minLength: 1 }),
            tensor_parallel_size: t.Optional(
              t.Numeric({ minimum: 1, multipleOf: 1, description: 'default: any' }),
            ),
          }),
          response: { 200: Envelope, 400: ControllerError, 404: ControllerError },
          detail: {
            tags,
            summary: 'Find the profile of a model, context length and GPU kind (exact match, newest wins)',
            description: '404 PROFILE_NOT_FOUND when none matches.',
          },
        },
      )
      .post('/check', ({ body }) => checkPreload(store, service, body, opts), {
        body: CheckBody,
        response: { 200: CheckResultSchema, 400: ControllerError },
        // A query with a body: it changes nothing, so admin-readonly may run it.
        detail: {
          tags,
          summary: 'Pre-load check: will this model fit?',
          description: CHECK_DOCS,
          'x-read-only': true,
        },
      })
      .get(
        '/export',
        () => ({
          format: PROFILE_BUNDLE_FORMAT,
          version: PROFILE_BUNDLE_VERSION,
          exported_at: new Date().toISOString(),
          ...(opts.version ? { source: { modelgate_version: opts.version } } : {}),
          profiles: store.list().reverse(),
        }),
        {
          response: ProfileBundleSchema,
          detail: {
            tags,
            summary: 'Export every profile as a bundle',
            description:
              `{format: "${PROFILE_BUNDLE_FORMAT}", version: ${PROFILE_BUNDLE_VERSION}, exported_at, ` +
              'source: {modelgate_version}, profiles: [profile records as listed, oldest first]}.',
          },
        },
      )
      .post(
        '/import',
        ({ body }) => {
          if (body.version > PROFILE_BUNDLE_VERSION)
            throw badRequest(
              `bundle version ${body.version} is newer than this server reads (${PROFILE_BUNDLE_VERSION})`,
              'UNSUPPORTED_BUNDLE_VERSION',
            )
          return store.importAll(body.profiles as MemoryProfile[])
        },
        {
          body: ProfileBundleSchema,
          response: { 200: ImportResult, 400: ControllerError },
          detail: {
            tags,
            summary: 'Import a profile bundle',
            description:
              'Takes the export bundle. A profile whose id exists is skipped; so is one older than (or as old as) a ' +
              'stored profile of the same key (model_path, max_tokens, gpu_name, tensor_parallel_size). Otherwise ' +
              'it is stored with its id and the older profiles of its key are removed: the newest wins, so pods ' +
              'importing the same bundles converge. 400 UNSUPPORTED_BUNDLE_VERSION for a newer format version.',
          },
        },
      )
      .get('/:id', ({ params }) => ({ profile: store.require(params.id) }), {
        params: t.Object({ id: t.String() }),
        response: { 200: Envelope, 404: ControllerError },
        detail: { tags, summary: 'One memory profile' },
      })
      .delete(
        '/:id',
        ({ params }) => {
          store.require(params.id)
          store.delete(params.id)
          return { deleted: true as const, id: params.id }
        },
        {
          params: t.Object({ id: t.String() }),
          response: { 200: t.Object({ deleted: t.Literal(true), id: t.String() }), 404: ControllerError },
          detail: {
            tags,
            summary: 'Delete a memory profile (admin only)',
            description: '404 PROFILE_NOT_FOUND.',
          },
        },
      ),
  )
}
