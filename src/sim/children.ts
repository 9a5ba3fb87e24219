import type { Subprocess } from 'bun'

/**
 * spawnEngineChildren starts the helper processes a real vLLM server has (the EngineCore process and,
 * with tensor parallelism, one worker per rank). They only sleep, but they live in the engine's process
 * group, so the gateway's group signalling is exercised: a TERM to the group ends them, and a clean
 * engine exit kills them itself. The 24 h sleep bounds any leak; without `sleep` on PATH there are none.
 */
export interface EngineChild {
  role: string
  pid: number
  proc: Subprocess
}

export function spawnEngineChildren(tp: number): EngineChild[] {
  const roles = ['EngineCore_DP0', ...(tp > 1 ? Array.from({ length: tp }, (_, i) => `Worker_TP${i}`) : [])]
  const children: EngineChild[] = []
  for (const role of roles) {
    try {
      const proc = Bun.spawn(['sleep', '86400'], {
        argv0: role.startsWith('Worker') ? `VLLM::${role}` : 'VLLM::EngineCore',
        stdio: ['ignore', 'ignore', 'ignore'],
      })
      children.push({ role, pid: proc.pid, proc })
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
