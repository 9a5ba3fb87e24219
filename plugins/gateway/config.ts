import { type Static, Type as T, type TLiteral } from '@sinclair/typebox'
import { GPU_MEMORY_UTILIZATION_MIN } from '../../src/engine/driver.ts'
import {
  DEFAULT_ENGINE_KIND,
  ENGINE_KINDS,
  type EngineKind,
  engineDriver,
  isEngineKind,
} from '../../src/engine/kinds.ts'
import { KVCACHED_SHM_DIR } from '../../src/gpu/kvcached.ts'
import type { ValidateContext } from '../../src/host/plugin.ts'
import { CatalogConfigEntrySchema } from './catalog/schemas.ts'
import { ProxyConfig } from './proxy/config.ts'
import { ResidencyConfig } from './residency/config.ts'

/**
 * GatewayConfig is `plugins.gateway` in the YAML. `@self` in a command list stands for this
 * modelgate executable, so the demo can run the built-in simulators from source or from the binary.
 */
const Argv = T.Array(T.String({ minLength: 1 }), { minItems: 1 })

export const GatewayConfig = T.Object(
  {
    engine: T.Object(
      {
        kind: T.Union(
          ENGINE_KINDS.map((k) => T.Literal(k)) as [TLiteral<EngineKind>, ...TLiteral<EngineKind>[]],
          {
            default: DEFAULT_ENGINE_KIND,
            description: `the engine a load runs when its body names none (${ENGINE_KINDS.join(', ')})`,
          },
        ),
        command: T.Optional(
          T.Array(T.String({ minLength: 1 }), {
            minItems: 1,
            description:
              "argv of the engine.kind engine; the gateway appends the model and the engine's flags; " +
              "@self stands for this modelgate. Default: the engine's own (vllm serve)",
          }),
        ),
        commands: T.Record(T.String(), Argv, {
          default: {},
          description:
            'argv of other engine kinds, for a host that runs several (loads name theirs in engine_kind), ' +
            'e.g. { sglang: [python3, -m, sglang.launch_server] }; a kind not listed runs its own default',
        }),
        env: T.Record(T.String(), T.String(), { default: {}, description: 'extra environment for engines' }),
        host: T.String({ default: '127.0.0.1', description: 'address engines bind to (--host)' }),
        port_range: T.Object(
          {
            start: T.Integer({
              default: 8100,
              minimum: 1024,
              maximum: 65535,
              description: 'first engine port',
            }),
            end: T.Integer({ default: 8199, minimum: 1024, maximum: 65535, description: 'last engine port' }),
          },
          {
            additionalProperties: false,
            default: {},
            description:
              'engine ports, each claimed with an exclusive bind and held until its engine listens; ' +
              'modelgates sharing a host each need their own range',
          },
        ),
        gpu_memory_utilization: T.Number({
          default: 0.9,
          minimum: GPU_MEMORY_UTILIZATION_MIN,
          maximum: 1,
          description: "a load's share of each GPU when its body names none (vLLM --gpu-memory-utilization)",
        }),
        startup_timeout_seconds: T.Integer({
          default: 1200,
          minimum: 1,
          description: 'deadline for a starting engine to answer /health 200; past it the instance fails',
        }),
        stop_grace_seconds: T.Number({
          default: 15,
          minimum: 0,
          description: "SIGTERM → SIGKILL delay when an engine's process group is stopped",
        }),
        on_shutdown: T.Union([T.Literal('stop'), T.Literal('leave')], {
          default: 'stop',
          description:
            'stop: modelgate stops its engines when it shuts down; leave: they keep serving (no GPU memory is freed) ' +
            'and the next start on the same data_dir adopts them, so a modelgate upgrade does not reload the models. ' +
            'A forced exit leaves them too',
        }),
        health_poll_ms: T.Object(
          {
            initial: T.Integer({ default: 200, minimum: 10, description: 'first gap between probes' }),
            max: T.Integer({ default: 2000, minimum: 10, description: 'the gap grows ×1.5 up to this' }),
          },
          {
            additionalProperties: false,
            default: {},
            description:
              "a starting engine's /health is polled with this backoff; its log's start-up line triggers a probe at once",
          },
        ),
        liveness: T.Object(
          {
            interval_ms: T.Integer({
              default: 10000,
              minimum: 0,
              description:
                "GET /health of every active or sleeping engine this often (0: off). vLLM's API server answers 503 " +
                'once its engine core died, and may stay up like that (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)',
            }),
            failures: T.Integer({
              default: 3,
              minimum: 1,
              description: 'consecutive failed probes that fail the instance and stop its process group',
            }),
            timeout_ms: T.Integer({ default: 5000, minimum: 100, description: 'deadline of one probe' }),
          },
          {
            additionalProperties: false,
            default: {},
            description: 'after start-up: probes that fail an engine that stopped answering',
          },
        ),
        log_buffer_lines: T.Integer({
          default: 2000,
          minimum: 100,
          maximum: 100000,
          description: "an instance's last log lines kept in memory for /logs and its event stream's replay",
        }),
      },
      {
        additionalProperties: false,
        default: {},
        description: 'how engines are launched, watched and stopped',
      },
    ),
    gpu: T.Object(
      {
        smi_command: T.Union([Argv, T.Null()], {
          default: ['nvidia-smi'],
          description: 'argv of nvidia-smi (query flags are appended); null disables the probe',
        }),
        timeout_ms: T.Integer({ default: 5000, minimum: 100, description: 'deadline of one nvidia-smi run' }),
        cache_ms: T.Integer({
          default: 500,
          minimum: 0,
          description:
            'a reading is reused this long by what decides (a sleep check and a footprint measurement read a ' +
            'fresh one); views (/metrics, the GPU and memory pages) show the newest reading at once and take ' +
            'a new one in the background once it is older',
        }),
      },
      { additionalProperties: false, default: {}, description: 'the GPU probe' },
    ),
    proxy: ProxyConfig,
    sleep: T.Object(
      {
        drain_timeout_ms: T.Integer({
          default: 60_000,
          minimum: 0,
          description:
            'a sleep first stops routing to the instance and lets its in-flight requests finish for up to ' +
            'this long; past it the sleep is refused (409 SLEEP_DRAIN_TIMEOUT) and the instance keeps serving',
        }),
        verify_wait_ms: T.Integer({
          default: 10_000,
          minimum: 0,
          description:
            'an engine can answer its sleep before the GPU memory is given back (SGLang); for such an engine ' +
            'the sleep check reads nvidia-smi again until the memory its level should free is free, for up ' +
            'to this long, and judges the last reading',
        }),
        verify_fallback: T.Union([T.Literal('warn'), T.Literal('unload')], {
          default: 'warn',
          description:
            'when a sleep freed less GPU memory than its level should (sleep_verified false): ' +
            'warn keeps the instance asleep and reports it, unload stops the engine',
        }),
      },
      { additionalProperties: false, default: {}, description: 'how a sleep is taken and checked' },
    ),
    sharedcache: T.Object(
      {
        enabled: T.Boolean({ default: false, description: 'launch engines with kvcached (TP=1 only)' }),
        shm_dir: T.Literal(KVCACHED_SHM_DIR, {
          default: KVCACHED_SHM_DIR,
          description:
            "where kvcached keeps its engines' usage segments. kvcached has it fixed at /dev/shm " +
            '(kvcached/utils.py SHM_DIR, csrc mem_info_tracker.hpp), so no other value is accepted. ' +
            'MODELGATE_SHM_DIR moves it for tests and the simulator only; a real kvcached ignores it',
          errorMessage:
            'must be /dev/shm: kvcached always writes its segments there (it has no setting for another ' +
            'directory), so the pool view would never find them in any other',
        }),
      },
      {
        additionalProperties: false,
        default: {},
        description: "vLLM engines take their KV cache from kvcached's shared pool (one segment per engine)",
      },
    ),
    residency: ResidencyConfig,
    catalog: T.Array(CatalogConfigEntrySchema, {
      default: [],
      description:
        'the models this host may serve on demand, each under its `name` (gateway README, Catalogue); entries saved ' +
        'through PUT /api/catalog/{name} come beside these, which the API can read but not change',
    }),
  },
  { additionalProperties: false },
)

