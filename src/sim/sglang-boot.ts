import { spawnChildren } from './children.ts'
import { visibleDevices } from './devices.ts'
import { Scheduler } from './scheduler.ts'
import { startServing } from './sglang-api.ts'
import { serverArgsLine } from './sglang-args.ts'
import type { SglangEngine } from './sglang-engine.ts'
import { defaultFraction, kvSizes, NOT_ENOUGH_MEMORY, planSglangMemory } from './sglang-memory.ts'
import { readLiveEngines, usedMibOnGpu } from './state.ts'

function portIsFree(hostname: string, port: number): boolean {
  try {
    Bun.listen({ hostname, port, socket: { data() {} } }).stop(true)
    return true
  } catch {
    return false
  }
}

const gb = (x: number) => x.toFixed(2)

/** torchDtype: how the KV line names the pool's element type (`dtype: torch.bfloat16`). */
const torchDtype = (bytes: number) =>
  bytes >= 4 ? 'torch.float32' : bytes === 1 ? 'torch.float8_e4m3fn' : 'torch.bfloat16'

/**
 * bootSglang walks SGLang's start-up with its log lines (see src/engine/sglang-log.ts for their
 * sources), spreading SIM_LOAD_DELAY_MS over the stages: the scheduler processes (one per TP rank,
 * and the detokenizer) load the weights, size the KV pool from the memory free at start, capture
 * CUDA graphs; then the server process starts uvicorn, so the port opens while /health still
 * answers 503; then the warmup request (`GET /get_model_info`, `POST /generate`), and only then
 * `The server is fired up and ready to roll!` and /health 200. Failures end the process as SGLang
 * does: a scheduler exception with the server's SIGQUIT (exit by SIGKILL), or a traceback and exit 1.
 */
