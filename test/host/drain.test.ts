import { afterAll, describe, expect, it } from 'bun:test'
import { groupGone, startGateway, type TestGateway } from '../support/gateway.ts'

/**
 * Shutdown drains before it stops engines: a stream running when SIGTERM's shutdown begins ends
 * whole (its last token and `[DONE]`), new connections are refused meanwhile, and only then is the
 * engine's process group stopped. A drain that outlives `shutdown.drain_ms` is cut, and the engine
 * still stops inside the shutdown budget.
 */
describe('shutdown drain', () => {
  const started: TestGateway[] = []
  afterAll(async () => {
    for (const gw of started) await gw.stop().catch(() => {})
  })

  async function activeModel(ports: [number, number], drainMs: number) {
    const gw = await startGateway({
      ports,
      // 60 tokens a second: a 30-token answer streams for 0.5 s, long after the shutdown begins.
      env: { SIM_LOAD_DELAY_MS: '100', SIM_TOKENS_PER_SEC: '60' },
      drainMs,
    })
    started.push(gw)
    const id = await gw.load({
      model_path: 'facebook/opt-125m',
      gpu_memory_utilization: 0.2,
      served_model_name: 'opt',
    })
    const model = await gw.waitStatus(id, 'active')
    return { gw, pid: model.process_id as number }
  }

  /** stream starts a streamed chat; resolves once its first chunk has arrived, with the rest to come. */
  async function stream(url: string, maxTokens: number) {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'opt',
        messages: [{ role: 'user', content: 'count' }],
        max_tokens: maxTokens,
        ignore_eos: true,
        stream: true,
      }),
    })
    expect(res.status).toBe(200)
    const reader = res.body!.getReader()
    const decoder = new TextDecoder()
    let text = decoder.decode((await reader.read()).value, { stream: true })
    const rest = (async () => {
      try {
        for (;;) {
          const { value, done } = await reader.read()
          if (done) return { text, cut: false }
          text += decoder.decode(value, { stream: true })
        }
      } catch {
        return { text, cut: true }
      }
    })()
    return { rest }
  }

  const tokens = (text: string) => text.split('\n').filter((l) => l.startsWith('data: {')).length

  it('lets a running stream finish, refuses new connections, then stops the engine', async () => {
    const { gw, pid } = await activeModel([27140, 27149], 10_000)
    const { rest: running } = await stream(gw.url, 30)
    const stopping = gw.host.shutdown('SIGTERM')
    // The listener no longer accepts while the stream drains.
    await expect(fetch(`${gw.url}/api/health`)).rejects.toThrow()
    const { text, cut } = await running
    expect(cut).toBe(false)
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true)
    // Every token arrived: 30 content chunks plus the role and the final chunk of the stream.
    expect(tokens(text)).toBeGreaterThanOrEqual(30)
    await stopping
    expect(groupGone(pid)).toBe(true)
    expect(gw.logs.some((l) => l.includes('draining running requests'))).toBe(true)
  }, 60_000)

  it('cuts what still runs when drain_ms is spent, and still stops the engine', async () => {
    const { gw, pid } = await activeModel([27150, 27159], 300)
    // 2000 tokens at 60/s would take 33 s: the drain gives up after 300 ms.
    const { rest: running } = await stream(gw.url, 2000)
    await gw.host.shutdown('SIGTERM')
    const { text } = await running
    // Cut short: the stream ends with the proxy's error event (and [DONE], as a broken stream does).
    expect(tokens(text)).toBeLessThan(2000)
    expect(text).toContain('"error"')
    expect(groupGone(pid)).toBe(true)
    expect(gw.logs.some((l) => l.includes('drain ended with requests still running'))).toBe(true)
  }, 60_000)
})
