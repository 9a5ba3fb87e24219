import { t } from 'elysia'

/** The orphan-engine resources: what GET /api/orphans lists and DELETE /api/orphans/{pid} answers. */

export const OrphanReasonSchema = t.Union(
  [
    t.Literal('gpu_memory'),
    t.Literal('vllm_command'),
    t.Literal('engine_process_name'),
    t.Literal('simulator'),
  ],
  {
    description:
      'why it is listed: holds GPU memory (nvidia-smi compute apps), runs `vllm serve` or vLLM’s OpenAI entry ' +
      'point, is named `VLLM::…` (EngineCore, workers), or is `modelgate sim engine`',
  },
)

export const OrphanMarkerSchema = t.Object(
  {
    state: t.Union([t.Literal('present'), t.Literal('absent'), t.Literal('unreadable')], {
      description: 'unreadable: its environment is not readable by this service (another user’s process)',
    }),
    instance_id: t.Nullable(t.String({ description: 'MODELGATE_INSTANCE_ID of the engine' })),
    data_dir: t.Nullable(
      t.String({ description: 'MODELGATE_DATA_DIR: the data dir of the modelgate that started it' }),
    ),
    this_data_dir: t.Boolean({
      description:
        'started by a modelgate on this data dir (an instance it no longer manages, e.g. after a crash)',
    }),
  },
  { description: 'the modelgate marker in the process’s environment' },
)

export const OrphanProcessSchema = t.Object({
  pid: t.Number(),
  process_name: t.String(),
  command: t.String({
    description: 'its command line; values of flags naming a key, token, secret or password are hidden',
  }),
})

export const OrphanSchema = t.Object({
  pid: t.Number({ description: 'the process DELETE /api/orphans/{pid} stops' }),
  pgid: t.Number(),
  ppid: t.Number(),
  process_name: t.String({ description: 'the kernel’s name for it (comm)' }),
  command: t.String({
    description: 'its command line; values of flags naming a key, token, secret or password are hidden',
  }),
  start_time: t.String({
    description: 'start time in clock ticks since boot (/proc/<pid>/stat); pass it back to DELETE',
  }),
  started_at: t.Nullable(t.String({ description: 'start time, ISO 8601' })),
  reasons: t.Array(OrphanReasonSchema),
  gpu_memory_mib_by_gpu: t.Record(t.String(), t.Number(), {
    description: 'MiB per GPU index held by it and the processes listed with it (nvidia-smi compute apps)',
  }),
  total_gpu_memory_mib: t.Number(),
  marker: OrphanMarkerSchema,
  stop_scope: t.Union([t.Literal('group'), t.Literal('tree')], {
    description: 'group: it leads its process group, DELETE signals the group; tree: it and its descendants',
  }),
  processes: t.Array(OrphanProcessSchema, {
    description:
      'engine processes of its group listed with it (vLLM’s EngineCore and workers hold the GPU memory)',
  }),
})

export const OrphanListSchema = t.Object({
  orphans: t.Array(OrphanSchema),
  total: t.Number(),
  data_dir: t.String({ description: 'this modelgate’s data dir, as its engines’ marker names it' }),
  gpu_probe: t.Object({
    available: t.Boolean(),
    reason: t.Nullable(t.String({ description: 'why GPU memory is unknown (no nvidia-smi, …)' })),
  }),
})

export const OrphanParams = t.Object({
  pid: t.String({
    pattern: '^[1-9][0-9]{0,9}$',
    error: 'params.pid: must be a process id (a positive integer)',
  }),
})

export const OrphanKillQuery = t.Object({
  start_time: t.String({
    pattern: '^[0-9]{1,20}$',
    error: 'query.start_time: is required: the start_time GET /api/orphans listed for this pid',
    description:
      'the start_time of the listing: a pid that now belongs to another process is never signalled',
  }),
})

export const OrphanKillResultSchema = t.Object({
  pid: t.Number(),
  start_time: t.String(),
  stopped: t.Boolean(),
  outcome: t.Union([t.Literal('terminated'), t.Literal('killed'), t.Literal('gone')], {
    description:
      'terminated: ended within the grace after SIGTERM; killed: SIGKILL was needed; gone: it ended on its own first',
  }),
  scope: t.Union([t.Literal('group'), t.Literal('tree')]),
  signalled_pids: t.Array(t.Number(), { description: 'tree scope: the processes signalled' }),
})