export async function bootSglang(e: SglangEngine): Promise<void> {
  const { sglang: a, knobs, log, model, profile } = e
  const bootStart = performance.now()
  const since = (t0: number) => ((performance.now() - t0) / 1000).toFixed(2)
  const D = knobs.loadDelayMs
  const tp = a.tpSize
  const fraction = a.memFractionStatic ?? defaultFraction(tp)
  log.info('', 'server_args.py', serverArgsLine(a, fraction))
  if (
    a.contextLength !== undefined &&
    a.contextLength > model.maxModelLen &&
    !e.env['SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN']
  ) {
    log.stderr(
      'Traceback (most recent call last):',
      '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/configs/model_config.py", line 214, in __init__',
      `ValueError: User-specified context_length (${a.contextLength}) is greater than the derived context_length (${model.maxModelLen}). This may lead to incorrect model outputs or CUDA errors.`,
    )
    return void e.stop(1)
  }
  if (!portIsFree(a.host, a.port)) {
    log.stderr(
      `[Errno 98] error while attempting to bind on address ('${a.host}', ${a.port}): address already in use`,
    )
    return void e.stop(1)
  }
  const visible = visibleDevices(knobs.cudaVisibleDevices, e.gpus.length)
  if (!visible.ok || visible.gpus.length < tp) {
    e.crash(visible.ok ? 'RuntimeError: CUDA error: invalid device ordinal' : visible.error)
    return
  }
  e.usedGpus = visible.gpus.slice(0, tp)
  const roles = Array.from({ length: tp }, (_, i) => ({
    role: `scheduler_TP${i}`,
    processName: tp > 1 ? `sglang::scheduler_TP${i}` : 'sglang::scheduler',
  }))
  e.children = spawnChildren([...roles, { role: 'detokenizer', processName: 'sglang::detokenizer' }])
  e.watchChildren()
  const rankTag = (i: number) => (tp > 1 ? ` TP${i}` : ' TP0')
  const perRank = (message: (rank: number) => string) => {
    for (let i = 0; i < tp; i++) log.info(rankTag(i), 'model_runner.py', message(i))
  }

  await e.delay(D * 0.1)
  if (knobs.failStart) return e.crash(`RuntimeError: ${knobs.failStart}`)
  const records = readLiveEngines(e.simDir)
  const devices = e.usedGpus.map((i) => e.gpus[i]).filter((g) => g !== undefined)
  const deviceMib = Math.min(...devices.map((g) => g.totalMib))
  const freeMib = Math.min(...devices.map((g) => g.totalMib - usedMibOnGpu(records, g.index, process.pid)))
  e.plan = planSglangMemory(model, deviceMib, freeMib, fraction, tp, e.maxModelLen, !a.disableCudaGraph)
  const plan = e.plan
  perRank(() => 'Init torch distributed begin.')
  e.loaded = 'context'
  e.writeRecord()
  perRank(() => `Init torch distributed ends. mem usage=${gb(plan.contextGiB)} GB`)
  let avail = plan.freeAtStartGiB
  if (plan.weightsGiB > avail) {
    return e.crash(
      `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ${gb(plan.weightsGiB)} GiB. GPU 0 has a total ` +
        `capacity of ${gb(deviceMib / 1024)} GiB of which ${gb(avail)} GiB is free.`,
    )
  }
  perRank(() => `Load weight begin. avail mem=${gb(avail)} GB`)
  const loadStart = performance.now()
  log.stderr('Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]')
  await e.delay(D * 0.4)
  log.stderr('Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  5.72it/s]')
  avail -= plan.weightsGiB
  e.loaded = 'weights'
  e.writeRecord()
  const elapsed = since(loadStart)
  perRank(
    () =>
      `Load weight end. elapsed=${elapsed} s, type=${model.architecture}, avail mem=${gb(avail)} GB, ` +
      `mem usage=${gb(plan.weightsGiB)} GB.`,
  )
  if (knobs.hang) return e.delay(86_400_000)
  await e.delay(D * 0.15)
  if (plan.kvTokens <= 0)
    return e.crash(`RuntimeError: ${NOT_ENOUGH_MEMORY}`, 'scheduler.py", line 312, in __init__')
  const { k, v } = kvSizes(plan)
  const kvStart = performance.now()
  const dtype = profile.kvDtype ? `dtype: ${torchDtype(model.dtypeBytes)}, ` : ''
  perRank(() => `KV Cache is allocated. ${dtype}#tokens: ${plan.kvTokens}, K size: ${k} GB, V size: ${v} GB`)
  avail -= plan.kvGiB
  e.loaded = 'kv'
  e.writeRecord()
  perRank(() => `Memory pool end. avail mem=${gb(avail)} GB`)
  const kvSeconds = since(kvStart)
  const graphSeconds = { prefill: '0.00', decode: '0.00' }
  if (!a.disableCudaGraph && profile.graphSets) {
    // Current builds capture a prefill set and a decode set, each with its begin and end lines; the
    // plan's CUDA-graph memory is split between them.
    const sets = [
      {
        name: 'prefill' as const,
        share: 0.4,
        shape: 'backend=breakable, num_tokens=[4, 8, 16, 32, 64, 128, 256, 512]',
      },
      { name: 'decode' as const, share: 0.6, shape: 'backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8]' },
    ]
    for (const set of sets) {
      const t0 = performance.now()
      perRank(() => `Capture target ${set.name} CUDA graph begin. ${set.shape}, avail mem=${gb(avail)} GB`)
      log.stderr(
        `Capturing batches (bs=1 avail_mem=${gb(avail)} GB): 100%|██████████| 4/4 [00:00<00:00, 13.26it/s]`,
      )
      await e.delay(D * 0.125)
      const used = Number(gb(plan.graphsGiB * set.share))
      const before = Number(gb(avail))
      avail -= used
      graphSeconds[set.name] = since(t0)
      perRank(
        () =>
          `Capture target ${set.name} CUDA graph end. elapsed=${graphSeconds[set.name]} s, ` +
          `mem usage=${gb(before - Number(gb(avail)))} GB, avail mem=${gb(avail)} GB.`,
      )
    }
  } else if (!a.disableCudaGraph) {
    const t0 = performance.now()
    perRank(() => `Capture cuda graph begin. This can take up to several minutes. avail mem=${gb(avail)} GB`)
    log.stderr('Capturing batches (bs=1 avail_mem=8.00 GB): 100%|██████████| 3/3 [00:00<00:00, 13.26it/s]')
    await e.delay(D * 0.25)
    avail -= plan.graphsGiB
    perRank(
      () =>
        `Capture cuda graph end. Time elapsed: ${since(t0)} s. mem usage=${gb(plan.graphsGiB)} GB. avail mem=${gb(avail)} GB.`,
    )
  }
  e.loaded = 'all'
  e.writeRecord()
  const maxRunning = a.maxRunningRequests ?? Math.max(1, Math.min(4096, Math.floor(plan.kvTokens / 2)))
  log.info(
    ' TP0',
    'scheduler.py',
    `max_total_num_tokens=${plan.kvTokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, ` +
      `max_running_requests=${maxRunning}, context_len=${e.maxModelLen}, available_gpu_mem=${gb(avail)} GB`,
  )
  if (profile.startupTimings) {
    const total = since(bootStart)
    log.info(
      '',
      'engine.py',
      `Engine startup timings (s): load_weight=${elapsed}, kv_cache_allocation=${kvSeconds}, ` +
        `scheduler_e2e=${total}, cuda_graph={prefill=${graphSeconds.prefill}, decode=${graphSeconds.decode}, ` +
        `target_verify=0.00, draft_prefill=0.00, draft_decode=0.00, draft_extend=0.00}, tokenizer_e2e=${total}`,
    )
  }
  e.scheduler = new Scheduler(maxRunning, plan.kvTokens, (seq) => e.canRun(seq))
  startServing(e)
  e.startTimers()
  log.uvicorn(`Started server process [${process.pid}]`)
  log.uvicorn('Waiting for application startup.')
  log.uvicorn('Application startup complete.')
  log.uvicorn(`Uvicorn running on http://${a.host}:${a.port} (Press CTRL+C to quit)`)
  if (a.skipServerWarmup) {
    e.ready = true
  } else {
    await e.delay(D * 0.1)
    await warmup(e)
  }
  log.info('', 'http_server.py', 'The server is fired up and ready to roll!')
}

/** warmup: SGLang's own first requests, through its HTTP port (so they show in the access log). */
async function warmup(e: SglangEngine): Promise<void> {
  const base = `http://${e.sglang.host === '0.0.0.0' ? '127.0.0.1' : e.sglang.host}:${e.sglang.port}`
  await fetch(`${base}/get_model_info`, { signal: e.lifetime.signal })
  const res = await fetch(`${base}/generate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      text: 'The capital city of France is',
      sampling_params: { temperature: 0, max_new_tokens: 8 },
    }),
    signal: e.lifetime.signal,
  })
  await res.body?.cancel()
  e.ready = true
}
