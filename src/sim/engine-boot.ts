import { type BindOutcome, bindTcp } from '../engine/tcp-bind.ts'
import { publishedSeconds } from '../engine/vllm-timing.ts'
import { type EngineChild, spawnEngineChildren } from './children.ts'
import { visibleDevices } from './devices.ts'
import {
  DEV_ROUTE_LINES,
  engineConfigLine,
  freeMemoryError,
  kvCapacityLines,
  maxModelLenError,
  ROUTE_LINES,
  startupMemoryLine,
  v0ProfileMessage,
} from './engine-logs.ts'
import type { SimGpu } from './gpus.ts'
import type { SimKnobs } from './knobs.ts'
import {
  defaultIpcName,
  KVCACHED_PREALLOC_MIB,
  KvcachedSegment,
  processLocalCapacityLine,
  startupGuardWarning,
} from './kvcached.ts'
import {
  DEFAULT_GPU_MEMORY_UTILIZATION,
  kvCacheError,
  type MemoryPlan,
  nonKvMib,
  planMemory,
  pyRound,
} from './memory-plan.ts'
import { type ModelSpec, weightsGiB } from './models.ts'
import { configTraceback, engineInitFailed, startupTraceback } from './python-errors.ts'
import { readLiveEngines, usedMibOnGpu } from './state.ts'
import type { VllmArgs } from './vllm-args.ts'
import { pythonRepr } from './vllm-args.ts'
import type { VllmLog } from './vllm-log.ts'

/**
 * bootEngine walks vLLM's start-up in order (config, EngineCore, memory check, weights, KV cache
 * profile, CUDA graphs, API server) with vLLM's log lines and failures, spreading SIM_LOAD_DELAY_MS over
 * the stages. The port stays closed until the very end. What differs between releases (process tags,
 * the refusal naming its device, KV lines merged or not, once per node or per worker, the memory
 * summary) follows the knobs' vLLM profile (versions.ts).
 */
export class Stopped extends Error {}

/** StartFailure ends the start-up with an exit code after its messages were printed. */
export class StartFailure extends Error {
  constructor(readonly code: number) {
    super(`start-up failed with exit code ${code}`)
  }
}

const STRERROR: Record<string, string> = {
  EADDRINUSE: 'Address already in use',
  EADDRNOTAVAIL: 'Cannot assign requested address',
  EACCES: 'Permission denied',
}

/**
 * bindServerSocket is vLLM's `create_server_socket`, called before the engine is built (vllm#8204):
 * the port is bound with SO_REUSEADDR, plus SO_REUSEPORT where the imitated release sets it, and is
 * only listened on when the server starts. Meanwhile connections to it are refused and another
 * process's exclusive bind there fails. Null where libc cannot bind (the final listen finds a taken
 * port then); port 0 (any port) is left to the listen.
 */
function bindServerSocket(host: string, port: number, reusePort: boolean): BindOutcome | null {
  return port === 0 ? null : bindTcp(host, port, { reuseAddr: true, reusePort })
}

/** BootTarget: what start-up reads and sets on the engine (SimEngine, engine.ts, implements it). */
export interface BootTarget {
  readonly args: VllmArgs
  readonly knobs: SimKnobs
  readonly log: VllmLog
  readonly model: ModelSpec
  readonly gpus: SimGpu[]
  readonly simDir: string
  readonly tags: { api: string; core: string }
  readonly version: string
  children: EngineChild[]
  /** Log tag of each TP rank's worker (the engine core's tag when TP is 1). */
  workerTags: string[]
  kvSegment: KvcachedSegment | undefined
  maxModelLen: number
  phase: 'init' | 'weights' | 'ready'
  plan: MemoryPlan
  usedGpus: number[]
  delay(ms: number): Promise<void>
  keepAlive(): void
  watchChildren(): void
  startServing(): void
  stop(code: number): Promise<void>
  writeRecord(): void
}

