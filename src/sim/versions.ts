/**
 * VllmProfile is what differs between the vLLM releases the simulator imitates: log lines, process
 * tags, the sleep API and its side effects. `SIM_VLLM_VERSION` picks one (the newest profile not newer
 * than the version asked for, so `0.15.1` behaves as `0.14.0` and reports `0.15.1`); unset, the newest
 * profile is used, and `SIM_LOG_STYLE=v0` alone still means the V0 engine of 0.8.5.
 *
 * Sources, read for each field: vLLM's `v1/worker/utils.py` (`request_memory`), `v1/worker/gpu_worker.py`,
 * `v1/core/kv_cache_utils.py`, `v1/engine/core.py` (`sleep`, `pause_scheduler`), `entrypoints/serve/sleep/
 * api_router.py` (`mode` defaults to `abort`), `v1/metrics/loggers.py` (`vllm:engine_sleep_state`,
 * vllm#24176, vllm#27867), vllm#32714 (0.14 sleep frees little) and the start-up logs quoted in vLLM's
 * issues; read again against the v0.10.2–v0.20.2 tags in November 2026: `/sleep?mode=` from v0.17.0,
 * `vllm:engine_sleep_state` from v0.11.1, the start-up summary DEBUG from v0.11.0 to v0.20.2; vLLM main
 * again in December 2026 (`v1/metrics/loggers.py` `vllm:engine_sleep_component_state`, the
 * `rl_sleep_mode` operation metrics, `tests/entrypoints/sleep` for the component states). Release
 * boundaries are the earliest release where the sources or quoted logs show a behaviour; where the exact
 * release is unknown the profile is placed at a release that certainly has it.
 */
export interface VllmProfile {
  version: string
  /** V0 engine (one process, memory-profile lines) or V1 (EngineCore process, per-rank workers). */
  engine: 'v0' | 'v1'
  /** Process tag of the engine core: none (V0), `EngineCore_DP0` (0.10.2 →), `EngineCore` (2026 builds). */
  coreTag: '' | 'EngineCore_DP0' | 'EngineCore'
  /** `Available KV cache memory` printed by every TP worker (older) or once per node (newer). */
  kvAvailablePerWorker: boolean
  /** `GPU KV cache size: N tokens, Maximum concurrency for M tokens per request: Xx` on one line. */
  mergedKvLine: boolean
  /** The start-up refusal names the device: `Free memory on device cuda:1 (…)`. */
  freeMemoryDeviceName: boolean
  /** The informational `Free memory on device (…) on startup. Desired GPU memory utilization is …` line. */
  startupMemoryLine: 'none' | 'bytes' | 'gib'
  /**
   * That line is a DEBUG record (v0.11.0 → v0.20.2): a default-level (INFO) log does not show it; the
   * simulator prints it only with VLLM_LOGGING_LEVEL=DEBUG, as vLLM does.
   */
  startupMemoryDebug: boolean
  /** `/sleep?mode=abort|wait|keep` (default `abort`) and level 0; older builds ignore `mode`. */
  sleepModes: boolean
  /** `vllm:engine_sleep_state{sleep_state="awake"|"weights_offloaded"|"discard_all"}` on /metrics. */
  sleepStateMetric: boolean
  /**
   * Current builds' sleep-mode surface, replacing `vllm:engine_sleep_state`:
   * `vllm:engine_sleep_component_state{component=scheduler|weights|kv_cache, state=running|paused|
   * resident|offloaded|discarded}` and the `vllm:rl_sleep_mode_operation_duration_seconds{operation=
   * sleep|wake|release_kv_cache_memory}` histogram on /metrics, `POST /release_kv_cache_memory` (the
   * KV cache only; weights stay) and a `keep` sleep whose kept requests are recomputed after the wake.
   */
  sleepComponents: boolean
  /** Level 1 and 2 leave the weights on the GPU (vllm#32714, 0.14 → fixed in later releases). */
  sleepKeepsWeights: boolean
  /** Sleep figures as `%.2f` (older) or Python's `round(x, 2)` (`format_gib`, newer). */
  sleepFiguresRounded: boolean
  /**
   * The API server's socket gets SO_REUSEPORT (`entrypoints/openai/api_server.py`,
   * `create_server_socket`), so a second engine on the same port starts and shares its connections
   * (vllm#39762); vllm#47529 (July 2026) kept it for several API servers only, and a second engine
   * then fails on the taken port.
   */
  reusePort: boolean
  /** `POST /v1/responses`, the OpenAI Responses API (vLLM 0.10.0 →). */
  responsesApi: boolean
  /** `POST /v1/messages`, Anthropic's Messages API (`entrypoints/anthropic`, vLLM 0.11.1 →). */
  messagesApi: boolean
}

