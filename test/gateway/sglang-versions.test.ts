import { afterEach, describe, expect, it } from 'bun:test'
import type { MemoryMetrics } from '../../plugins/gateway/api.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * SGLang's start-up lines as each release prints them (the simulator's SIM_SGLANG_VERSION: current
 * builds by default, the older 0.5.6 lines when asked), read by a real gateway from a real `sim sglang`
 * load: the instance's memory figures and the memory profile recorded when it became active are the
 * ones its log lines give, whichever wording they came in.
 */
const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
type Profile = Record<string, unknown>

let gw: TestGateway | undefined
afterEach(() => gw?.stop())

const VERSIONS = [
  { knob: undefined, name: 'current builds (unset)', ports: [27500, 27509] as [number, number] },
  { knob: '0.5.18', name: '0.5.18', ports: [27510, 27519] as [number, number] },
  { knob: '0.5.6', name: 'the older 0.5.6', ports: [27520, 27529] as [number, number] },
]

describe('an SGLang load, at each simulated release', () => {
  for (const v of VERSIONS) {
    it(`takes its memory figures and profile from ${v.name}'s lines`, async () => {
      gw = await startGateway({ ports: v.ports, env: v.knob ? { SIM_SGLANG_VERSION: v.knob } : {} })
      const id = await gw.load({
        model_path: MODEL,
        engine_kind: 'sglang',
        gpu_ids: [0],
        gpu_memory_utilization: 0.5,
      })
      const rec = await gw.waitStatus(id, 'active')
      const text = (await gw.json<{ logs: string }>(`/api/v1/models/instances/${id}/logs?lines=500`)).body
        .logs
      const current = v.knob !== '0.5.6'

      const kv = (
        current
          ? /KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB/
          : /KV Cache is allocated\. #tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB/
      ).exec(text)
      expect(kv).not.toBeNull()
      const weights = /Load weight end\..*mem usage=([\d.]+) GB\./.exec(text)!
      const graphs = [
        ...text.matchAll(
          current
            ? /Capture target \w+ CUDA graph end\. elapsed=[\d.]+ s, mem usage=([\d.]+) GB/g
            : /Capture cuda graph end\. Time elapsed: [\d.]+ s\. mem usage=([\d.]+) GB/g,
        ),
      ].map((g) => Number(g[1]))
      expect(graphs).toHaveLength(current ? 2 : 1)
      expect(/Engine startup timings \(s\): load_weight=[\d.]+, .*tokenizer_e2e=[\d.]+/.test(text)).toBe(
        current,
      )
      const begin = Number(/Load weight begin\. avail mem=([\d.]+) GB/.exec(text)![1])
      const end = Number(/available_gpu_mem=([\d.]+) GB/.exec(text)![1])

      const m = rec.memory_metrics as MemoryMetrics
      const kvGib = Number(kv![2]) + Number(kv![3])
      expect(m.kv_cache_available_gib).toBeCloseTo(kvGib, 4)
      expect(m.weights_memory_gib).toBe(Number(weights[1]))
      expect(m.cuda_graph_memory_gib).toBeCloseTo(
        graphs.reduce((a, b) => a + b, 0),
        4,
      )
      expect(m.cuda_graph_memory_gib).toBeGreaterThan(0)
      expect(m.total_gpu_memory_gib).toBeCloseTo(begin - end, 4)
      expect(m.kv_cache_per_request_mib).toBeCloseTo((kvGib * 1024) / (Number(kv![1]) / 32768), 2)

      const profile = await waitFor(
        'the auto memory profile of the SGLang load',
        async () =>
          (await gw!.json<{ profiles: Profile[] }>('/api/memory/profiles')).body.profiles.find(
            (p) => p.source === 'auto' && p.model_path === MODEL,
          ),
        { wake: (notify) => gw!.host.bus.on('gateway.instance.status', notify) },
      )
      expect(profile).toMatchObject({
        total_gpu_memory_gib: m.total_gpu_memory_gib,
        weights_memory_gib: m.weights_memory_gib,
        cuda_graphs_gib: m.cuda_graph_memory_gib,
        overhead_memory_gib: m.overhead_memory_gib,
        kv_cache_available_gib: m.kv_cache_available_gib,
        max_tokens: 32768,
      })
    }, 60_000)
  }
})
