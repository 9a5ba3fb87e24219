import { describe, expect, test } from 'bun:test'
import { resolve } from 'node:path'
import { publishedSeconds } from '../../src/engine/vllm-timing.ts'
import { lookupModel, weightsGiB } from '../../src/sim/models.ts'
import { replay, SLEEP_SECONDS } from '../perf/residency-replay.ts'

/**
 * The residency replay (test/perf/residency-replay.ts): the real ResidencyManager on a virtual
 * clock and a model of the engine. A hand-made trace whose every decision follows from the rules
 * (least recently used first, min_resident_seconds 60, vLLM's published durations), and the bench
 * run twice in two processes, byte for byte the same.
 */
const MODELS = [
  { name: 'alpha-8b', util: 0.45 },
  { name: 'bravo-7b', util: 0.45 },
  { name: 'charlie-14b', util: 0.7 },
  { name: 'delta-3b', util: 0.45 },
]
const w = (name: string) => weightsGiB(lookupModel(name))
const sleep1 = (name: string) => SLEEP_SECONDS(1, w(name))
const wake1 = (name: string) => publishedSeconds('wake1', w(name))
const load = (name: string) => publishedSeconds('load', w(name))

describe('residency replay', () => {
  test('the virtual clock drives the real manager: each decision of a ten-request trace, and when it came', async () => {
    // alpha and bravo share GPU 0 (36 GiB each of 79.6), charlie has GPU 1 (56 GiB); delta fits on
    // neither without a victim. lru-sleep: the least recently used sleeps at level 1.
    const trace = (
      [
        [0, 'alpha-8b'],
        [1, 'bravo-7b'],
        [2, 'charlie-14b'],
        [70, 'delta-3b'],
        [80, 'alpha-8b'],
        [85, 'bravo-7b'],
        [150, 'charlie-14b'],
        [160, 'alpha-8b'],
        [200, 'delta-3b'],
        [210, 'charlie-14b'],
      ] as const
    ).map(([at, model]) => ({ at, model }))
    const r = await replay('lru-sleep', trace, {
      models: MODELS,
      gpus: 2,
      preload: 3,
      residency: { min_resident_seconds: 60 },
    })
    expect(r.failed).toBe(0)
    const decisions = r.decisions.map((d) => ({
      at: (Date.parse(d.at) - r.startedAt) / 1000,
      trigger: `${d.trigger.kind} ${d.trigger.model} on ${d.trigger.gpu_ids.join(',')}`,
      victims: d.victims.map((v) => `${v.model}:${v.action}`),
    }))
    expect(decisions.map(({ trigger, victims }) => ({ trigger, victims }))).toEqual([
      // 70 s: delta loads where alpha (least recently used, 70 s ago) sleeps: GPU 0's victim wakes faster than charlie.
      { trigger: 'load delta-3b on 0', victims: ['alpha-8b:sleep1'] },
      // 80 s: alpha wakes; bravo (asked for at 1 s) is the least recently used left on GPU 0.
      { trigger: 'wake alpha-8b on 0', victims: ['bravo-7b:sleep1'] },
      // 85 s: bravo waits until alpha has been resident 60 s (delta is still loading), then alpha sleeps.
      { trigger: 'wake bravo-7b on 0', victims: ['alpha-8b:sleep1'] },
      // 160 s: alpha waits for delta's 60 s (bravo's are further off).
      { trigger: 'wake alpha-8b on 0', victims: ['delta-3b:sleep1'] },
      // 200 s: delta waits for bravo's 60 s (alpha woke at 172 s).
      { trigger: 'wake delta-3b on 0', victims: ['bravo-7b:sleep1'] },
    ])
    // When each request got its first token, in virtual seconds from the engine's durations alone.
    const ttft = r.requests.map((x) => x.ttft_s ?? Number.NaN)
    const alphaUp = 80 + sleep1('bravo-7b') + wake1('alpha-8b')
    const bravoUp = alphaUp + 60 + sleep1('alpha-8b') + wake1('bravo-7b')
    const deltaUp = 70 + sleep1('alpha-8b') + load('delta-3b')
    const expected = [
      0,
      0,
      0,
      deltaUp - 70,
      alphaUp - 80,
      bravoUp - 85,
      0,
      deltaUp + 60 + sleep1('delta-3b') + wake1('alpha-8b') - 160,
      bravoUp + 60 + sleep1('bravo-7b') + wake1('delta-3b') - 200,
      0,
    ]
    for (const [k, e] of expected.entries()) expect(Math.abs(ttft[k]! - e)).toBeLessThan(0.02)
    // And each decision at the moment the rules allow it: at the request, or at the victim's 60 s.
    const at = decisions.map((d) => d.at)
    const expectedAt = [70, 80, alphaUp + 60, deltaUp + 60, bravoUp + 60]
    for (const [k, e] of expectedAt.entries()) expect(Math.abs(at[k]! - e)).toBeLessThan(0.02)
    expect(r.counts).toMatchObject({ coldLoads: 1, wakes: 4, sleeps: 5, unloads: 0 })
  })

  test('bench:residency is deterministic: two runs print the same bytes', async () => {
    const run = async () => {
      const p = Bun.spawn(
        [
          process.execPath,
          resolve(import.meta.dir, '../perf/residency.ts'),
          '--seeds',
          '3,4',
          '--shapes',
          'shipped,burst',
          '--minutes',
          '8',
        ],
        { stdout: 'pipe', stderr: 'pipe' },
      )
      const [out, code] = await Promise.all([new Response(p.stdout).text(), p.exited])
      expect(code).toBe(0)
      return out
    }
    const [a, b] = await Promise.all([run(), run()])
    expect(a).toContain('### shipped seed 3')
    expect(a).toContain('| clairvoyant |')
    expect(b).toBe(a)
  })
})
