import { type EngineDriver, type LaunchSpec, programBase } from './driver.ts'
import { VLLM_WAKE_PHASES, VllmClient } from './vllm-client.ts'
import { buildEngineEnv, buildVllmArgs } from './vllm-command.ts'
import { VllmLogAccumulator } from './vllm-log.ts'

/**
 * vllmDriver is `vllm serve` behind the EngineDriver seam: its command line and environment
 * (vllm-command.ts), its log lines (vllm-log.ts, checked against test/fixtures/vllm/), and its
 * control client (vllm-client.ts). The facts behind each are in ENGINE-NOTES (vLLM v0.8.5 → 2026).
 *
 * Supported releases: vLLM 0.8.5 to 0.30 (plugins/gateway/README.md, "Supported vLLM releases").
 * What changes across them is learnt from the engine's answers, not from its version: `/sleep?mode=`
 * (from 0.17; refused → sent without), the sleep gauge read after a restart
 * (`vllm:engine_sleep_state` from 0.11.1, `vllm:engine_sleep_component_state` in current builds,
 * which also decides `mode=keep`), `/release_kv_cache_memory` (a GET answered 405), the
 * sleep-operation histogram. Each boundary has a simulator profile (src/sim/versions.ts) and a
 * fixture (test/fixtures/vllm/ for log lines, test/fixtures/vllm-metrics/ for /metrics).
 */
export const vllmDriver: EngineDriver = {
  kind: 'vllm',
  label: 'vLLM',
  defaultCommand: ['vllm', 'serve'],
  managedFlags: [
    '--host',
    '--tensor-parallel-size',
    '-tp',
    '--max-model-len',
    '--served-model-name',
    '--gpu-memory-utilization',
    '--enable-sleep-mode',
  ],
  refusedFlags: {
    '--sleep-idle-ttl':
      "an engine that puts itself to sleep when idle would be asleep behind modelgate's back (its routing, " +
      "memory and wake); modelgate sleeps its engines itself (POST /api/models/instances/{instance_id}/sleep, the router's auto-sleep)",
  },
  capabilities: { sleepLevels: [1, 2], partialWake: true, sharedCache: true },
  /**
   * vLLM's own figures: level 1 offloads the weights and drops the KV cache ("about 90 %"), level 2
   * drops both ("about 95 %").
   */
  sleepShare: { 1: 0.9, 2: 0.95 },
  wakePhases: (level) =>
    level === 2 ? ['weights', 'reload_weights', 'kv_cache', 'reset_prefix_cache'] : ['wake_up'],
  allWakePhases: VLLM_WAKE_PHASES,
  wakePhasesDoc:
    'after level 1: `wake_up` (every part at once) or the tag woken; after level 2, in order: `weights`, ' +
    '`reload_weights` (POST /collective_rpc), `kv_cache`, then `reset_prefix_cache` once fully awake',
  args: (s: LaunchSpec) =>
    buildVllmArgs({
      modelPath: s.modelPath,
      port: s.port,
      host: s.host,
      servedModelName: s.servedModelName,
      ...(s.maxModelLen ? { maxModelLen: s.maxModelLen } : {}),
      gpuMemoryUtilization: s.gpuMemoryUtilization,
      tensorParallelSize: s.tensorParallelSize,
      enableSleepMode: s.enableSleepMode,
      sharedCache: s.sharedCache,
      otlpTracesEndpoint: s.otlpTracesEndpoint ?? null,
      extraArgs: s.extraArgs,
    }),
  env: (s: LaunchSpec) =>
    buildEngineEnv({
      gpuIds: s.gpuIds,
      enableSleepMode: s.enableSleepMode,
      sharedCache: s.sharedCache,
      ...(s.sharedCacheName ? { sharedCacheName: s.sharedCacheName } : {}),
    }),
  logs: (hints) => new VllmLogAccumulator(hints),
  client: (baseUrl, timeoutMs, opts) => new VllmClient(baseUrl, timeoutMs, opts),
  /**
   * `vllm serve`, vLLM's OpenAI entry point (`python -m vllm.entrypoints.openai.api_server`), and
   * the names vLLM gives its children (`VLLM::EngineCore`, `VLLM::Worker_TP0`, …).
   */
  looksLike: ({ comm, argv }) => {
    const out: ('command' | 'process_name')[] = []
    if (comm.startsWith('VLLM::') || (argv[0] ?? '').startsWith('VLLM::')) out.push('process_name')
    for (let i = 0; i <= 1 && i < argv.length; i++)
      if (
        (programBase(argv, i) === 'vllm' && argv[i + 1] === 'serve') ||
        (argv[i] ?? '').startsWith('vllm.entrypoints')
      ) {
        out.push('command')
        return out
      }
    if (argv[1] === '-m' && (argv[2] ?? '').startsWith('vllm.entrypoints')) out.push('command')
    return out
  },
}
