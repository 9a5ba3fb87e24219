import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import {
  closeSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { isAlive } from '../../src/engine/process.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * A full disk, for real: the gateway's data dir is a small tmpfs, and its engines' log dir
 * (data_dir/engines) a second one, so each can be filled on its own (by a file written until the
 * kernel answers ENOSPC). Filling the log dir's file system stands for a disk that fills before a
 * load; filling the data dir's stands for one where SQLite can no longer grow its write-ahead log (a
 * fresh database's log is never checkpointed, so each write appends to it and fails with SQLITE_FULL),
 * as on a host whose disk filled up. Mounting needs root (CAP_SYS_ADMIN): without it the test is skipped.
 */
const PASSWORD = 'disk-full-test-password'
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: PASSWORD, JWT_SECRET: 'd'.repeat(40) }
const MODEL = 'facebook/opt-125m'

const mount = (dir: string, size: string) =>
  Bun.spawnSync(['mount', '-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', dir], { stderr: 'ignore' })
    .exitCode === 0
const umount = (dir: string) => Bun.spawnSync(['umount', '-l', dir], { stderr: 'ignore' })

const canMount = (() => {
  const probe = mkdtempSync(join(tmpdir(), 'modelgate-mount-probe-'))
  const ok = mount(probe, '64k')
  if (ok) umount(probe)
  rmSync(probe, { recursive: true, force: true })
  return ok
})()

/** fill writes `filler` in `dir` until its file system has no byte left; freeing it frees the space. */
function fill(dir: string): string {
  const path = join(dir, 'filler')
  const fd = openSync(path, 'a')
  try {
    for (const size of [1 << 20, 4096, 1]) {
      const chunk = Buffer.alloc(size, 0x61)
      try {
        for (;;) writeSync(fd, chunk)
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOSPC') throw err
      }
    }
  } finally {
    closeSync(fd)
  }
  return path
}

/** markedProcesses: live processes whose environment names `dataDir` as their modelgate's. */
function markedProcesses(dataDir: string): number[] {
  const marker = `MODELGATE_DATA_DIR=${resolve(dataDir)}`
  const out: number[] = []
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    try {
      if (readFileSync(`/proc/${name}/environ`, 'utf8').split('\0').includes(marker) && isAlive(Number(name)))
        out.push(Number(name))
    } catch {
      // gone
    }
  }
  return out
}

type ErrorBody = { error: { code: string; message: string; statusCode: number } }

describe.skipIf(!canMount)('a full disk', () => {
  const root = mkdtempSync(join(tmpdir(), 'modelgate-disk-full-'))
  const dataDir = join(root, 'data')
  const enginesDir = join(dataDir, 'engines')
  let gw: TestGateway
  let token: string

  const api = async <T = ErrorBody>(path: string, method = 'GET', body?: unknown) => {
    const r = await fetch(`${gw.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
    return { status: r.status, body: (await r.json()) as T }
  }
  const load = () =>
    api('/api/v1/models/load', 'POST', { model_path: MODEL, gpu_ids: [0], gpu_memory_utilization: 0.2 })
  const instances = async () => (await api<{ models: { id: string }[] }>('/api/v1/models')).body.models

  beforeAll(async () => {
    mkdirSync(dataDir)
    expect(mount(dataDir, '8m')).toBe(true)
    mkdirSync(enginesDir)
    expect(mount(enginesDir, '8m')).toBe(true)
    gw = await startGateway({ ports: [18740, 18744], hostEnv: AUTH, dataDir })
    const login = await gw.json<{ token: string }>('/api/auth/login', {
      method: 'POST',
      body: JSON.stringify({ username: 'admin', password: PASSWORD }),
    })
    token = login.body.token
  })

  afterAll(async () => {
    await gw?.stopKeep()
    umount(enginesDir)
    umount(dataDir)
    rmSync(root, { recursive: true, force: true })
  })

  it('refuses a load whose engine could not write its logs with 507, starting nothing', async () => {
    const filler = fill(enginesDir)
    try {
      const r = await load()
      expect(r.status).toBe(507)
      expect(r.body.error).toMatchObject({ code: 'INSUFFICIENT_STORAGE', statusCode: 507 })
      expect(r.body.error.message).toContain('The disk is full (ENOSPC)')
      expect(r.body.error.message).toContain('nothing was started')
      expect(await instances()).toEqual([])
      expect(markedProcesses(dataDir)).toEqual([])
    } finally {
      rmSync(filler)
    }
  })

  it('stops and forgets a load whose row could not be written, and says 507 wherever the admin API writes', async () => {
    const filler = fill(dataDir)
    try {
      const r = await load()
      expect(r.status).toBe(507)
      expect(r.body.error).toMatchObject({ code: 'INSUFFICIENT_STORAGE', statusCode: 507 })
      expect(r.body.error.message).toContain('The disk is full (SQLITE_FULL)')
      expect(r.body.error.message).toContain('its engine was stopped')
      // No ghost: no instance left `starting`, no engine of this data dir running.
      expect(await instances()).toEqual([])
      expect(markedProcesses(dataDir)).toEqual([])
      expect(gw.logs.some((l) => l.includes('its row could not be written; its engine was stopped'))).toBe(
        true,
      )

      const profile = await api('/api/memory/profiles', 'POST', {
        profileName: 'on a full disk',
        modelPath: MODEL,
        maxTokens: 2048,
        totalGpuMemoryGib: 10,
        weightsMemoryGib: 2,
        cudaGraphsGib: 1,
        gpuName: 'NVIDIA H100 80GB HBM3',
        gpuTotalMemoryGib: 80,
      })
      expect(profile.status).toBe(507)
      expect(profile.body.error.code).toBe('INSUFFICIENT_STORAGE')
      expect(profile.body.error.message).toContain('The disk is full (SQLITE_FULL)')
      const settings = await api('/api/settings', 'PUT', { hf_token: 'hf_diskfulltesttoken0123456789' })
      expect(settings.status).toBe(507)
      expect(settings.body.error.message).toContain('The disk is full (ENOSPC)')
      expect(JSON.stringify(settings.body)).not.toContain('hf_diskfull')
    } finally {
      rmSync(filler)
    }
  })

  it('loads again once there is space', async () => {
    const r = await api<{ instance_id: string }>('/api/v1/models/load', 'POST', {
      model_path: MODEL,
      gpu_ids: [0],
      gpu_memory_utilization: 0.2,
    })
    expect(r.status).toBe(202)
    const id = r.body.instance_id
    await waitFor(
      `instance ${id} to be active`,
      async () =>
        (await api<{ model: { status: string } }>(`/api/v1/models/${id}`)).body.model?.status === 'active',
      { timeoutMs: 20_000, wake: (n) => gw.host.bus.on('gateway.instance.status', n) },
    )
    expect((await api(`/api/v1/models/${id}/unload`, 'POST')).status).toBe(202)
    await waitFor('the instance to be removed', async () => (await instances()).length === 0, {
      wake: (n) => gw.host.bus.on('gateway.instance.status', n),
    })
  }, 30_000)
})
