import { t } from 'elysia'

/** The orphan-engine resources: what GET /api/orphans lists and DELETE /api/orphans/{pid} answers. */

export const OrphanReasonSchema = t.Union(
  [
    t.Literal('gpu_memory'),
    t.Literal('vllm_command'),
    t.Literal('sglang_command'),
    t.Literal('engine_process_name'),
    t.Literal('simulator'),
  ],
  {
    description:
      "why it is listed: holds GPU memory (nvidia-smi compute apps); runs an engine's launch command " +
      '(`vllm_command`: `vllm serve` or vLLM’s OpenAI entry point; `sglang_command`: ' +
      '`python -m sglang.launch_server`); is named as an engine names its processes ' +
      '(`VLLM::EngineCore`, `VLLM::Worker_TP0`, `sglang::scheduler`, …); or is `modelgate sim engine|sglang`',
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
  start_time: t.String({
    description: 'start time in clock ticks since boot: a DELETE signals it only if unchanged',
  }),
  engine: t.Boolean({
    description:
      'it looks like an engine or holds GPU memory; false: another process of the group (a wrapper, a shell…)',
  }),
})

export const OrphanOwnerSchema = t.Object(
  {
    install: t.Union([t.Literal('none'), t.Literal('this'), t.Literal('another'), t.Literal('unknown')], {
      description:
        'another: a process of it carries another modelgate install’s marker (DELETE refuses: 409 ORPHAN_FOREIGN); ' +
        'this: this data dir’s, an instance it no longer manages; none: no marker (started by hand or by ' +
        'something else); unknown: an environment is unreadable',
    }),
    data_dir: t.Nullable(t.String({ description: 'the data dir of the modelgate that started it' })),
  },
  { description: 'which modelgate install started it, by the markers of the processes listed with it' },
)

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
  owner: OrphanOwnerSchema,
  stop_scope: t.Union([t.Literal('group'), t.Literal('tree')], {
    description:
      'group: it leads its process group, listed with every member of the group; tree: it and its descendants',
  }),
  processes: t.Array(OrphanProcessSchema, {
    description:
      'what DELETE stops, and nothing else: it and every process of its group (group) or its descendants ' +
      '(tree), engine-looking or not (vLLM’s EngineCore and workers hold the GPU memory)',
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
  signalled_pids: t.Array(t.Number(), {
    description: 'the processes signalled: those the listing showed under it that were still the same',
  }),
})