export type GatewayConfig = Static<typeof GatewayConfig>

/**
 * gatewayProblems is the gateway plugin's `validate` (with the catalogue's, catalog/rules.ts
 * catalogProblems, beside it in index.ts): rules across its keys. A reversed engine port range would
 * leave no port for any engine (every load refused with NO_FREE_PORT).
 */
export function gatewayProblems(cfg: GatewayConfig, _ctx: ValidateContext): string[] {
  const problems: string[] = []
  const { start, end } = cfg.engine.port_range
  if (start > end)
    problems.push(`plugins.gateway.engine.port_range: start (${start}) must not be above end (${end})`)
  for (const kind of Object.keys(cfg.engine.commands))
    if (!isEngineKind(kind))
      problems.push(
        `plugins.gateway.engine.commands.${kind}: not an engine kind (known: ${ENGINE_KINDS.join(', ')})`,
      )
  return problems
}

/**
 * engineCommand: the argv that runs an engine of `kind` (before its driver's arguments):
 * `engine.commands.<kind>`, else `engine.command` for `engine.kind`, else the driver's default.
 */
export function engineCommand(cfg: GatewayConfig['engine'], kind: EngineKind): readonly string[] {
  return (
    cfg.commands[kind] ?? (kind === cfg.kind ? cfg.command : undefined) ?? engineDriver(kind).defaultCommand
  )
}

/** expandSelf replaces `@self` in an argv with the command that re-runs modelgate. */
export function expandSelf(argv: readonly string[], self: readonly string[]): string[] {
  return argv.flatMap((a) => (a === '@self' ? [...self] : [a]))
}
