import { randomBytes } from 'node:crypto'
import { join } from 'node:path'
import { ENV_OVERRIDES } from '../../src/config/schema.ts'
import { abbreviationIn, findFlagValue, hasFlag, quoteCommand, removeFlag } from '../../src/engine/argv.ts'
import { type EngineDriver, GPU_MEMORY_UTILIZATION_MIN } from '../../src/engine/driver.ts'
import type { EngineKind } from '../../src/engine/kinds.ts'
import { shortModelName } from '../../src/gpu/colors.ts'
import { instanceSegmentName } from '../../src/gpu/kvcached.ts'
import type { Telemetry } from '../../src/host/telemetry/telemetry.ts'
import { badRequest } from '../../src/http/errors.ts'
import type { LoadRequest } from './api.ts'
import { engineCommand, expandSelf, type GatewayConfig } from './config.ts'
import type { InstanceRow } from './db/schema.ts'
import { engineMarker } from './orphans/marker.ts'

/**
 * What a load turns into before anything runs: the checked extra arguments, the engine's command
 * line and environment (from the engine kind's driver), and the instance row to persist. No I/O here.
 */

function slug(s: string): string {
  return (
    s
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, '-')
      .replace(/^-|-$/g, '')
      .slice(0, 40) || 'model'
  )
}

/**
 * checkArgs validates GPU ids against tensor parallelism and extra_args (the driver's managed flags,
 * which the load body sets, and its refused flags may not be given there, nor abbreviated as argparse
 * would accept them: nor may `--port`, which is read here); a `--port` is taken out.
 */
export function checkArgs(req: LoadRequest, driver: EngineDriver): { extra: string[]; port: number | null } {
  const tp = req.tensor_parallel_size ?? 1
  if (req.gpu_ids) {
    if (new Set(req.gpu_ids).size !== req.gpu_ids.length) throw badRequest('gpu_ids must not repeat a GPU')
    if (req.gpu_ids.length !== tp)
      throw badRequest(
        `tensor_parallel_size (${tp}) must equal the number of gpu_ids (${req.gpu_ids.length})`,
      )
  }
  const util = req.gpu_memory_utilization
  if (util !== undefined && !(util >= GPU_MEMORY_UTILIZATION_MIN && util <= 1))
    throw badRequest(
      `gpu_memory_utilization ${util} must be at least ${GPU_MEMORY_UTILIZATION_MIN} and at most 1`,
    )
  let extra = [...(req.extra_args ?? [])]
  const managed = (flag: string) =>
    `extra_args must not set ${flag}; use the load request's own field instead`
  const refused = (flag: string) => `extra_args must not set ${flag}: ${driver.refusedFlags[flag]}`
  for (const flag of driver.managedFlags) if (hasFlag(extra, flag)) throw badRequest(managed(flag))
  for (const flag of Object.keys(driver.refusedFlags))
    if (hasFlag(extra, flag)) throw badRequest(refused(flag))
  const refusedFlags = Object.keys(driver.refusedFlags)
  const abbreviated = abbreviationIn(extra, [...driver.managedFlags, ...refusedFlags, '--port'])
  if (abbreviated) {
    const { arg, flag } = abbreviated
    const why =
      flag === '--port'
        ? 'spell it --port, which modelgate reads'
        : refusedFlags.includes(flag)
          ? refused(flag)
          : managed(flag)
    throw badRequest(`extra_args ${arg} abbreviates ${flag} (argparse accepts a unique prefix): ${why}`)
  }
  let port: number | null = null
  const portArg = findFlagValue(extra, '--port')
  if (portArg !== undefined) {
    port = Number(portArg)
    if (!Number.isInteger(port) || port < 1 || port > 65535)
      throw badRequest(`extra_args --port ${portArg} is not a port`)
    extra = removeFlag(extra, '--port')
  }
  return { extra, port }
}

/**
 * inheritedEnv: modelgate's environment minus its own settings (ENV_OVERRIDES: the admin password,
 * JWT and cluster secrets, the inference key, OAuth client secret): an engine never needs them, and
 * anything that can read an engine's /proc/<pid>/environ or its crash dump would get them.
 */
function inheritedEnv(): Record<string, string | undefined> {
  const env: Record<string, string | undefined> = { ...process.env }
  for (const name of Object.keys(ENV_OVERRIDES)) delete env[name]
  return env
}

export interface LaunchChoice {
  kind: EngineKind
  driver: EngineDriver
  port: number
  gpuIds: number[]
  util: number
  tp: number
  sharedCache: boolean
  extra: string[]
}

export interface Launch {
  argv: string[]
  env: Record<string, string | undefined>
  row: InstanceRow
}

/** launchPlan builds the engine's argv and environment and the new instance's row (status starting). */
export function launchPlan(
  config: GatewayConfig,
  /** engineEnv: what the settings add to a new engine's environment (HF_TOKEN); never on its command line. */
  where: {
    selfCommand: readonly string[]
    dataDir: string
    engineEnv?: () => Record<string, string>
    /** telemetry: whether engines get `--otlp-traces-endpoint` (telemetry.engine_otlp_traces_endpoint). */
    telemetry?: Telemetry
  },
  req: LoadRequest,
  c: LaunchChoice,
): Launch {
  const modelName = shortModelName(req.model_path)
  const id = `${slug(modelName)}-${randomBytes(3).toString('hex')}`
  const servedName = req.served_model_name ?? req.model_path
  const sleepMode = req.enable_sleep_mode === true
  const spec = {
    modelPath: req.model_path,
    port: c.port,
    host: config.engine.host,
    servedModelName: servedName,
    ...(req.max_tokens ? { maxModelLen: req.max_tokens } : {}),
    gpuMemoryUtilization: c.util,
    tensorParallelSize: c.tp,
    gpuIds: c.gpuIds,
    enableSleepMode: sleepMode,
    sharedCache: c.sharedCache,
    sharedCacheName: instanceSegmentName(id),
    otlpTracesEndpoint: where.telemetry?.engineTracesEndpoint() ?? null,
    extraArgs: c.extra,
  }
  const argv = [
    ...expandSelf(engineCommand(config.engine, c.kind), where.selfCommand),
    ...c.driver.args(spec),
  ]
  const env = {
    ...inheritedEnv(),
    ...config.engine.env,
    ...where.engineEnv?.(),
    ...c.driver.env(spec),
    // The marker that recognises this engine as ours, even after a restart (orphans/).
    ...engineMarker(id, where.dataDir),
  }
  const now = new Date().toISOString()
  const row: InstanceRow = {
    id,
    model_path: req.model_path,
    model_name: modelName,
    served_model_name: servedName,
    engine_kind: c.kind,
    status: 'starting',
    port: c.port,
    pid: null,
    pgid: null,
    process_start_time: null,
    max_tokens: req.max_tokens ?? null,
    requested_max_tokens: req.max_tokens ?? null,
    gpu_memory_utilization: c.util,
    gpu_ids: c.gpuIds,
    tensor_parallel_size: c.tp,
    sharedcache_enabled: c.sharedCache,
    enable_sleep_mode: sleepMode,
    sleep_level: null,
    slept_at: null,
    extra_args: req.extra_args ?? [],
    launch_argv: argv,
    launch_command: quoteCommand(argv),
    log_dir: join(where.dataDir, 'engines', id),
    loaded_at: now,
    ready_at: null,
    error: null,
    memory_metrics: null,
    memory_baseline_by_gpu: null,
    updated_at: now,
    evictable: req.evictable === true,
  }
  return { argv, env, row }
}
