/**
 * SimKnobs gathers the environment variables that steer the engine simulator in tests and demos
 * (timings, failure injection, log style). Read once at start so behaviour is fixed per process.
 */
export interface SimKnobs {
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
  errorShape: 'new' | 'old'
  sleepInference: 'queue' | 'crash'
  wakeDelayMs: number
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
  return {
    loadDelayMs: num(env['SIM_LOAD_DELAY_MS'], 1500),
    tokensPerSec: Math.max(0.1, num(env['SIM_TOKENS_PER_SEC'], 50)),
    ttftMs: num(env['SIM_TTFT_MS'], 0),
    crashAfterTokens: crash === undefined || crash === '' ? undefined : num(crash, 0),
    crashMode: env['SIM_CRASH_MODE'] === 'error' ? 'error' : 'abrupt',
    failStart: env['SIM_FAIL_START'] || undefined,
    hang: truthy(env['SIM_HANG']),
    hangOnTerm: truthy(env['SIM_HANG_ON_TERM']),
    logAnsi: truthy(env['SIM_LOG_ANSI']),
    logStyle: env['SIM_LOG_STYLE'] === 'v0' ? 'v0' : 'v1',
    errorShape: env['SIM_ERROR_SHAPE'] === 'old' ? 'old' : 'new',
    sleepInference: env['SIM_SLEEP_INFERENCE'] === 'crash' ? 'crash' : 'queue',
    wakeDelayMs: num(env['SIM_WAKE_DELAY_MS'], 300),
    devMode: truthy(env['VLLM_SERVER_DEV_MODE']),
    kvcached: truthy(env['ENABLE_KVCACHED']),
    kvcachedIpcName: env['KVCACHED_IPC_NAME'] || undefined,
    shmDir: env['MODELGATE_SHM_DIR'] || '/dev/shm',
    allowLongMaxModelLen: truthy(env['VLLM_ALLOW_LONG_MAX_MODEL_LEN']),
    cudaVisibleDevices: env['CUDA_VISIBLE_DEVICES'],
  }
}
