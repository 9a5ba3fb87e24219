import { afterEach, describe, expect, it } from 'bun:test'
import { portOwners } from '../../src/engine/socket-owner.ts'
import { exclusivelyFree } from '../support/ports.ts'
import { waitFor } from '../support/wait.ts'
import { cleanupSims, freePort, spawnEngine, tempSimDir, waitHealthy } from './helpers.ts'

afterEach(cleanupSims)

/**
 * The simulator binds its port as vLLM does: before the engine is built (`create_server_socket`,
 * SO_REUSEADDR, SO_REUSEPORT up to the release that limited it to several API servers), listening
 * only once the server starts. What a second engine on the same port does follows from that.
 */
const QWEN = 'Qwen/Qwen2.5-7B-Instruct'
const LLAMA = 'meta-llama/Llama-3.1-8B-Instruct'
const ADDRESS_IN_USE = 'OSError: [Errno 98] Address already in use'
/** Two engines fit on one simulated GPU. */
const HALF = ['--gpu-memory-utilization', '0.4', '--max-model-len', '8192']

const listeners = async (port: number, pgid: number) => (await portOwners(port, '127.0.0.1', pgid))!

describe('sim engine port', () => {
  it('holds its port bound while it loads: connections are refused and an exclusive bind fails', async () => {
    const port = await freePort()
    const e = await spawnEngine(
      QWEN,
      HALF,
      { MODELGATE_SIM_DIR: tempSimDir(), SIM_LOAD_DELAY_MS: '1500' },
      port,
    )
    await e.waitForOutput('Starting to load model')
    expect(exclusivelyFree(port)).toBe(false)
    expect(await listeners(port, e.pid)).toEqual({ ours: [], others: [] })
    await waitHealthy(e)
    expect((await listeners(port, e.pid)).ours.map((l) => l.pid)).toEqual([e.pid])
  }, 20_000)

  it("fails a current release's second engine on a port another one listens on, with vLLM's OSError", async () => {
    const dir = tempSimDir()
    const first = await spawnEngine(QWEN, HALF, { MODELGATE_SIM_DIR: dir })
    await waitHealthy(first)
    const second = await spawnEngine(LLAMA, HALF, { MODELGATE_SIM_DIR: dir }, first.port)
    expect(await second.exited).toBe(1)
    expect(second.stderr()).toContain(ADDRESS_IN_USE)
    expect(await listeners(first.port, first.pid)).toMatchObject({ ours: [{ pid: first.pid }], others: [] })
  }, 20_000)

  it("fails a current release's second engine loading alongside on the same port when the first listens", async () => {
    const dir = tempSimDir()
    const port = await freePort()
    const env = { MODELGATE_SIM_DIR: dir, SIM_LOAD_DELAY_MS: '1200' }
    const first = await spawnEngine(QWEN, HALF, env, port)
    await first.waitForOutput('Starting to load model')
    // Both hold the port bound (SO_REUSEADDR, neither listening): the second starts loading too.
    const second = await spawnEngine(LLAMA, HALF, { ...env, SIM_LOAD_DELAY_MS: '2400' }, port)
    await second.waitForOutput('Starting to load model')
    await waitHealthy(first)
    expect(await second.exited).toBe(1)
    expect(second.stderr()).toContain(ADDRESS_IN_USE)
    expect(await listeners(port, first.pid)).toMatchObject({ ours: [{ pid: first.pid }], others: [] })
  }, 20_000)

  it('lets an older release (SO_REUSEPORT) start a second engine on the same port: both listen', async () => {
    const dir = tempSimDir()
    const env = { MODELGATE_SIM_DIR: dir, SIM_VLLM_VERSION: '0.18.0' }
    const first = await spawnEngine(QWEN, HALF, env)
    await waitHealthy(first)
    const second = await spawnEngine(LLAMA, HALF, env, first.port)
    await second.waitForOutput('Application startup complete.')
    const seen = await waitFor('two listeners on the port', async () => {
      const l = await listeners(first.port, first.pid)
      return l.others.length === 1 ? l : undefined
    })
    expect(seen.ours.map((l) => l.pid)).toEqual([first.pid])
    expect(seen.others[0]).toMatchObject({ pid: second.pid, address: `127.0.0.1:${first.port}` })
    expect(seen.others[0]!.command).toContain(LLAMA)
  }, 20_000)
})
