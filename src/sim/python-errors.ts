/**
 * python-errors holds the Python-style traceback texts the simulator prints on stderr when it fails the way vLLM does, so the
 * gateway's failure surfacing sees familiar output (the last line carries the exception message).
 */
const SITE = '/usr/local/lib/python3.12/dist-packages'

export function startupTraceback(error: string): string[] {
  return [
    'Process EngineCore_DP0:',
    'Traceback (most recent call last):',
    '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
    '    self.run()',
    `  File "${SITE}/vllm/v1/engine/core.py", line 712, in run_engine_core`,
    '    raise e',
    `  File "${SITE}/vllm/v1/engine/core.py", line 699, in run_engine_core`,
    '    engine_core = EngineCoreProc(*args, **kwargs)',
    `  File "${SITE}/vllm/v1/worker/gpu_worker.py", line 239, in init_device`,
    '    self.requested_memory = request_memory(init_snapshot, self.cache_config)',
    error,
  ]
}

export function engineInitFailed(): string[] {
  return [
    'Traceback (most recent call last):',
    '  File "/usr/local/bin/vllm", line 10, in <module>',
    '    sys.exit(main())',
    `  File "${SITE}/vllm/v1/engine/utils.py", line 861, in wait_for_engine_startup`,
    '    raise RuntimeError("Engine core initialization failed. "',
    'RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}',
  ]
}

export function configTraceback(error: string): string[] {
  return [
    'Traceback (most recent call last):',
    '  File "/usr/local/bin/vllm", line 10, in <module>',
    '    sys.exit(main())',
    `  File "${SITE}/vllm/engine/arg_utils.py", line 1148, in create_model_config`,
    '    return ModelConfig(',
    `  File "${SITE}/vllm/config/model.py", line 1503, in get_and_verify_max_len`,
    '    raise ValueError(',
    error,
  ]
}

export function crashTraceback(error: string): string[] {
  return [
    'Traceback (most recent call last):',
    `  File "${SITE}/vllm/v1/engine/core.py", line 701, in run_engine_core`,
    '    engine_core.run_busy_loop()',
    `  File "${SITE}/vllm/v1/engine/core.py", line 728, in run_busy_loop`,
    '    self._process_engine_step()',
    `  File "${SITE}/vllm/v1/worker/gpu_model_runner.py", line 2214, in execute_model`,
    '    model_output = self.model(',
    error,
  ]
}

/** ENGINE_DEAD_MESSAGE is EngineDeadError's text, what requests on a dead engine core fail with. */
export const ENGINE_DEAD_MESSAGE =
  'EngineCore encountered an issue. See stack trace (above) for the root cause.'

export function engineDead(): string {
  return `vllm.v1.engine.exceptions.EngineDeadError: ${ENGINE_DEAD_MESSAGE}`
}
