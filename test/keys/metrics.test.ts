import { describe, expect, it } from 'bun:test'
import { Registry } from 'prom-client'
import { KeyMetrics, MAX_NAMED } from '../../src/http/keys/metrics.ts'

/** lines: the exposition lines of `metric` on the registry. */
async function lines(registry: Registry, metric: string): Promise<string[]> {
  return (await registry.metrics()).split('\n').filter((l) => l.startsWith(`${metric}{`))
}

describe('key metrics', () => {
  it('count requests, tokens and refusals by key name', async () => {
    const registry = new Registry()
    const m = new KeyMetrics(registry, () => 2)
    m.ended('team-a', false, 10, 5)
    m.ended('team-a', true, 3, 0)
    m.refused('team-a', 'requests')
    m.refused('unknown', 'invalid_key')
    expect(await lines(registry, 'modelgate_key_requests_total')).toEqual([
      'modelgate_key_requests_total{key="team-a",outcome="ok"} 1',
      'modelgate_key_requests_total{key="team-a",outcome="error"} 1',
    ])
    expect(await lines(registry, 'modelgate_key_tokens_total')).toContain(
      'modelgate_key_tokens_total{key="team-a",type="prompt"} 13',
    )
    expect(await lines(registry, 'modelgate_key_refusals_total')).toEqual([
      'modelgate_key_refusals_total{key="team-a",reason="requests"} 1',
      'modelgate_key_refusals_total{key="unknown",reason="invalid_key"} 1',
    ])
    expect((await registry.metrics()).split('\n')).toContain('modelgate_inference_keys 2')
  })

  it(`keep at most ${MAX_NAMED} key names; later ones count as "other"`, async () => {
    const registry = new Registry()
    const m = new KeyMetrics(registry, () => 0)
    for (let i = 0; i < 1000; i++) m.ended(`key-${i}`, false, 1, 1)
    const keys = new Set(
      (await lines(registry, 'modelgate_key_requests_total')).map((l) => /key="([^"]+)"/.exec(l)![1]),
    )
    expect(keys.size).toBe(MAX_NAMED + 1)
    expect(keys.has('other')).toBe(true)
    expect(await lines(registry, 'modelgate_key_requests_total')).toContain(
      `modelgate_key_requests_total{key="other",outcome="ok"} ${1000 - MAX_NAMED}`,
    )
  })
})