const V0: VllmProfile = {
  version: '0.8.5',
  engine: 'v0',
  coreTag: '',
  kvAvailablePerWorker: true,
  mergedKvLine: false,
  freeMemoryDeviceName: false,
  startupMemoryLine: 'none',
  startupMemoryDebug: false,
  sleepModes: false,
  sleepStateMetric: false,
  sleepComponents: false,
  sleepKeepsWeights: false,
  sleepFiguresRounded: false,
  reusePort: true,
  responsesApi: false,
  messagesApi: false,
}

const V0_10: VllmProfile = {
  ...V0,
  version: '0.10.2',
  engine: 'v1',
  coreTag: 'EngineCore_DP0',
  startupMemoryLine: 'bytes',
  responsesApi: true,
}

const V0_11: VllmProfile = { ...V0_10, version: '0.11.0', startupMemoryDebug: true }

const V0_11_1: VllmProfile = { ...V0_11, version: '0.11.1', sleepStateMetric: true, messagesApi: true }

const V0_14: VllmProfile = {
  ...V0_11_1,
  version: '0.14.0',
  kvAvailablePerWorker: false,
  freeMemoryDeviceName: true,
  startupMemoryLine: 'gib',
  sleepKeepsWeights: true,
  sleepFiguresRounded: true,
}

const V0_17: VllmProfile = { ...V0_14, version: '0.17.0', sleepModes: true }

const V0_18: VllmProfile = {
  ...V0_17,
  version: '0.18.0',
  coreTag: 'EngineCore',
  sleepKeepsWeights: false,
}

/**
 * The start-up summary is INFO again after v0.20.2; 0.29.0 is the release known to print it so. Its
 * socket has no SO_REUSEPORT for a single API server (vllm#47529, July 2026).
 */
const V0_29: VllmProfile = {
  ...V0_18,
  version: '0.29.0',
  mergedKvLine: true,
  startupMemoryDebug: false,
  reusePort: false,
}

/**
 * Current builds (vLLM main, read in December 2026; 0.30 is the newest release): the component
 * sleep gauge instead of `vllm:engine_sleep_state`, the sleep-operation histogram,
 * `/release_kv_cache_memory`. The release that brought them is not known; 0.30.0 is where the
 * profile is placed.
 */
const V0_30: VllmProfile = { ...V0_29, version: '0.30.0', sleepStateMetric: false, sleepComponents: true }

/** PROFILES, oldest first. */
export const PROFILES: readonly VllmProfile[] = [V0, V0_10, V0_11, V0_11_1, V0_14, V0_17, V0_18, V0_29, V0_30]

/**
 * NEWEST_PROFILE: what an unset SIM_VLLM_VERSION runs. It stays 0.29.0 while the suite's
 * expectations of the default engine (`mode=wait`, `vllm:engine_sleep_state`) are moved to
 * explicit versions; 0.30.0 is asked for by SIM_VLLM_VERSION.
 */
export const NEWEST_PROFILE = V0_29

