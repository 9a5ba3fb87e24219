import { afterAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import { groupAlive, groupPids, isAlive, processStartTime } from '../../src/engine/process.ts'
import { freePort } from '../sim/helpers.ts'
import { PodProcess, type PodProcessOptions } from '../support/pods.ts'
import { waitFor } from '../support/wait.ts'

/**
 * An engine's worker that outlives a crash. modelgate is killed with -9, then the engine's API server
 * (the process modelgate spawned, its group leader) is killed with -9 too: vLLM's EngineCore lives on
 * in the group, holding the GPU (the simulator's EngineCore does the same: src/sim/children.ts). The
 * next start must stop it, though nothing answers at the recorded pid any more, and must recognise it
 * by its group, its start time and its marker only: a process carrying the marker outside the group is
 * never signalled. Real processes, real sockets, auth on.
 */
const PASSWORD = 'crash-leftovers-password'
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: PASSWORD, JWT_SECRET: 'c'.repeat(40) }
const MODEL = 'facebook/opt-125m'

/** commandOf: a process's command line as `ps` shows it, '' once it is gone. */
const commandOf = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim()
  } catch {
    return ''
  }
}

/** The pod's listener: a free port (kept across its restart), so a second copy of the suite beside this one never meets it. */
const LISTEN_PORT = await freePort()

describe('an engine worker left by a crash', () => {
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-crash-leftovers-'))
  const opts: PodProcessOptions = {
    dir,
    id: 'crash',
    port: LISTEN_PORT,
    enginePorts: [18750, 18759],
    env: AUTH,
  }
  const groups: number[] = []
  const strays: Subprocess[] = []
  let pod: PodProcess | undefined

  afterAll(async () => {
    await pod?.stop()
    for (const pgid of groups) if (groupAlive(pgid)) process.kill(-pgid, 'SIGKILL')
    for (const s of strays) s.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  })

  it('is stopped by the restart; the failed instance unloads and nothing of its group is left', async () => {
    pod = await PodProcess.start(opts)
    const login = async (url: string) => {
      const r = await fetch(`${url}/api/auth/login`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ username: 'admin', password: PASSWORD }),
      })
      expect(r.status).toBe(200)
      return ((await r.json()) as { token: string }).token
    }
    let token = await login(pod.url)
    const api = async <T>(path: string, method = 'GET', body?: unknown) => {
      const r = await fetch(`${pod!.url}${path}`, {
        method,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      })
      return { status: r.status, body: (await r.json()) as T }
    }
    type Model = { status: string; process_id: number; error: string | null }
    const model = async (id: string) => api<{ model: Model }>(`/api/v1/models/${id}`)

    const load = await api<{ instance_id: string }>('/api/v1/models/load', 'POST', {
      model_path: MODEL,
      gpu_ids: [0],
      gpu_memory_utilization: 0.3,
    })
    expect(load.status).toBe(202)
    const id = load.body.instance_id
    const leader = (
      await waitFor(`instance ${id} to be active`, async () => {
        const m = (await model(id)).body.model
        return m?.status === 'active' ? m : undefined
      })
    ).process_id
    groups.push(leader)
    const core = groupPids(leader).find((p) => commandOf(p).startsWith('VLLM::EngineCore'))
    expect(core).toBeDefined()
    // The same marker outside the engine's group (another session): never the engine's.
    const marked = Bun.spawn(['sleep', '300'], {
      env: { ...process.env, MODELGATE_INSTANCE_ID: id, MODELGATE_DATA_DIR: resolve(pod.dataDir) },
      stdin: 'ignore',
      stdout: 'ignore',
      stderr: 'ignore',
      detached: true,
    })
    strays.push(marked)

    // modelgate dies, then the engine's API server: neither can clean up.
    pod.signal('SIGKILL')
    await pod.proc.exited
    process.kill(leader, 'SIGKILL')
    // Gone for good, as a host's init reaps it (here PID 1 may be slow to collect a zombie).
    await waitFor(`engine leader ${leader} to be reaped`, () => processStartTime(leader) === null)
    expect(isAlive(core!)).toBe(true)

    pod = await PodProcess.start(opts)
    token = await login(pod.url)
    await waitFor(
      `EngineCore ${core} left in group ${leader} to be stopped by the restart`,
      () => !isAlive(core!),
      {
        timeoutMs: 15_000,
      },
    )
    const failed = (await model(id)).body.model
    expect(failed.status).toBe('failed')
    expect(failed.error).toContain('engine exited while modelgate was not running')
    // Nothing of the group runs (a zombie may stay where PID 1 does not reap: it holds nothing).
    expect(groupPids(leader).filter(isAlive)).toEqual([])
    expect(marked.exitCode).toBeNull()
    expect(marked.signalCode).toBeNull()
    await waitFor('the restart to log what it stopped', () =>
      pod!.output().includes('stopped what was left of an engine of a previous run'),
    )

    const orphans = await api<{ orphans: { pid: number; pgid: number }[] }>('/api/orphans')
    expect(orphans.status).toBe(200)
    expect(orphans.body.orphans.filter((o) => o.pgid === leader || o.pid === core)).toEqual([])

    expect((await api(`/api/v1/models/${id}/unload`, 'POST')).status).toBe(202)
    await waitFor(`failed instance ${id} to be removed`, async () => (await model(id)).status === 404)
    expect(marked.exitCode).toBeNull()
  }, 60_000)
})
