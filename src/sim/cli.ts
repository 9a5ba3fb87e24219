import { DEFAULT_GPU_SPEC, GpuSpecError, parseGpuSpec, type SimGpu } from './gpus.ts'
import { extractSimFlags } from './sim-flags.ts'
import { resolveSimDir } from './state.ts'

/**
 * runSim is `modelgate sim …`: `sim engine MODEL [vllm serve flags]` runs a simulated vLLM server until
 * signalled, `sim sglang [python -m sglang.launch_server flags]` a simulated SGLang server, `sim smi
 * [nvidia-smi flags]` answers one nvidia-smi query. All share the simulated GPUs (`--sim-gpus` /
 * MODELGATE_SIM_GPUS) and state directory (`--sim-dir` / MODELGATE_SIM_DIR). The returned number is
 * the process exit code.
 */
const USAGE = `usage: modelgate sim engine MODEL [vllm serve flags] [--sim-dir DIR] [--sim-gpus SPEC]
       modelgate sim sglang --model-path MODEL [sglang.launch_server flags] [--sim-dir DIR] [--sim-gpus SPEC]
       modelgate sim smi [nvidia-smi flags] [--sim-dir DIR] [--sim-gpus SPEC]
`

export async function runSim(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const [command, ...rest] = argv
  if (command !== 'engine' && command !== 'smi' && command !== 'sglang') {
    process.stderr.write(USAGE)
    return 2
  }
  const flags = extractSimFlags(rest)
  const simDir = resolveSimDir(flags.simDir, env)
  let gpus: SimGpu[]
  try {
    gpus = parseGpuSpec(flags.gpuSpec ?? env['MODELGATE_SIM_GPUS'] ?? DEFAULT_GPU_SPEC, simDir)
  } catch (err) {
    if (!(err instanceof GpuSpecError)) throw err
    process.stderr.write(`modelgate sim: ${err.message}\n`)
    return 2
  }

  if (command === 'smi') {
    const { runSmi } = await import('./smi.ts')
    const result = runSmi(flags.rest, env, simDir, gpus)
    process.stdout.write(result.stdout)
    return result.code
  }

  if (command === 'sglang') {
    const { parseSglangArgs, SglangArgumentError } = await import('./sglang-args.ts')
    let sglang: import('./sglang-args.ts').SglangArgs
    try {
      sglang = parseSglangArgs(flags.rest)
    } catch (err) {
      if (!(err instanceof SglangArgumentError)) throw err
      process.stderr.write(
        `usage: launch_server.py [-h] --model-path MODEL_PATH [...]\nlaunch_server.py: error: ${err.message}\n`,
      )
      return 2
    }
    const [{ SglangEngine }, { bootSglang }] = await Promise.all([
      import('./sglang-engine.ts'),
      import('./sglang-boot.ts'),
    ])
    return new SglangEngine(sglang, env, simDir, gpus).run(bootSglang)
  }

  const { ArgumentError, parseVllmArgs } = await import('./vllm-args.ts')
  let args: import('./vllm-args.ts').VllmArgs
  try {
    args = parseVllmArgs(flags.rest)
  } catch (err) {
    if (!(err instanceof ArgumentError)) throw err
    process.stderr.write(`usage: vllm serve [model_tag] [options]\nvllm serve: error: ${err.message}\n`)
    return 2
  }
  const { SimEngine } = await import('./engine.ts')
  return new SimEngine(args, env, simDir, gpus).run()
}
