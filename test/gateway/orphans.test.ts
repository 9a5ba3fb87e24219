import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import { engineReasons } from '../../plugins/gateway/orphans/engines.ts'
import { groupPids, isAlive, processStartTime } from '../../src/engine/process.ts'
import { baseEnv, freePort, groupAlive } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { SELF } from '../support/host.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Orphan engines through real sockets with auth on: engines started by hand (`sim engine` as real
 * processes outside the gateway, on the gateway's simulated GPUs so nvidia-smi reports their memory)
 * are listed and killed for real; the gateway's own engine is never listed and never signalled; a pid
 * whose start time is not the one listed is never signalled.
 */
const PASSWORD = 'orphans-test-password'
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: PASSWORD, JWT_SECRET: 'o'.repeat(40) }
const PORTS: [number, number] = [18720, 18729]
const MODEL = 'facebook/opt-125m'

interface Orphan {
  pid: number
  pgid: number
  command: string
  start_time: string
  started_at: string | null
  reasons: string[]
  gpu_memory_mib_by_gpu: Record<string, number>
  total_gpu_memory_mib: number
  marker: { state: string; instance_id: string | null; data_dir: string | null; this_data_dir: boolean }
  owner: { install: string; data_dir: string | null }
  stop_scope: 'group' | 'tree'
  processes: { pid: number; process_name: string; command: string; start_time: string; engine: boolean }[]
}
type ErrorBody = { error: { code: string; message: string } }

interface HandEngine {
  proc: Subprocess
  pid: number
  port: number
}

