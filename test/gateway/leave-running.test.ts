import { afterAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { groupAlive, signalGroup } from '../sim/helpers.ts'
import { groupGone, startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * engine.on_shutdown `leave`: a modelgate upgrade without reloading the models. The gateway shuts
 * down leaving its engines serving; the next start on the same data dir adopts them (same process,
 * same port), and they serve through /v1 again. With the default (`stop`), shutdown ends them.
 */
const dataDir = mkdtempSync(join(tmpdir(), 'modelgate-leave-data-'))
const simDir = mkdtempSync(join(tmpdir(), 'modelgate-leave-sim-'))
let gw: TestGateway | undefined
let pgid = 0

afterAll(async () => {
  await gw?.stop()
  if (pgid && groupAlive(pgid)) signalGroup(pgid, 'SIGKILL')
  rmSync(dataDir, { recursive: true, force: true })
  rmSync(simDir, { recursive: true, force: true })
})

const start = (onShutdown: 'stop' | 'leave') =>
  startGateway({ ports: [21600, 21609], dataDir, simDir, onShutdown })

async function chat(g: TestGateway): Promise<number> {
  const r = await fetch(`${g.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'kept', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
  })
  await r.text()
  return r.status
}

describe('engine.on_shutdown', () => {
  it('leave: the engine outlives the gateway, serves meanwhile, and the next start adopts it', async () => {
    gw = await start('leave')
    const id = await gw.load({ model_path: 'facebook/opt-125m', served_model_name: 'kept', gpu_ids: [0] })
    const model = await gw.waitStatus(id, 'active')
    pgid = model.process_id as number
    const port = model.port as number
    await gw.stopKeep() // the data dir stays, as on a host
    gw = undefined
    expect(groupAlive(pgid)).toBe(true)
    // Still serving on its own port while no gateway runs.
    expect((await fetch(`http://127.0.0.1:${port}/health`)).status).toBe(200)

    gw = await start('stop')
    const again = await gw.waitStatus(id, 'active')
    expect(again.process_id).toBe(pgid)
    expect(again.port).toBe(port)
    expect(await chat(gw)).toBe(200)
  })

  it('stop (the default): shutting down ends the engine', async () => {
    await gw!.stop()
    gw = undefined
    await waitFor('the engine group gone', () => groupGone(pgid), { timeoutMs: 10_000 })
  })
})
