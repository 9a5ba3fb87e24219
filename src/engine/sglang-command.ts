import { cudaEnv } from './argv.ts'
import type { LaunchSpec } from './driver.ts'

/**
 * sglang-command builds the arguments and environment of `python -m sglang.launch_server`. The
 * flags, as srt/server_args.py declares them (argparse: `--x v` or `--x=v`; an unknown flag is an
 * error, `launch_server.py: error: unrecognized arguments: …`, exit 2):
 *
 * - `--model-path` (alias `--model`), `--served-model-name` (one name; the default is the model
 *   path), `--host` (127.0.0.1), `--port` (30000);
 * - `--tp-size` (aliases `--tensor-parallel-size`, `--tp`): ranks take the first N visible GPUs
 *   (`--base-gpu-id` 0), so CUDA_VISIBLE_DEVICES chooses them as for any engine;
 * - `--mem-fraction-static`: the share of the memory free at start-up (not of the whole device, as
 *   vLLM's `--gpu-memory-utilization` is) for the weights and the KV pool; CUDA graphs and
 *   activations live in the rest;
 * - `--context-length`: the context length (default: the model's);
 * - `--enable-memory-saver`: what release_memory_occupation / resume_memory_occupation need to free
 *   anything; `--enable-weights-cpu-backup` keeps the weights in CPU memory across a release (without
 *   it they are discarded and must be reloaded); `--enable-metrics` mounts /metrics.
 *
 * SGLANG_MEMORY_SAVER_CUDA_GRAPH=true puts the CUDA graphs in a memory-saver region too, so a release
 * frees them (RL frameworks that sleep SGLang between rollouts set it, e.g. verl and slime).
 */
export function buildSglangArgs(s: LaunchSpec): string[] {
  const args = ['--model-path', s.modelPath, '--port', String(s.port), '--host', s.host]
  args.push('--served-model-name', s.servedModelName)
  if (s.maxModelLen !== undefined) args.push('--context-length', String(s.maxModelLen))
  args.push('--mem-fraction-static', String(s.gpuMemoryUtilization))
  if (s.tensorParallelSize > 1) args.push('--tp-size', String(s.tensorParallelSize))
  if (s.enableSleepMode) args.push('--enable-memory-saver', '--enable-weights-cpu-backup')
  args.push('--enable-metrics', ...s.extraArgs)
  return args
}

export function buildSglangEnv(s: LaunchSpec): Record<string, string> {
  return { ...cudaEnv(s.gpuIds), ...(s.enableSleepMode ? { SGLANG_MEMORY_SAVER_CUDA_GRAPH: 'true' } : {}) }
}

/** SGLANG_MANAGED_FLAGS: the flags the load body sets (with their aliases). */
export const SGLANG_MANAGED_FLAGS = [
  '--model-path',
  '--model',
  '--host',
  '--served-model-name',
  '--tp-size',
  '--tensor-parallel-size',
  '--tp',
  '--context-length',
  '--mem-fraction-static',
  '--enable-memory-saver',
] as const