describe('orphan engines', () => {
  let gw: TestGateway
  let admin: string
  let readonly: string
  const spawned: Subprocess[] = []

  const as = (token: string, init: RequestInit = {}) => ({
    ...init,
    headers: { authorization: `Bearer ${token}`, ...(init.headers ?? {}) },
  })
  const list = async (token = readonly) => {
    const r = await gw.json<{
      orphans: Orphan[]
      total: number
      data_dir: string
      gpu_probe: { available: boolean }
    }>('/api/orphans', as(token))
    expect(r.status).toBe(200)
    return r.body
  }
  const find = async (pid: number) => (await list()).orphans.find((o) => o.pid === pid)
  const kill = (pid: number | string, startTime?: string, token = admin) =>
    gw.json<Record<string, unknown> & ErrorBody>(
      `/api/orphans/${pid}${startTime === undefined ? '' : `?start_time=${encodeURIComponent(startTime)}`}`,
      as(token, { method: 'DELETE' }),
    )

  /** handEngine starts `sim engine` outside the gateway, in its own session, on the gateway's simulated GPU 1. */
  const handEngine = async (env: Record<string, string> = {}): Promise<HandEngine> => {
    const port = await freePort()
    const proc = Bun.spawn(
      [...SELF, 'sim', 'engine', MODEL, '--port', String(port), '--gpu-memory-utilization', '0.2'],
      {
        env: {
          ...baseEnv(),
          SIM_LOAD_DELAY_MS: '50',
          CUDA_VISIBLE_DEVICES: '1',
          MODELGATE_SIM_DIR: gw.simDir,
          MODELGATE_SIM_GPUS: '2x80',
          ...env,
        },
        stdin: 'ignore',
        stdout: 'ignore',
        stderr: 'ignore',
        detached: true,
      },
    )
    spawned.push(proc)
    await waitFor(
      `hand-started engine ${proc.pid} to answer /health`,
      async () => {
        if (proc.exitCode !== null) throw new Error(`engine ${proc.pid} exited ${proc.exitCode}`)
        const res = await fetch(`http://127.0.0.1:${port}/health`).catch(() => null)
        return res?.status === 200
      },
      { timeoutMs: 15_000, pollMs: 25 },
    )
    return { proc, pid: proc.pid, port }
  }
  const healthy = async (port: number) =>
    (await fetch(`http://127.0.0.1:${port}/health`).catch(() => null))?.status === 200

  let orphan: HandEngine
  let managedId: string
  let managedPid: number

  beforeAll(async () => {
    gw = await startGateway({ ports: PORTS, hostEnv: AUTH })
    const login = await gw.json<{ token: string }>('/api/auth/login', {
      method: 'POST',
      body: JSON.stringify({ username: 'admin', password: PASSWORD }),
    })
    admin = login.body.token
    readonly = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
    const load = await gw.json<{ instance_id: string }>(
      '/api/v1/models/load',
      as(admin, {
        method: 'POST',
        body: JSON.stringify({ model_path: MODEL, gpu_ids: [0], gpu_memory_utilization: 0.2 }),
      }),
    )
    expect(load.status).toBe(202)
    managedId = load.body.instance_id
    let last: unknown
    const model = await waitFor(
      `instance ${managedId} to be active`,
      async () => {
        const m = await gw.json<{ model: { status: string; process_id: number } }>(
          `/api/v1/models/${managedId}`,
          as(admin),
        )
        last = m.body
        return m.body.model?.status === 'active' ? m.body.model : undefined
      },
      { timeoutMs: 20_000, wake: (n) => gw.host.bus.on('gateway.instance.status', n), show: () => last },
    )
    managedPid = model.process_id
    orphan = await handEngine()
  })

  afterAll(async () => {
    for (const p of spawned) {
      if (groupAlive(p.pid)) process.kill(-p.pid, 'SIGKILL')
      if (p.exitCode === null) p.kill('SIGKILL')
    }
    await gw?.stop()
  })

  it('lists an engine started by hand with its command, GPU memory, start time and no marker', async () => {
    const body = await list()
    expect(body.gpu_probe.available).toBe(true)
    expect(body.data_dir).toBe(resolve(gw.dataDir))
    const o = body.orphans.find((x) => x.pid === orphan.pid)
    expect(o).toBeDefined()
    expect(o!.reasons).toContain('simulator')
    expect(o!.reasons).toContain('gpu_memory')
    expect(o!.gpu_memory_mib_by_gpu['1']).toBeGreaterThan(0)
    expect(o!.gpu_memory_mib_by_gpu['0']).toBeUndefined()
    expect(o!.command).toContain(`sim engine ${MODEL} --port ${orphan.port}`)
    expect(o!.start_time).toBe(processStartTime(orphan.pid)!)
    expect(Math.abs(Date.parse(o!.started_at!) - Date.now())).toBeLessThan(5 * 60_000)
    expect(o!.marker).toEqual({ state: 'absent', instance_id: null, data_dir: null, this_data_dir: false })
    expect(o!.stop_scope).toBe('group')
    // Its EngineCore child (same process group) is listed with it, not as an orphan of its own.
    expect(o!.processes.map((p) => p.pid)).toContain(orphan.pid)
    const core = o!.processes.find((p) => p.command.startsWith('VLLM::EngineCore'))
    expect(core).toBeDefined()
    expect(body.orphans.some((x) => x.pid === core!.pid)).toBe(false)
  })

  it('lists an SGLang server started by hand, with its scheduler in its group', async () => {
    const port = await freePort()
    const proc = Bun.spawn(
      [
        ...SELF,
        'sim',
        'sglang',
        '--model-path',
        MODEL,
        '--port',
        String(port),
        '--mem-fraction-static',
        '0.2',
      ],
      {
        env: {
          ...baseEnv(),
          SIM_LOAD_DELAY_MS: '50',
          CUDA_VISIBLE_DEVICES: '1',
          MODELGATE_SIM_DIR: gw.simDir,
          MODELGATE_SIM_GPUS: '2x80',
        },
        stdin: 'ignore',
        stdout: 'ignore',
        stderr: 'ignore',
        detached: true,
      },
    )
    spawned.push(proc)
    await waitFor(`hand-started SGLang ${proc.pid} to answer /health`, async () => {
      if (proc.exitCode !== null) throw new Error(`SGLang ${proc.pid} exited ${proc.exitCode}`)
      return healthy(port)
    })
    const o = await waitFor('the SGLang server listed with its scheduler', async () => {
      const found = await find(proc.pid)
      return found?.processes.some((p) => p.command.startsWith('sglang::scheduler')) ? found : undefined
    })
    expect(o.reasons).toContain('simulator')
    expect(o.reasons).toContain('gpu_memory')
    expect(o.command).toContain(`sim sglang --model-path ${MODEL}`)
    const scheduler = o.processes.find((p) => p.command.startsWith('sglang::scheduler'))!
    expect((await list()).orphans.some((x) => x.pid === scheduler.pid)).toBe(false)
    process.kill(-proc.pid, 'SIGKILL')
  })

  it('never lists a managed engine, whose environment carries this gateway’s marker, and refuses to kill it', async () => {
    const body = await list()
    expect(body.orphans.some((o) => o.pid === managedPid || o.pgid === managedPid)).toBe(false)
    expect(body.orphans.some((o) => o.processes.some((p) => p.pid === managedPid))).toBe(false)
    const environ = (await Bun.file(`/proc/${managedPid}/environ`).text()).split('\0')
    expect(environ).toContain(`MODELGATE_INSTANCE_ID=${managedId}`)
    expect(environ).toContain(`MODELGATE_DATA_DIR=${resolve(gw.dataDir)}`)

    const refused = await kill(managedPid, processStartTime(managedPid)!)
    expect(refused.status).toBe(409)
    expect(refused.body.error.code).toBe('ORPHAN_MANAGED')
    expect(groupAlive(managedPid)).toBe(true)
    const m = await gw.json<{ model: { status: string } }>(`/api/v1/models/${managedId}`, as(admin))
    expect(m.body.model.status).toBe('active')
  })

  it('shows another modelgate’s marker, and this data dir’s for an instance it no longer manages', async () => {
    const foreign = await handEngine({
      MODELGATE_INSTANCE_ID: 'opt-125m-abcdef',
      MODELGATE_DATA_DIR: '/srv/other-modelgate/data',
    })
    const stale = await handEngine({
      MODELGATE_INSTANCE_ID: 'opt-125m-gone00',
      MODELGATE_DATA_DIR: resolve(gw.dataDir),
    })
    expect((await find(foreign.pid))?.marker).toEqual({
      state: 'present',
      instance_id: 'opt-125m-abcdef',
      data_dir: '/srv/other-modelgate/data',
      this_data_dir: false,
    })
    expect((await find(stale.pid))?.marker).toEqual({
      state: 'present',
      instance_id: 'opt-125m-gone00',
      data_dir: resolve(gw.dataDir),
      this_data_dir: true,
    })
    expect((await find(foreign.pid))?.owner).toEqual({
      install: 'another',
      data_dir: '/srv/other-modelgate/data',
    })
    expect((await find(stale.pid))?.owner).toEqual({ install: 'this', data_dir: resolve(gw.dataDir) })
    expect((await find(orphan.pid))?.owner).toEqual({ install: 'none', data_dir: null })
    // Marked as this data dir's *managed* instance: not an orphan, even outside its process group.
    const claimed = await handEngine({
      MODELGATE_INSTANCE_ID: managedId,
      MODELGATE_DATA_DIR: resolve(gw.dataDir),
    })
    expect(await find(claimed.pid)).toBeUndefined()
    expect((await kill(claimed.pid, processStartTime(claimed.pid)!)).body.error.code).toBe('ORPHAN_MANAGED')
    for (const e of [foreign, stale, claimed]) {
      process.kill(-e.pid, 'SIGKILL')
      await e.proc.exited
    }
  }, 20_000)

  it('refuses to stop an engine of another modelgate install, naming its data dir', async () => {
    const foreign = await handEngine({
      MODELGATE_INSTANCE_ID: 'opt-125m-fe0000',
      MODELGATE_DATA_DIR: '/srv/other-modelgate/data',
    })
    const listed = (await find(foreign.pid))!
    expect(listed.owner).toEqual({ install: 'another', data_dir: '/srv/other-modelgate/data' })
    const r = await kill(foreign.pid, listed.start_time)
    expect(r.status).toBe(409)
    expect(r.body.error.code).toBe('ORPHAN_FOREIGN')
    expect(r.body.error.message).toContain('/srv/other-modelgate/data')
    expect(r.body.error.message).toContain('Nothing was signalled')
    expect(foreign.proc.exitCode).toBeNull()
    expect(await healthy(foreign.port)).toBe(true)
    process.kill(-foreign.pid, 'SIGKILL')
    await foreign.proc.exited
  }, 20_000)

  it('lists every process of an orphan’s group and stops only those it listed', async () => {
    // A wrapper that looks like vLLM's API server leads its own group: an EngineCore and a plain
    // bystander (what a launch script leaves beside an engine) run in it. On SIGUSR1 it starts one
    // more process in the group: one that joins after the admin saw the listing.
    const lateFile = join(gw.dataDir, 'late.pid')
    const leader = Bun.spawn(
      [
        'bash',
        '-c',
        'trap \'sleep 303 & echo $! > "$LATE_PID_FILE"\' USR1; (exec -a VLLM::EngineCore sleep 300) & sleep 302 & wait; wait',
      ],
      {
        argv0: 'VLLM::APIServer',
        env: { ...baseEnv(), LATE_PID_FILE: lateFile },
        stdin: 'ignore',
        stdout: 'ignore',
        stderr: 'ignore',
        detached: true,
      },
    )
    spawned.push(leader)
    // Three processes, and the subshell has become the EngineCore (exec after fork: until then it is a
    // second copy of the wrapper).
    const cmdline = (pid: number) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8')
      } catch {
        return ''
      }
    }
    await waitFor(`the three processes of group ${leader.pid}, one of them the EngineCore`, () => {
      const pids = groupPids(leader.pid)
      return pids.length === 3 && pids.some((pid) => cmdline(pid).startsWith('VLLM::EngineCore'))
    })
    const listed = (await find(leader.pid))!
    expect(listed.stop_scope).toBe('group')
    const members = listed.processes
      .map((p) => ({ command: p.command, engine: p.engine }))
      .sort((a, b) => (a.command < b.command ? -1 : 1))
    expect(members).toEqual([
      { command: expect.stringContaining('VLLM::APIServer -c'), engine: true },
      { command: 'VLLM::EngineCore 300', engine: true },
      { command: 'sleep 302', engine: false },
    ])
    for (const p of listed.processes) expect(p.start_time).toBe(processStartTime(p.pid)!)

    process.kill(leader.pid, 'SIGUSR1')
    const late = await waitFor('the late process of the group to start', async () => {
      const text = await Bun.file(lateFile)
        .text()
        .catch(() => '')
      return Number(text.trim()) || undefined
    })
    expect(groupPids(leader.pid)).toContain(late)
    const r = await kill(leader.pid, listed.start_time)
    expect(r.status).toBe(200)
    expect(r.body).toMatchObject({ stopped: true, scope: 'group', outcome: 'terminated' })
    expect(r.body.signalled_pids).toEqual(listed.processes.map((p) => p.pid))
    expect(await leader.exited).not.toBe(0)
    for (const p of listed.processes)
      await waitFor(`listed process ${p.pid} to be gone`, () => !isAlive(p.pid))
    // The process that joined the group after the listing was never signalled.
    expect(isAlive(late)).toBe(true)
    process.kill(late, 'SIGKILL')
  })

  it('refuses hostile requests: bad pids and start times, no token, admin-readonly', async () => {
    const start = processStartTime(orphan.pid)!
    for (const pid of ['abc', '-1', '0', '1.5', '12abc', '99999999999999999999']) {
      const r = await kill(pid, start)
      expect(r.status, pid).toBe(400)
      expect(r.body.error.code).toBe('VALIDATION_ERROR')
    }
    for (const st of [undefined, '', 'abc', '-5', '1 2']) {
      const r = await kill(orphan.pid, st)
      expect(r.status, String(st)).toBe(400)
      expect(r.body.error.code).toBe('VALIDATION_ERROR')
    }
    expect((await kill(2 ** 30, '1')).body.error.code).toBe('ORPHAN_NOT_FOUND')
    expect((await kill(orphan.pid, start, readonly)).status).toBe(403)
    const anonymous = await gw.json(`/api/orphans/${orphan.pid}?start_time=${start}`, { method: 'DELETE' })
    expect(anonymous.status).toBe(401)
    expect((await gw.json('/api/orphans')).status).toBe(401)
    // This modelgate itself is no orphan.
    expect((await kill(process.pid, processStartTime(process.pid)!)).body.error.code).toBe('ORPHAN_NOT_FOUND')
    expect(await healthy(orphan.port)).toBe(true)
  })

  it('never signals a pid whose start time is not the one listed (a reused pid)', async () => {
    const listed = (await find(orphan.pid))!
    const wrong = String(Number(listed.start_time) + 1)
    const r = await kill(orphan.pid, wrong)
    expect(r.status).toBe(409)
    expect(r.body.error.code).toBe('ORPHAN_CHANGED')
    expect(r.body.error.message).toContain('nothing was signalled')

    // The listed start time presented for a pid an unrelated process now holds.
    const bystander = Bun.spawn(['sleep', '300'], { stdin: 'ignore', stdout: 'ignore', stderr: 'ignore' })
    spawned.push(bystander)
    const b = await kill(bystander.pid, listed.start_time)
    expect(b.status).toBe(409)
    expect(b.body.error.code).toBe('ORPHAN_CHANGED')
    // With its own start time it is still no orphan engine.
    expect((await kill(bystander.pid, processStartTime(bystander.pid)!)).body.error.code).toBe(
      'ORPHAN_NOT_FOUND',
    )
    expect(bystander.exitCode).toBeNull()
    expect(bystander.signalCode).toBeNull()
    expect(orphan.proc.exitCode).toBeNull()
    expect(await healthy(orphan.port)).toBe(true)
    bystander.kill('SIGKILL')
  })

  it('stops a worker left in modelgate’s own process group alone, never the group', async () => {
    // A `VLLM::EngineCore` child of this process: same process group as the gateway (and the test).
    const worker = Bun.spawn(['sleep', '300'], {
      argv0: 'VLLM::EngineCore',
      stdin: 'ignore',
      stdout: 'ignore',
      stderr: 'ignore',
    })
    spawned.push(worker)
    const listed = await find(worker.pid)
    expect(listed?.reasons).toEqual(['engine_process_name'])
    expect(listed?.stop_scope).toBe('tree')
    const r = await kill(worker.pid, listed!.start_time)
    expect(r.status).toBe(200)
    expect(r.body).toMatchObject({ stopped: true, scope: 'tree', signalled_pids: [worker.pid] })
    expect(await worker.exited).not.toBe(0)
    expect(worker.signalCode).toBe('SIGTERM')
    expect(await healthy(orphan.port)).toBe(true)
  })

  it('kills an orphan engine and its process group, then answers 404 for it', async () => {
    const listed = (await find(orphan.pid))!
    const r = await kill(orphan.pid, listed.start_time)
    expect(r.status).toBe(200)
    expect(r.body).toMatchObject({
      pid: orphan.pid,
      start_time: listed.start_time,
      stopped: true,
      scope: 'group',
    })
    expect(['terminated', 'killed']).toContain(r.body.outcome as string)
    await orphan.proc.exited
    await waitFor(`orphan group ${orphan.pid} to be gone`, () => !groupAlive(orphan.pid))
    expect(await find(orphan.pid)).toBeUndefined()
    const again = await kill(orphan.pid, listed.start_time)
    expect(again.status).toBe(404)
    expect(again.body.error.code).toBe('ORPHAN_NOT_FOUND')
    expect(gw.logs.some((l) => l.includes(`orphan engine ${orphan.pid} stopped`))).toBe(true)
    // The managed engine was never touched.
    expect(groupAlive(managedPid)).toBe(true)
  })
})