export async function bootEngine(e: BootTarget): Promise<void> {
  const { args, knobs, log, model } = e
  const profile = knobs.profile
  const v0 = knobs.logStyle === 'v0'
  if (knobs.timeScale) scaleTimes(knobs, weightsGiB(model))
  const D = knobs.loadDelayMs
  const t0 = performance.now()
  const api = e.tags.api
  const fail = (code: number, stderr: string[] = []): never => {
    if (stderr.length > 0) log.stderr(...stderr)
    throw new StartFailure(code)
  }

  log.info(api, 'api_server.py:1839', `vLLM API server version ${e.version}`)
  log.info(api, 'utils.py:233', `non-default args: ${pythonRepr(args.nonDefault)}`)
  if (args.maxModelLen !== undefined && args.maxModelLen > model.maxModelLen && !knobs.allowLongMaxModelLen) {
    fail(1, configTraceback(maxModelLenError(args.maxModelLen, model)))
  }
  e.maxModelLen =
    args.maxModelLen !== undefined && args.maxModelLen > 0 ? args.maxModelLen : model.maxModelLen
  const util = args.gpuMemoryUtilization ?? DEFAULT_GPU_MEMORY_UTILIZATION
  if (!(util > 0 && util <= 1)) {
    fail(1, configTraceback(`ValueError: GPU memory utilization must be within (0, 1]. Got ${util}.`))
  }
  log.info(api, 'model.py:547', `Resolved architecture: ${model.architecture}`)
  log.info(api, 'model.py:1510', `Using max model len ${e.maxModelLen}`)
  if (!v0) log.info(api, 'scheduler.py:205', 'Chunked prefill is enabled with max_num_batched_tokens=8192.')
  const bound = bindServerSocket(args.host, args.port, profile.reusePort)
  if (bound && !bound.ok) fail(1, [`OSError: [Errno ${bound.errno}] ${STRERROR[bound.code] ?? bound.code}`])
  const serverSocket = bound?.ok ? bound.socket : undefined

  e.children = spawnEngineChildren(args.tensorParallelSize)
  e.watchChildren()
  const corePid = e.children[0]?.pid ?? process.pid
  if (profile.coreTag) e.tags.core = `(${profile.coreTag} pid=${corePid})`
  const core = e.tags.core
  const tp = args.tensorParallelSize
  const workerPids =
    tp > 1 ? Array.from({ length: tp }, (_, i) => e.children[i + 1]?.pid ?? process.pid) : [corePid]
  e.workerTags = workerPids.map((pid, i) => (v0 ? '' : tp > 1 ? `(Worker_TP${i} pid=${pid})` : core))
  const workerTag = (i: number) => e.workerTags[i] ?? core
  const perWorker = (where: string, message: (rank: number) => string): void => {
    for (let i = 0; i < workerPids.length; i++) log.info(workerTag(i), where, message(i))
  }
  const coreFailure = (error: string): never => {
    log.error(core, 'core.py:708', 'EngineCore failed to start.')
    log.error(core, 'core.py:708', error)
    return fail(1, [...startupTraceback(error), ...engineInitFailed()])
  }

  if (!v0) log.info(core, 'core.py:644', 'Waiting for init message from front-end.')
  log.info(
    core,
    v0 ? 'llm_engine.py:240' : 'core.py:77',
    engineConfigLine(knobs.logStyle, e.version, args, e.maxModelLen),
  )
  await e.delay(D * 0.1)
  if (knobs.failStart) coreFailure(`RuntimeError: ${knobs.failStart}`)

  const visible = visibleDevices(knobs.cudaVisibleDevices, e.gpus.length)
  if (!visible.ok) return coreFailure(visible.error)
  if (args.tensorParallelSize > visible.gpus.length) {
    coreFailure(
      `ValueError: World size (${args.tensorParallelSize}) is larger than the number of available GPUs ` +
        `(${visible.gpus.length}) in this node. Make sure to set \`CUDA_VISIBLE_DEVICES\` appropriately.`,
    )
  }
  e.usedGpus = visible.gpus.slice(0, args.tensorParallelSize)
  const devices = e.usedGpus.map((i) => e.gpus[i]).filter((g) => g !== undefined)
  const deviceMib = Math.min(...devices.map((g) => g.totalMib))
  e.plan = planMemory(model, deviceMib, util, args.tensorParallelSize, e.maxModelLen, {
    kvcached: knobs.kvcached && !v0,
  })
  const plan = e.plan
  perWorker(
    'parallel_state.py:1208',
    (i) =>
      `rank ${i} in world size ${args.tensorParallelSize} is assigned as DP rank 0, PP rank 0, TP rank ${i}, EP rank ${i}`,
  )

  // vLLM refuses to start below utilization × device free; kvcached patches that guard away (it warns
  // and goes on), so a shared-cache engine only fails when its weights and prealloc cannot fit.
  const records = readLiveEngines(e.simDir)
  const freeAtStartMib: number[] = []
  for (const [rank, gpu] of devices.entries()) {
    const freeMib = gpu.totalMib - usedMibOnGpu(records, gpu.index, process.pid)
    freeAtStartMib.push(freeMib)
    if (freeMib >= plan.budgetMib) continue
    if (!knobs.kvcached) {
      const device = profile.freeMemoryDeviceName ? `cuda:${rank}` : undefined
      coreFailure(freeMemoryError(freeMib / 1024, gpu.totalMib / 1024, util, plan.budgetMib / 1024, device))
    }
    const guard = startupGuardWarning(freeMib * 2 ** 20, plan.budgetMib * 2 ** 20)
    log.stderr(workerTag(rank) ? `${workerTag(rank)} ${guard}` : guard)
    const neededMib = nonKvMib(plan) + KVCACHED_PREALLOC_MIB
    if (freeMib < neededMib)
      coreFailure(
        `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ${pyRound((neededMib - freeMib) / 1024)} GiB. ` +
          `GPU ${rank} has a total capacity of ${pyRound(gpu.totalMib / 1024)} GiB of which ${pyRound(freeMib / 1024)} GiB is free.`,
      )
  }

  const loadStart = performance.now()
  perWorker('gpu_model_runner.py:2602', () => `Starting to load model ${args.model}...`)
  if (!v0) log.info(workerTag(0), 'cuda.py:366', 'Using Flash Attention backend on V1 engine.')
  log.info(workerTag(0), 'weight_utils.py:392', "Using model weights format ['*.safetensors']")
  await e.delay(D * 0.4)
  const loadSecs = (performance.now() - loadStart) / 1000
  log.info(workerTag(0), 'default_loader.py:267', `Loading weights took ${loadSecs.toFixed(2)} seconds`)
  e.phase = 'weights'
  e.writeRecord()
  const loaded = (performance.now() - loadStart) / 1000
  const took = `${plan.weightsGiB.toFixed(4)} GiB${v0 ? '' : ' memory'} and ${loaded.toFixed(6)} seconds`
  perWorker('gpu_model_runner.py:2653', () => `Model loading took ${took}`)
  if (knobs.hang) return e.keepAlive()

  const profileStart = performance.now()
  await e.delay(D * 0.25)
  const kvError = kvCacheError(plan)
  if (kvError) coreFailure(kvError)
  if (v0) {
    log.info('', 'worker.py:267', v0ProfileMessage(plan, (performance.now() - profileStart) / 1000))
    log.info('', 'executor_base.py:112', `# cuda blocks: ${plan.numBlocks}, # CPU blocks: 4681`)
    log.info(
      '',
      'executor_base.py:117',
      `Maximum concurrency for ${e.maxModelLen} tokens per request: ${plan.concurrency.toFixed(2)}x`,
    )
  } else {
    if (knobs.kvcached) {
      // kvcached replaces each worker's memory probe: its own line on stderr, none of vLLM's.
      const line = processLocalCapacityLine({
        budgetBytes: plan.budgetMib * 2 ** 20,
        weightsBytes: plan.weightsGiB * 2 ** 30,
        torchPeakBytes: plan.activationGiB * 2 ** 30,
        cudagraphBytes: plan.graphsGiB * 2 ** 30,
      })
      for (let i = 0; i < workerPids.length; i++) {
        const tag = workerTag(i)
        log.stderr(tag ? `${tag} ${line}` : line)
      }
    } else {
      const available = `Available KV cache memory: ${plan.kvAvailGiB.toFixed(2)} GiB`
      if (profile.kvAvailablePerWorker) perWorker('gpu_worker.py:298', () => available)
      else log.info(workerTag(0), 'gpu_worker.py:625', available)
    }
    const lines = kvCapacityLines(profile.mergedKvLine, plan.kvTokens, e.maxModelLen, plan.concurrency)
    const where = profile.mergedKvLine
      ? ['kv_cache_utils.py:1869']
      : ['kv_cache_utils.py:1087', 'kv_cache_utils.py:1091']
    for (const [i, line] of lines.entries()) log.info(core, where[i] ?? 'kv_cache_utils.py:1087', line)
  }
  if (knobs.kvcached) {
    const name = defaultIpcName(knobs.kvcachedIpcName, knobs.shmDir)
    e.kvSegment = KvcachedSegment.open(
      knobs.shmDir,
      name,
      plan.budgetMib * 2 ** 20,
      KVCACHED_PREALLOC_MIB * 2 ** 20,
    )
  }
  e.phase = 'ready'
  e.writeRecord()

  const graphStart = performance.now()
  await e.delay(D * 0.25)
  const graphSecs = Math.max(0, Math.round((performance.now() - graphStart) / 1000))
  log.info(
    workerTag(0),
    v0 ? 'model_runner.py:1592' : 'gpu_model_runner.py:3480',
    `Graph capturing finished in ${graphSecs} secs, took ${plan.graphsGiB.toFixed(2)} GiB`,
  )
  const summary = profile.startupMemoryLine
  // A DEBUG record (v0.11.0 → v0.20.2) reaches the log only when vLLM logs at DEBUG.
  const summaryLevel = profile.startupMemoryDebug ? 'DEBUG' : 'INFO'
  if (summary !== 'none' && (summaryLevel === 'INFO' || knobs.logLevel === 'DEBUG')) {
    const where = summary === 'bytes' ? 'gpu_worker.py:391' : 'gpu_worker.py:804'
    for (let rank = 0; rank < workerPids.length; rank++)
      log.write(
        summaryLevel,
        workerTag(rank),
        where,
        startupMemoryLine(summary, {
          freeGiB: (freeAtStartMib[rank] ?? deviceMib) / 1024,
          totalGiB: (devices[rank]?.totalMib ?? deviceMib) / 1024,
          utilization: util,
          weightsGiB: plan.weightsGiB,
          nonTorchGiB: plan.nonTorchGiB,
          activationGiB: plan.activationGiB,
          graphsGiB: plan.graphsGiB,
          kvGiB: plan.kvAvailGiB,
        }),
      )
  }
  log.info(
    core,
    v0 ? 'llm_engine.py:437' : 'core.py:210',
    `init engine (profile, create kv cache, warmup model) took ${((performance.now() - t0) / 1000).toFixed(2)} seconds`,
  )
  if (!v0)
    log.info(
      api,
      'loggers.py:147',
      `Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: ${plan.numBlocks}`,
    )
  log.info(
    api,
    'api_server.py:1634',
    `Supported_tasks: ['${model.task === 'pooling' ? 'score' : 'generate'}']`,
  )
  log.info(api, 'api_server.py:1912', `Starting vLLM API server 0 on http://${args.host}:${args.port}`)
  log.info(api, 'launcher.py:34', 'Available routes are:')
  const dev = knobs.devMode ? DEV_ROUTE_LINES : []
  for (const [path, method] of [...ROUTE_LINES, ...dev])
    log.info(api, 'launcher.py:42', `Route: ${path}, Methods: ${method}`)
  // uvicorn listens on vLLM's socket (it never binds one itself): the listen fails when another
  // process listens there already, unless both set SO_REUSEPORT. The server listens on its own
  // socket with the same options, taken while the early one is still bound, then that one closes.
  try {
    e.startServing()
  } catch {
    fail(1, ['OSError: [Errno 98] Address already in use'])
  } finally {
    serverSocket?.close()
  }
  log.stderr(
    `INFO:     Started server process [${process.pid}]`,
    'INFO:     Waiting for application startup.',
    'INFO:     Application startup complete.',
  )
}

/**
 * scaleTimes: with SIM_TIME_SCALE, the load and the wakes take vLLM's published time for this many
 * GiB of weights, scaled (level-1 wake: wakeDelayMs / 3, level 2: wakeDelayMs, as the engine reads them).
 */
function scaleTimes(knobs: SimKnobs, weightsGib: number): void {
  const scale = knobs.timeScale!
  knobs.loadDelayMs = publishedSeconds('load', weightsGib) * 1000 * scale
  knobs.wakeDelayMs = publishedSeconds('wake2', weightsGib) * 1000 * scale
  knobs.reloadDelayMs = knobs.wakeDelayMs
}
