/**
 * chatLoops: `loops` clients each sending the same small chat to `url`'s /v1 back to back until
 * stopped, every failure kept with its answer (status and the start of the body, or the error), for
 * tests that must show no request failed while something happened to the cluster.
 */
export interface ChatLoops {
  readonly ok: number
  stop(): Promise<{ ok: number; failures: string[] }>
}

export function chatLoops(url: string, o: { key: string; model: string; loops: number }): ChatLoops {
  const state = { ok: 0, failures: [] as string[], running: true }
  const body = JSON.stringify({ model: o.model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 })
  const loop = async () => {
    while (state.running) {
      try {
        const r = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${o.key}`, 'content-type': 'application/json' },
          body,
          signal: AbortSignal.timeout(15_000),
        })
        const text = await r.text()
        let content = ''
        try {
          content =
            (JSON.parse(text) as { choices: { message: { content: string } }[] }).choices[0]?.message
              .content ?? ''
        } catch {}
        if (r.status === 200 && content.length > 0) state.ok++
        else state.failures.push(`${r.status} ${text.slice(0, 300)}`)
      } catch (err) {
        state.failures.push(String(err))
      }
    }
  }
  const running = Array.from({ length: o.loops }, loop)
  return {
    get ok() {
      return state.ok
    },
    async stop() {
      state.running = false
      await Promise.all(running)
      return { ok: state.ok, failures: state.failures }
    },
  }
}
