import { KVCACHED_SHM_DIR } from '../gpu/kvcached.ts'
import { resolveProfile, type VllmProfile } from './versions.ts'

/**
 * SimKnobs gathers the environment variables that steer the engine simulator in tests and demos
 * (timings, failure injection, vLLM version and log style). Read once at start so behaviour is fixed
 * per process.
 *
 * The vLLM release (SIM_VLLM_VERSION, default 0.29.0) decides the log lines and
 * the sleep API: `0.8.5` (V0 engine; also SIM_LOG_STYLE=v0), `0.10.2` (V1, KV lines per worker, the
 * start-up summary at INFO), `0.11.0` (the summary is DEBUG), `0.11.1` (`vllm:engine_sleep_state`),
 * `0.14.0` (refusal names the device, sleep keeps the weights), `0.17.0` (`/sleep?mode=abort|wait|keep`,
 * abort by default; level 0), `0.18.0` (`EngineCore` tag, sleep frees the weights again), `0.29.0`
 * (merged KV line, the summary at INFO again), `0.30.0` (`vllm:engine_sleep_component_state` in place of
 * `vllm:engine_sleep_state`, the `rl_sleep_mode` operation histogram, `/release_kv_cache_memory`).
 * Sleep side effects: SIM_SLEEP_KEEPS_WEIGHTS=1|0 overrides the profile (vllm#32714),
 * SIM_SLEEP_INFERENCE=crash makes inference on released memory kill the engine (old builds),
 * SIM_WAKE_DELAY_MS (level-1 wake is a third of it) and SIM_RELOAD_DELAY_MS time the wake and
 * `collective_rpc reload_weights`. VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps the API server up after
 * its engine core died, as in vLLM. `sim sglang` takes its release from SIM_SGLANG_VERSION (versions.ts
 * SglangProfile: current builds' start-up lines by default, 2025's with `0.5.6`).
 */
export interface SimKnobs {
  /** The vLLM release imitated (SIM_VLLM_VERSION, see versions.ts); logStyle follows its engine. */
  profile: VllmProfile
  loadDelayMs: number
  tokensPerSec: number
  ttftMs: number
  crashAfterTokens: number | undefined
  /** `abrupt` (default): connections just drop; `error`: streams get an error chunk, then the exit. */
  crashMode: 'abrupt' | 'error'
  failStart: string | undefined
  hang: boolean
  hangOnTerm: boolean
  logAnsi: boolean
  logStyle: 'v1' | 'v0'
  /** VLLM_LOGGING_LEVEL (default INFO): DEBUG records, such as 0.11–0.20's start-up summary, show at DEBUG. */
  logLevel: 'DEBUG' | 'INFO'
  errorShape: 'new' | 'old'
  sleepInference: 'queue' | 'crash'
  wakeDelayMs: number
  /**
   * SIM_TIME_SCALE: when set, a load and a wake take vLLM's published time for the model's weights
   * (src/engine/vllm-timing.ts) times this factor, instead of SIM_LOAD_DELAY_MS and SIM_WAKE_DELAY_MS
   * (e.g. 0.01: a 16 GiB model loads in 0.58 s and wakes from level 1 in 8 ms).
   */
  timeScale: number | undefined
  /** How long `collective_rpc reload_weights` takes (SIM_RELOAD_DELAY_MS, default SIM_WAKE_DELAY_MS). */
  reloadDelayMs: number
  /** Sleep leaves the weights on the GPU (SIM_SLEEP_KEEPS_WEIGHTS; default per profile, vllm#32714). */
  sleepKeepsWeights: boolean
  /** VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: the API server stays up after its engine core died. */
  keepAliveOnEngineDeath: boolean
  devMode: boolean
  kvcached: boolean
  kvcachedIpcName: string | undefined
  shmDir: string
  allowLongMaxModelLen: boolean
  cudaVisibleDevices: string | undefined
}

function num(value: string | undefined, fallback: number): number {
  if (value === undefined || value.trim() === '') return fallback
  const n = Number(value)
  return Number.isFinite(n) && n >= 0 ? n : fallback
}

function truthy(value: string | undefined): boolean {
  return value !== undefined && /^(1|true|yes|on)$/i.test(value.trim())
}

export function readKnobs(env: NodeJS.ProcessEnv): SimKnobs {
  const crash = env['SIM_CRASH_AFTER_TOKENS']
  const profile = resolveProfile(env['SIM_VLLM_VERSION'], env['SIM_LOG_STYLE'])
  const keeps = env['SIM_SLEEP_KEEPS_WEIGHTS']
  const wakeDelayMs = num(env['SIM_WAKE_DELAY_MS'], 300)
  return {
    profile,
    loadDelayMs: num(env['SIM_LOAD_DELAY_MS'], 1500),
    tokensPerSec: Math.max(0.1, num(env['SIM_TOKENS_PER_SEC'], 50)),
    ttftMs: num(env['SIM_TTFT_MS'], 0),
    crashAfterTokens: crash === undefined || crash === '' ? undefined : num(crash, 0),
    crashMode: env['SIM_CRASH_MODE'] === 'error' ? 'error' : 'abrupt',
    failStart: env['SIM_FAIL_START'] || undefined,
    hang: truthy(env['SIM_HANG']),
    hangOnTerm: truthy(env['SIM_HANG_ON_TERM']),
    logAnsi: truthy(env['SIM_LOG_ANSI']),
    logStyle: profile.engine,
    logLevel: env['VLLM_LOGGING_LEVEL']?.trim().toUpperCase() === 'DEBUG' ? 'DEBUG' : 'INFO',
    errorShape: env['SIM_ERROR_SHAPE'] === 'old' ? 'old' : 'new',
    sleepInference: env['SIM_SLEEP_INFERENCE'] === 'crash' ? 'crash' : 'queue',
    wakeDelayMs,
    timeScale: env['SIM_TIME_SCALE'] ? num(env['SIM_TIME_SCALE'], 0) || undefined : undefined,
    reloadDelayMs: num(env['SIM_RELOAD_DELAY_MS'], wakeDelayMs),
    sleepKeepsWeights: keeps === undefined || keeps.trim() === '' ? profile.sleepKeepsWeights : truthy(keeps),
    keepAliveOnEngineDeath: truthy(env['VLLM_KEEP_ALIVE_ON_ENGINE_DEATH']),
    devMode: truthy(env['VLLM_SERVER_DEV_MODE']),
    kvcached: truthy(env['ENABLE_KVCACHED']),
    kvcachedIpcName: env['KVCACHED_IPC_NAME'] || undefined,
    shmDir: env['MODELGATE_SHM_DIR'] || KVCACHED_SHM_DIR,
    allowLongMaxModelLen: truthy(env['VLLM_ALLOW_LONG_MAX_MODEL_LEN']),
    cudaVisibleDevices: env['CUDA_VISIBLE_DEVICES'],
  }
}