function parts(version: string): number[] | undefined {
  const m = /^v?(\d+)\.(\d+)(?:\.(\d+))?/.exec(version.trim())
  return m ? [Number(m[1]), Number(m[2]), Number(m[3] ?? 0)] : undefined
}

function compare(a: number[], b: number[]): number {
  for (let i = 0; i < 3; i++) if ((a[i] ?? 0) !== (b[i] ?? 0)) return (a[i] ?? 0) - (b[i] ?? 0)
  return 0
}

/**
 * resolveProfile maps a requested version (SIM_VLLM_VERSION) to its profile, reporting the requested
 * version; undefined or unparsable falls back to the newest (or to V0 when only the log style says so).
 */
export function resolveProfile(requested: string | undefined, logStyle: string | undefined): VllmProfile {
  const want = requested ? parts(requested) : undefined
  if (!want) return logStyle === 'v0' ? V0 : NEWEST_PROFILE
  let chosen = V0
  for (const p of PROFILES) if (compare(parts(p.version) ?? [0, 0, 0], want) <= 0) chosen = p
  return { ...chosen, version: requested?.trim().replace(/^v/, '') ?? chosen.version }
}

/**
 * SglangProfile is what differs between the SGLang releases `sim sglang` imitates: its start-up log
 * lines. `SIM_SGLANG_VERSION` picks one as SIM_VLLM_VERSION does (the newest profile not newer than
 * the version asked for); unset, the current one. Read in sgl-project/sglang (model_runner.py,
 * mem_cache/memory_pool.py `_finalize_allocation_log`, entrypoints/engine.py) and the start-up logs
 * users quote: current builds (0.5.15–0.5.18, December 2026) print the KV pool's dtype, one
 * `Capture <target|draft> <set> CUDA graph begin/end` pair per graph set and `Engine startup timings
 * (s)`; the older builds of 2025 `KV Cache is allocated. #tokens: …` and one `Capture cuda graph
 * begin/end` pair. The release that changed the lines is not known: the older profile is placed at
 * 0.5.6, the current one at 0.5.15, releases that certainly print each.
 */
export interface SglangProfile {
  version: string
  /** `KV Cache is allocated. dtype: torch.bfloat16, #tokens: …` (the dtype part is new). */
  kvDtype: boolean
  /**
   * `Capture target prefill|decode CUDA graph begin. backend=…, avail mem=… GB` / `… end. elapsed=T s,
   * mem usage=… GB, avail mem=… GB.` per set, instead of `Capture cuda graph begin. This can take up
   * to several minutes. avail mem=… GB` / `Capture cuda graph end. Time elapsed: T s. mem usage=… GB.
   * avail mem=… GB.`
   */
  graphSets: boolean
  /** `Engine startup timings (s): load_weight=…, …, tokenizer_e2e=…` from the main process. */
  startupTimings: boolean
}

const SGLANG_0_5_6: SglangProfile = {
  version: '0.5.6',
  kvDtype: false,
  graphSets: false,
  startupTimings: false,
}
const SGLANG_0_5_15: SglangProfile = {
  version: '0.5.15',
  kvDtype: true,
  graphSets: true,
  startupTimings: true,
}

/** SGLANG_PROFILES, oldest first; an unset SIM_SGLANG_VERSION runs the newest. */
export const SGLANG_PROFILES: readonly SglangProfile[] = [SGLANG_0_5_6, SGLANG_0_5_15]

/** resolveSglangProfile maps SIM_SGLANG_VERSION to its profile, reporting the version asked for. */
export function resolveSglangProfile(requested: string | undefined): SglangProfile {
  const want = requested ? parts(requested) : undefined
  const newest = SGLANG_PROFILES.at(-1)!
  if (!want) return newest
  let chosen = SGLANG_PROFILES[0]!
  for (const p of SGLANG_PROFILES) if (compare(parts(p.version) ?? [0, 0, 0], want) <= 0) chosen = p
  return { ...chosen, version: requested?.trim().replace(/^v/, '') ?? chosen.version }
}
