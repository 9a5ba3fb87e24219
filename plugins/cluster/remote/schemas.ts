import { type Static, t } from 'elysia'
import { GPU_MEMORY_UTILIZATION_MIN } from '../../../src/engine/driver.ts'
import {
  EngineKindSchema,
  GpuAvailableSchema,
  InstanceDetailSchema,
  InstanceEventsQuerySchema,
  LoadResponseSchema,
  LogRecordSchema,
  MultiGpuSchema,
  SleepResultSchema,
  UnloadResultSchema,
  WakeResultSchema,
} from '../../gateway/api.ts'

/**
 * The bodies of the cluster's remote lifecycle. The rule: a cluster answer
 * is the single-pod record the owning pod's gateway gives (snake_case, as GET /api/v1/... answers
 * it) plus `podId`, the pod that acted; the internal routes answer the single-pod record alone. The
 * request bodies are camelCase, as every cluster request body.
 */

const podId = { podId: t.String({ description: 'the pod that acted (or answered)' }) }

/** withPod: a single-pod record with the pod that gave it. */
const withPod = <T extends Parameters<typeof t.Composite>[0][number]>(record: T, description: string) =>
  t.Composite([record, t.Object(podId)], { description })

/** ClusterLoadBody: the cluster load body (modelPath required), with the single-pod load's options. */
export const ClusterLoadBody = t.Object(
  {
    modelPath: t.String({ minLength: 1, description: 'model hub path or local path' }),
    targetPodId: t.Optional(t.String({ minLength: 1, description: 'default: the pod asked' })),
    servedModelName: t.Optional(t.String({ minLength: 1, description: 'default: modelPath' })),
    maxTokens: t.Optional(t.Integer({ minimum: 1, description: "context length; default the model's" })),
    gpuIds: t.Optional(
      t.Array(t.Integer({ minimum: 0 }), {
        minItems: 1,
        description: "GPUs of the target pod; default the target's most free",
      }),
    ),
    tensorParallelSize: t.Optional(t.Integer({ minimum: 1, maximum: 64 })),
    enableSleepMode: t.Optional(t.Boolean()),
    extraArgs: t.Optional(t.Array(t.String(), { description: 'appended to the engine command line' })),
    gpuMemoryUtilization: t.Optional(t.Number({ minimum: GPU_MEMORY_UTILIZATION_MIN, maximum: 1 })),
    force: t.Optional(t.Boolean({ description: "skip the target's memory-profile pre-load check" })),
    engineKind: t.Optional(EngineKindSchema),
  },
  { additionalProperties: false },
)

export const ClusterLoadResultSchema = withPod(
  LoadResponseSchema,
  'the load response record of the target pod (status starting), with the pod it loads on',
)

export const ClusterUnloadResultSchema = withPod(UnloadResultSchema, 'the unload started on the owning pod')

const SleepLevel = t.Union([t.Literal(1), t.Literal(2)], {
  description: '1 offloads weights and drops the KV cache, 2 drops both',
})

/** ClusterSleepBody: {level}, and the single-pod route's drain deadline. */
export const ClusterSleepBody = t.Object(
  {
    level: t.Optional(SleepLevel),
    drainTimeoutMs: t.Optional(
      t.Integer({
        minimum: 0,
        maximum: 86_400_000,
        description: "in-flight requests' deadline; default the owning pod's sleep.drain_timeout_ms",
      }),
    ),
  },
  { additionalProperties: false },
)

export const ClusterSleepResultSchema = withPod(SleepResultSchema, 'the sleep result of the owning pod')
export const ClusterWakeResultSchema = withPod(WakeResultSchema, 'the wake result of the owning pod')

export const ClusterLogRecordSchema = withPod(LogRecordSchema, "the owning pod's log record")

/** EventsQuery: the single-pod stream's filters, and the owning pod as a hint. */
export const EventsQuery = t.Composite([
  InstanceEventsQuerySchema,
  t.Object({
    podId: t.Optional(t.String({ description: 'the pod believed to hold the instance (tried first)' })),
  }),
])

/** GpuInfoSchema: nvidia-smi's view of a pod, as the driver reports it (the full GPU driver info). */
export const GpuInfoSchema = t.Object({
  gpus: t.Array(
    t.Object({
      index: t.Number(),
      uuid: t.String(),
      name: t.String(),
      memory_total_mb: t.Nullable(t.Number()),
      memory_used_mb: t.Nullable(t.Number()),
      memory_free_mb: t.Nullable(t.Number()),
      utilization_percent: t.Nullable(t.Number()),
      temperature_c: t.Nullable(t.Number()),
      processes: t.Array(
        t.Object({
          pid: t.Nullable(t.Number()),
          process_name: t.String(),
          used_memory_mb: t.Nullable(t.Number()),
        }),
        { description: 'compute processes on this GPU (engines and anything else)' },
      ),
    }),
  ),
  taken_at: t.String({ description: 'when nvidia-smi was asked' }),
})

/** ModelsFullSchema: GET /internal/models, every instance record of a pod with its detail fields. */
export const ModelsFullSchema = t.Object({ models: t.Array(InstanceDetailSchema), total: t.Number() })

export const PodGpuAvailableSchema = withPod(GpuAvailableSchema, "the pod's GET /api/gpu/available")
export const PodMemorySchema = withPod(MultiGpuSchema, "the pod's GET /api/memory/usage/multi-gpu")
export const PodGpuInfoSchema = withPod(GpuInfoSchema, "the pod's nvidia-smi view")
export const PodModelsFullSchema = withPod(ModelsFullSchema, "the pod's full instance records")

export type ClusterLoad = Static<typeof ClusterLoadBody>
export type ClusterSleep = Static<typeof ClusterSleepBody>
export type GpuInfo = Static<typeof GpuInfoSchema>
export type ModelsFull = Static<typeof ModelsFullSchema>
