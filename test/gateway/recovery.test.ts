import { Database } from 'bun:sqlite'
import { afterAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import { freePort } from '../sim/helpers.ts'
import { gatewayYaml, groupGone, startGateway } from '../support/gateway.ts'
import { SELF } from '../support/host.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

const MAIN = resolve(import.meta.dir, '../../src/main.ts')

describe('engine start-up failure', () => {
  it('fails the instance with the engine’s own error line when the GPU is fuller than it looked', async () => {
    // The engines see a GPU already taken by another engine; nvidia-smi (another sim dir) sees it free,
    // so the gateway's own check passes and vLLM's start-up check is what fails.
    const engineDir = mkdtempSync(join(tmpdir(), 'modelgate-gw-full-'))
    const smiDir = mkdtempSync(join(tmpdir(), 'modelgate-gw-empty-'))
    const gw = await startGateway({ ports: [18140, 18149], simDir: engineDir, smiSimDir: smiDir })
    try {
      const hog = await gw.load({ model_path: 'Qwen/Qwen2.5-7B-Instruct', gpu_ids: [0] })
      await gw.waitStatus(hog, 'active')
      const id = await gw.load({ model_path: 'Qwen/Qwen2.5-7B-Instruct', gpu_ids: [0] })
      const failed = await gw.waitStatus(id, 'failed')
      expect(failed.error).toMatch(
        // Current vLLM names the device (`cuda:0`); older builds did not.
        /^Free memory on device (cuda:\d+ )?\([\d.]+\/[\d.]+ GiB\) on startup is less than desired GPU memory utilization \([\d.]+, [\d.]+ GiB\)/,
      )
      const events = await fetch(`${gw.url}/api/v1/models/instances/${id}/events?types=status,error`)
      const sse = await readSse(
        events,
        `instance ${id}'s error event`,
        (evs) => evs.some((e) => e.event === 'error'),
        5000,
      )
      const text = sse.map((e) => JSON.stringify(e.data)).join('\n')
      expect(text).toContain('"currentStatus":"failed"')
      expect((await gw.json(`/api/v1/models/${id}/unload`, { method: 'POST' })).status).toBe(202)
    } finally {
      await gw.stop()
      rmSync(engineDir, { recursive: true, force: true })
      rmSync(smiDir, { recursive: true, force: true })
    }
  })
})

/** The listener: a free port (kept across the restarts), so a second copy of the suite beside this one never meets it. */
const LISTEN_PORT = await freePort()

describe('restart safety', () => {
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-restart-'))
  const simDir = join(dir, 'sim')
  const dataDir = join(dir, 'data')
  const port = LISTEN_PORT
  const url = `http://127.0.0.1:${port}`
  const configPath = join(dir, 'modelgate.yaml')
  writeFileSync(
    configPath,
    // The simulators' own entry (not modelgate's @self) and a short SIGTERM grace: the unhealthy engine
    // is SIGSTOPped, so it is the grace that ends, then SIGKILL.
    `server: { host: 127.0.0.1, port: ${port} }\ndata_dir: ${dataDir}\n${gatewayYaml({ ports: [18150, 18159], self: SELF, stopGraceSeconds: 0.5 }, simDir)}`,
  )
  const children: Subprocess[] = []
  const engineGroups: number[] = []
  let bystander: Subprocess | undefined

  afterAll(() => {
    for (const c of children) c.kill('SIGKILL')
    for (const pgid of engineGroups) if (!groupGone(pgid)) process.kill(-pgid, 'SIGKILL')
    bystander?.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  })

  async function serve(): Promise<Subprocess> {
    const child = Bun.spawn([process.execPath, MAIN, 'serve', '--config', configPath], {
      stdout: 'ignore',
      stderr: 'ignore',
      stdin: 'ignore',
    })
    children.push(child)
    await waitFor(
      'modelgate to be ready',
      async () => {
        if (child.exitCode !== null) throw new Error(`modelgate exited ${child.exitCode} before it was ready`)
        return fetch(`${url}/api/health/ready`)
          .then((r) => r.status === 200)
          .catch(() => false)
      },
      { timeoutMs: 20_000, pollMs: 25 },
    )
    return child
  }

  const api = async <T>(path: string, method = 'GET', body?: unknown) => {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
    return (await res.json()) as T
  }

  type Model = { id: string; status: string; process_id: number }
  const models = async () => (await api<{ models: Model[] }>('/api/v1/models')).models

  it('re-adopts healthy engines, stops unhealthy ones, never signals a reused pid, and leaves nothing behind', async () => {
    const first = await serve()
    const keep = (
      await api<{ instance_id: string }>('/api/v1/models/load', 'POST', {
        model_path: 'facebook/opt-125m',
        gpu_ids: [0],
        gpu_memory_utilization: 0.3,
        enable_sleep_mode: true,
      })
    ).instance_id
    const drop = (
      await api<{ instance_id: string }>('/api/v1/models/load', 'POST', {
        model_path: 'facebook/opt-125m',
        gpu_ids: [1],
        gpu_memory_utilization: 0.3,
      })
    ).instance_id
    await waitFor(
      'both instances to be active',
      async () => (await models()).every((m) => m.status === 'active'),
      {
        timeoutMs: 20_000,
        pollMs: 25,
      },
    )
    await api(`/api/models/instances/${keep}/sleep?level=1`, 'POST')
    const before = new Map((await models()).map((m) => [m.id, m]))

    // modelgate dies without any chance to clean up; its engines live on in their own sessions.
    first.kill('SIGKILL')
    await first.exited
    const keepPid = before.get(keep)!.process_id
    const dropPid = before.get(drop)!.process_id
    engineGroups.push(keepPid, dropPid)
    expect(groupGone(keepPid)).toBe(false)
    expect(groupGone(dropPid)).toBe(false)
    process.kill(-dropPid, 'SIGSTOP') // unhealthy: /health will not answer

    // A row whose pid now belongs to an unrelated process (pid reuse): it must never be signalled.
    bystander = Bun.spawn(['sleep', '60'], { stdin: 'ignore', stdout: 'ignore', stderr: 'ignore' })
    const db = new Database(join(dataDir, 'modelgate.db'))
    db.query(
      `INSERT INTO gateway_instances SELECT 'ghost', model_path, model_name, served_model_name, 'active', 18159, ?, ?,
       '1', max_tokens, requested_max_tokens, gpu_memory_utilization, gpu_ids, tensor_parallel_size, sharedcache_enabled,
       enable_sleep_mode, NULL, NULL, extra_args, launch_argv, launch_command, log_dir, loaded_at, ready_at, NULL,
       memory_metrics, memory_baseline_by_gpu, updated_at, evictable, engine_kind FROM gateway_instances WHERE id = ?`,
    ).run(bystander.pid, bystander.pid, keep)
    db.close()

    const second = await serve()
    const after = new Map((await models()).map((m) => [m.id, m]))
    expect(after.get(keep)).toMatchObject({ status: 'sleeping', process_id: keepPid })
    await waitFor(`the unhealthy engine group ${dropPid} to be stopped`, () => groupGone(dropPid), {
      timeoutMs: 20_000,
    })
    expect(after.has(drop)).toBe(false)
    expect(after.get('ghost')).toMatchObject({ status: 'failed' })
    expect(bystander.exitCode).toBeNull()
    expect(bystander.signalCode).toBeNull()

    // The re-adopted engine is fully usable: wake it, and its logs keep flowing.
    const woke = await api<{ status: string }>(`/api/models/instances/${keep}/wake`, 'POST')
    expect(woke.status).toBe('running')
    // Read from the engine's log files as they grow: wait for the wake request's line.
    const logs = await waitFor(`the wake request in instance ${keep}'s logs`, async () => {
      const r = await api<{ logs: string }>(`/api/v1/models/instances/${keep}/logs`)
      return r.logs.includes('wake') ? r : undefined
    })
    expect(logs.logs).toContain('wake')

    second.kill('SIGTERM')
    expect(await second.exited).toBe(0)
    expect(groupGone(keepPid)).toBe(true)
  }, 30_000)
})

/**
 * An engine found asleep after a restart (it fell asleep while modelgate was gone, so no level is
 * recorded) is woken at the level it says it slept at: a level-1 sleeper gets one /wake_up, not
 * the level-2 reload. Older builds say it with vllm:engine_sleep_state, current ones with
 * vllm:engine_sleep_component_state; on the current one the gateway's own sleep then sends
 * mode=keep, on the older mode=wait.
 */
const FOUND_ASLEEP = [
  { version: '0.29.0', mode: 'wait', listen: await freePort(), engine: await freePort() },
  { version: '0.30.0', mode: 'keep', listen: await freePort(), engine: await freePort() },
]

describe('an engine found asleep after a restart', () => {
  for (const v of FOUND_ASLEEP)
    it(`is woken at the level it slept at (vLLM ${v.version}), and slept again with mode=${v.mode}`, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'modelgate-asleep-'))
      const url = `http://127.0.0.1:${v.listen}`
      const configPath = join(dir, 'modelgate.yaml')
      const yaml = gatewayYaml(
        { ports: [v.engine, v.engine], self: SELF, env: { SIM_VLLM_VERSION: v.version } },
        join(dir, 'sim'),
      )
      writeFileSync(
        configPath,
        `server: { host: 127.0.0.1, port: ${v.listen} }\ndata_dir: ${join(dir, 'data')}\n${yaml}`,
      )
      const serve = async () => {
        const child = Bun.spawn([process.execPath, MAIN, 'serve', '--config', configPath], {
          stdout: 'ignore',
          stderr: 'ignore',
          stdin: 'ignore',
        })
        await waitFor('modelgate to be ready', async () => {
          if (child.exitCode !== null)
            throw new Error(`modelgate exited ${child.exitCode} before it was ready`)
          return fetch(`${url}/api/health/ready`)
            .then((r) => r.status === 200)
            .catch(() => false)
        })
        return child
      }
      const api = async <T>(path: string, method = 'GET', body?: unknown) =>
        (await (
          await fetch(`${url}${path}`, {
            method,
            headers: { 'content-type': 'application/json' },
            body: body === undefined ? undefined : JSON.stringify(body),
          })
        ).json()) as T
      type Model = { id: string; status: string; process_id: number }
      const status = async (id: string) =>
        (await api<{ models: Model[] }>('/api/v1/models')).models.find((m) => m.id === id)
      let pgid = 0
      let second: Subprocess | undefined
      const first = await serve()
      try {
        const id = (
          await api<{ instance_id: string }>('/api/v1/models/load', 'POST', {
            model_path: 'facebook/opt-125m',
            gpu_ids: [0],
            gpu_memory_utilization: 0.3,
            enable_sleep_mode: true,
          })
        ).instance_id
        await waitFor('the instance to be active', async () => (await status(id))?.status === 'active')
        pgid = (await status(id))!.process_id
        // modelgate dies; the engine is put to sleep behind its back.
        first.kill('SIGKILL')
        await first.exited
        const slept = await fetch(`http://127.0.0.1:${v.engine}/sleep?level=1`, { method: 'POST' })
        expect(slept.status).toBe(200)

        second = await serve()
        expect(await status(id)).toMatchObject({ status: 'sleeping' })
        const woke = await api<{ status: string; sleep_level: number | null; phases: string[] }>(
          `/api/models/instances/${id}/wake`,
          'POST',
        )
        expect(woke).toMatchObject({ status: 'running', sleep_level: 1, phases: ['wake_up'] })

        const again = await api<{ status: string; mode: string | null }>(
          `/api/models/instances/${id}/sleep?level=1`,
          'POST',
        )
        expect(again).toMatchObject({ status: 'sleeping', mode: v.mode })
      } finally {
        first.kill('SIGKILL')
        second?.kill('SIGTERM')
        await second?.exited
        if (pgid && !groupGone(pgid)) process.kill(-pgid, 'SIGKILL')
        rmSync(dir, { recursive: true, force: true })
      }
    }, 30_000)
})