describe('what looks like an engine (each driver says)', () => {
  it("knows vLLM and SGLang by their launch commands and their processes' names, not by an argument", () => {
    expect(engineReasons({ comm: 'vllm', argv: ['/usr/bin/vllm', 'serve', 'm'] })).toEqual(['vllm_command'])
    expect(
      engineReasons({ comm: 'python3', argv: ['python3', '-m', 'vllm.entrypoints.openai.api_server'] }),
    ).toEqual(['vllm_command'])
    expect(engineReasons({ comm: 'VLLM::EngineCor', argv: [] })).toEqual(['engine_process_name'])
    expect(
      engineReasons({
        comm: 'python3',
        argv: ['python3', '-m', 'sglang.launch_server', '--model-path', 'm'],
      }),
    ).toEqual(['sglang_command'])
    // `sglang serve`, the newer launcher: the installed script, or that script run by an interpreter.
    expect(
      engineReasons({ comm: 'sglang', argv: ['/usr/local/bin/sglang', 'serve', '--model-path', 'm'] }),
    ).toEqual(['sglang_command'])
    expect(
      engineReasons({ comm: 'python3', argv: ['/usr/bin/python3', '/usr/local/bin/sglang', 'serve', 'm'] }),
    ).toEqual(['sglang_command'])
    expect(engineReasons({ comm: 'grep', argv: ['grep', 'sglang', 'serve'] })).toEqual([])
    expect(engineReasons({ comm: 'sglang::schedul', argv: ['sglang::scheduler_TP0'] })).toEqual([
      'engine_process_name',
    ])
    expect(engineReasons({ comm: 'sglang::detoken', argv: [] })).toEqual(['engine_process_name'])
    // An argument is not a program: grep and an editor are no engines.
    expect(engineReasons({ comm: 'grep', argv: ['grep', 'vllm serve'] })).toEqual([])
    expect(engineReasons({ comm: 'vim', argv: ['vim', 'sglang.launch_server.py'] })).toEqual([])
    expect(engineReasons({ comm: 'bun', argv: ['modelgate', 'sim', 'sglang', '--port', '1'] })).toEqual([
      'simulator',
    ])
  })
})
