import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { knownPlugins } from '../../src/config/file.ts'
import { ConfigError, loadConfig } from '../../src/config/load.ts'
import { cleanupSims, type EngineProc, spawnSglang, tempSimDir } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import { chat, routerPlugin, startRouter, type TestRouter } from './support.ts'

/**
 * A configured SGLang endpoint (`endpoint.engine_kind: sglang`): the router drives it through the
 * SGLang driver's client: sleep as release_memory_occupation, wake as resume_memory_occupation,
 * health on /health, and a sleeping engine's health on /get_model_info (never a generation on its
 * released memory). Auto-sleep at a level SGLang does not have is refused at start.
 */
const NAME = 'sg'
let e: EngineProc
let r: TestRouter

const engineCalls = () =>
  [...e.stdout().matchAll(/"(\w+ \/[\w/_]+)[^"]*" (\d+)/g)].map((m) => `${m[1]} ${m[2]}`)

beforeAll(async () => {
  e = await spawnSglang(
    'Qwen/Qwen2.5-0.5B-Instruct',
    ['--served-model-name', NAME, '--enable-memory-saver', '--enable-weights-cpu-backup', '--enable-metrics'],
    { MODELGATE_SIM_DIR: tempSimDir(), CUDA_VISIBLE_DEVICES: '0', SIM_SGLANG_HEALTH_TICK_MS: '50' },
  )
  await e.waitForOutput('The server is fired up and ready to roll!')
  r = await startRouter(`
auto_sleep: { min_sleep_duration: 0 }
models:
  - { name: ${NAME}, endpoint: { host: 127.0.0.1, port: ${e.port}, engine_kind: sglang } }
`)
}, 30_000)

afterAll(async () => {
  await r?.stop()
  await cleanupSims()
})

describe('router with an SGLang endpoint', () => {
  it('routes, sleeps by release, probes the sleeping engine without a generation, wakes by resume', async () => {
    expect((await r.post<{ model: string }>('/v1/chat/completions', chat(NAME))).status).toBe(200)
    const slept = await r.post(`/action/sleep/${NAME}`)
    expect(slept.status).toBe(200)
    const health = await r.get<{ status: string }>(`/health/${NAME}`)
    expect(health.body.status).toBe('healthy')
    const woke = await r.post(`/action/wakeup/${NAME}`)
    expect(woke.status).toBe(200)
    expect((await r.post('/v1/chat/completions', chat(NAME))).status).toBe(200)
    await waitFor(
      'the engine to log the last chat',
      () => engineCalls().filter((c) => c.includes('chat')).length === 2,
    )
    const calls = engineCalls().filter((c) => !c.startsWith('GET /metrics'))
    const from = calls.indexOf('POST /release_memory_occupation 200')
    const to = calls.indexOf('POST /resume_memory_occupation 200')
    expect(from).toBeGreaterThan(0)
    expect(to).toBeGreaterThan(from)
    expect(calls.slice(from + 1, to)).toContain('GET /get_model_info 200')
    expect(calls.slice(from + 1, to).some((c) => c.startsWith('GET /health'))).toBe(false)
    expect(e.proc.exitCode).toBeNull()
  }, 30_000)

  it('accepts auto-sleep at level 2 for an SGLang endpoint (its wake then reloads the weights)', () => {
    let problems: string[] = []
    try {
      loadConfig(
        `plugins:\n  router:\n    auto_sleep: { enabled: true, level: 2 }\n    models: [{ name: m, endpoint: { port: 30000, engine_kind: sglang } }]\n`,
        {},
        knownPlugins([routerPlugin]),
      )
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err
      problems = err.problems
    }
    expect(problems).toEqual([])
  }, 30_000)
})
