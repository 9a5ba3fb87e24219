import { type EngineDriver, programBase } from './driver.ts'
import { SGLANG_WAKE_PHASES, SglangClient } from './sglang-client.ts'
import { buildSglangArgs, buildSglangEnv, SGLANG_MANAGED_FLAGS } from './sglang-command.ts'
import { SglangLogAccumulator } from './sglang-log.ts'

/**
 * sglangDriver is `python -m sglang.launch_server` behind the EngineDriver seam: its flags
 * (sglang-command.ts), its log lines (sglang-log.ts, test/fixtures/sglang/), its control client
 * (sglang-client.ts: /health, release_memory_occupation as sleep, resume_memory_occupation as wake,
 * its /metrics names). Each file names the SGLang source it follows.
 *
 * Capabilities: two sleep levels. With sleep mode the engine is launched with
 * `--enable-weights-cpu-backup`, so a release keeps the weights in CPU memory and frees the KV cache
 * and the CUDA graphs: level 1, woken by `resume`. Level 2 treats the weights as discarded (what a
 * release does without the backup flag): the same release, and a wake that resumes the memory and
 * then reloads the weights from disk (`reload_weights`, /update_weights_from_disk). A wake resumes
 * everything at once (partial resumes of a tag not released kill the engine); there is no shared KV
 * cache (kvcached) support here.
 */
export const sglangDriver: EngineDriver = {
  kind: 'sglang',
  label: 'SGLang',
  defaultCommand: ['python3', '-m', 'sglang.launch_server'],
  managedFlags: SGLANG_MANAGED_FLAGS,
  refusedFlags: {},
  capabilities: { sleepLevels: [1, 2], partialWake: false, sharedCache: false },
  /** A release frees the weights, the KV cache and the CUDA graphs at either level; the CUDA context stays. */
  sleepShare: { 1: 0.9, 2: 0.9 },
  /** A release answers before torch_memory_saver gave the pages back. */
  freesAfterSleep: true,
  wakePhases: (level) => (level === 2 ? SGLANG_WAKE_PHASES : ['resume']),
  allWakePhases: SGLANG_WAKE_PHASES,
  wakePhasesDoc:
    '`resume` (POST /resume_memory_occupation: every part at once); after level 2 then `reload_weights` ' +
    '(POST /update_weights_from_disk)',
  args: buildSglangArgs,
  env: buildSglangEnv,
  /** The launch hints are not needed: SGLang's logs carry the figures its flags would only estimate. */
  logs: () => new SglangLogAccumulator(),
  client: (baseUrl, timeoutMs, opts) => new SglangClient(baseUrl, timeoutMs, opts),
  /**
   * `python -m sglang.launch_server` (or `sglang.launch_server` as a script), `sglang serve` (the
   * newer launcher, as the program or the script an interpreter runs), and the titles SGLang
   * gives its processes with setproctitle (`sglang::scheduler`, `sglang::detokenizer`, …; the
   * scheduler holds the GPU memory).
   */
  looksLike: ({ comm, argv }) => {
    const out: ('command' | 'process_name')[] = []
    if (comm.startsWith('sglang::') || (argv[0] ?? '').startsWith('sglang::')) out.push('process_name')
    const module = argv[1] === '-m' ? (argv[2] ?? '') : ''
    // argv[1] is the program only when argv[0] is the interpreter running it (`grep sglang serve` is none).
    const at = programBase(argv, 0).startsWith('python') ? 1 : 0
    const serve = programBase(argv, at) === 'sglang' && argv[at + 1] === 'serve'
    if (
      serve ||
      module.startsWith('sglang.launch_server') ||
      (argv[0] ?? '').endsWith('sglang/launch_server.py')
    )
      out.push('command')
    return out
  },
}
