import type { Subprocess } from 'bun'

/**
 * spawnEngineChildren starts the helper processes a real vLLM server has (the EngineCore process and,
 * with tensor parallelism, one worker per rank). They only sleep, but they live in the engine's process
 * group, so the gateway's group signalling is exercised: a TERM to the group ends them, and a clean
 * engine exit kills them itself. They are also the processes that hold the GPU memory in nvidia-smi
 * (as in vLLM, not the `vllm serve` pid), and killing one kills the engine core (see engine.ts).
 * The 24 h sleep bounds any leak; without `sleep` on PATH there are none.
 */
export interface EngineChild {
  role: string
  pid: number
  proc: Subprocess
  /** process_name nvidia-smi shows for it (vLLM sets its process title). */
  processName: string
}

export function spawnEngineChildren(tp: number): EngineChild[] {
  const roles = ['EngineCore_DP0', ...(tp > 1 ? Array.from({ length: tp }, (_, i) => `Worker_TP${i}`) : [])]
  return spawnChildren(
    roles.map((role) => ({
      role,
      processName: role.startsWith('Worker') ? `VLLM::${role}` : 'VLLM::EngineCore',
    })),
  )
}

/** spawnChildren starts one helper per role, named as the engine names its processes. */
export function spawnChildren(roles: { role: string; processName: string }[]): EngineChild[] {
  const children: EngineChild[] = []
  for (const { role, processName } of roles) {
    try {
      const proc = Bun.spawn(['sleep', '86400'], {
        argv0: processName,
        stdio: ['ignore', 'ignore', 'ignore'],
      })
      children.push({ role, pid: proc.pid, proc, processName })
    } catch {
      // No `sleep` on PATH: run without helpers rather than fail the simulated start-up.
    }
  }
  return children
}

/** killEngineChildren ends the helpers with SIGTERM; SIGKILL after a short grace if needed. */
export async function killEngineChildren(children: EngineChild[], graceMs = 100): Promise<void> {
  for (const c of children) c.proc.kill('SIGTERM')
  const timeout = new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), graceMs).unref?.())
  const done = await Promise.race([Promise.all(children.map((c) => c.proc.exited)), timeout])
  if (done === 'timeout') for (const c of children) if (c.proc.exitCode === null) c.proc.kill('SIGKILL')
}
