/**
 * extractSimFlags pulls the simulator-only flags (`--sim-dir`, `--sim-gpus`) out of argv wherever they
 * appear, so the rest can be parsed exactly as `vllm serve` or `nvidia-smi` would.
 */
export interface SimFlags {
  simDir: string | undefined
  gpuSpec: string | undefined
  rest: string[]
}

export function extractSimFlags(argv: string[]): SimFlags {
  const flags: SimFlags = { simDir: undefined, gpuSpec: undefined, rest: [] }
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? ''
    const match = /^--sim[-_](dir|gpus)(?:=(.*))?$/.exec(arg)
    if (!match) {
      flags.rest.push(arg)
      continue
    }
    let value = match[2]
    if (value === undefined) {
      value = argv[i + 1] ?? ''
      i++
    }
    if (match[1] === 'dir') flags.simDir = value
    else flags.gpuSpec = value
  }
  return flags
}
