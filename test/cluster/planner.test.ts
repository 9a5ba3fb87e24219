import { describe, expect, it } from 'bun:test'
import {
  type Need,
  type PlanEntry,
  type PlanPod,
  planPreset,
} from '../../plugins/cluster/placement/planner.ts'

/** The preset planner alone: a pure function of the preset and the pods' GPUs and instances. */
const H100 = 'NVIDIA H100 80GB HBM3'
const gpu = (index: number, freeGib: number, totalGib = 80) => ({ index, name: H100, totalGib, freeGib })
const entry = (modelPath: string, over: Partial<PlanEntry> = {}): PlanEntry => ({
  modelPath,
  servedModelName: modelPath,
  maxTokens: null,
  gpuIds: [],
  tensorParallelSize: 1,
  gpuMemoryUtilization: null,
  loadOrder: 0,
  enableSleepMode: false,
  extraArgs: [],
  engineKind: null,
  ...over,
})
/** need: every model needs `gib` per GPU (30 unless named in `sizes`). */
const need =
  (sizes: Record<string, number> = {}): Need =>
  (e) => ({ gib: sizes[e.modelPath] ?? 30, source: 'test size' })
const pod = (podId: string, gpus: PlanPod['gpus'], instances: PlanPod['instances'] = []): PlanPod => ({
  podId,
  gpus,
  instances,
})

describe('the preset planner', () => {
  it('places on the tightest fit across pods, and keeps big holes for later entries', () => {
    const pods = [pod('a', [gpu(0, 80), gpu(1, 35)]), pod('b', [gpu(0, 50)])]
    const plan = planPreset(
      'p',
      [entry('small', { loadOrder: 0 }), entry('big', { loadOrder: 1 })],
      pods,
      need({ big: 70 }),
    )
    expect(plan.placed.map((p) => [p.modelPath, p.podId, p.gpuIds])).toEqual([
      ['small', 'a', [1]],
      ['big', 'a', [0]],
    ])
    expect(plan.unplaceable).toEqual([])
    expect(plan.placed[0]!.reason).toContain('GPU 1 35.0 GiB free')
    expect(plan.placed[0]!.reason).toContain('needs 30.0 GiB per GPU (test size)')
  })

  it('reports what does not fit with the most free GPUs, after earlier entries took their room', () => {
    const plan = planPreset(
      'p',
      [entry('one'), entry('two', { loadOrder: 1 })],
      [pod('a', [gpu(0, 40)])],
      need(),
    )
    expect(plan.placed.map((p) => p.modelPath)).toEqual(['one'])
    expect(plan.unplaceable).toEqual([
      {
        modelPath: 'two',
        servedModelName: 'two',
        reason:
          'needs 1 GPU(s) on one pod with 30.0 GiB free each (test size); the most free: pod a GPU 0 10.0 GiB',
      },
    ])
  })

  it("keeps the preset's gpuIds on the first pod where they have room, else places automatically and says so", () => {
    const pods = [pod('a', [gpu(0, 10), gpu(1, 80)]), pod('b', [gpu(0, 80), gpu(1, 80)])]
    const plan = planPreset(
      'p',
      [entry('m', { gpuIds: [0] }), entry('n', { gpuIds: [5], loadOrder: 1 })],
      pods,
      need(),
    )
    expect(plan.placed[0]).toMatchObject({ podId: 'b', gpuIds: [0] })
    expect(plan.placed[0]!.reason).toStartWith("the preset's GPU 0: pod b")
    expect(plan.placed[1]!.reason).toStartWith('GPU 5 of the preset have no room on any pod; best fit:')
  })

  it('places tensor parallelism on one pod only', () => {
    const pods = [pod('a', [gpu(0, 80), gpu(1, 10)]), pod('b', [gpu(0, 40), gpu(1, 40)])]
    const plan = planPreset('p', [entry('tp2', { tensorParallelSize: 2 })], pods, need())
    expect(plan.placed.map((p) => [p.podId, p.gpuIds])).toEqual([['b', [0, 1]]])
  })

  it('keeps what already runs, unloads the rest and counts its memory as free', () => {
    const pods = [
      pod(
        'a',
        [gpu(0, 5), gpu(1, 5)],
        [
          {
            instanceId: 'i1',
            modelPath: 'keep',
            servedModelName: 'keep',
            gpuIds: [0],
            status: 'active',
            engineKind: 'vllm',
            footprintGib: { '0': 70 },
          },
          {
            instanceId: 'i2',
            modelPath: 'old',
            servedModelName: 'old',
            gpuIds: [1],
            status: 'sleeping',
            engineKind: 'vllm',
            footprintGib: { '1': 70 },
          },
        ],
      ),
    ]
    const plan = planPreset('mine', [entry('keep'), entry('new', { loadOrder: 1 })], pods, need())
    expect(plan.placed.map((p) => [p.modelPath, p.action, p.podId, p.gpuIds])).toEqual([
      ['keep', 'keep', 'a', [0]],
      ['new', 'load', 'a', [1]],
    ])
    expect(plan.unloaded).toEqual([
      { modelPath: 'old', podId: 'a', instanceId: 'i2', reason: "not in preset 'mine'" },
    ])
  })

  it('replaces an instance that runs another engine than its entry names; an entry naming none keeps it', () => {
    const running = (engineKind: 'vllm' | 'sglang') =>
      pod(
        'a',
        [gpu(0, 5), gpu(1, 75)],
        [
          {
            instanceId: 'i1',
            modelPath: 'm',
            servedModelName: 'm',
            gpuIds: [0],
            status: 'active',
            engineKind,
            footprintGib: { '0': 70 },
          },
        ],
      )
    const wanted = planPreset('p', [entry('m', { engineKind: 'sglang' })], [running('vllm')], need())
    expect(wanted.unloaded.map((u) => u.instanceId)).toEqual(['i1'])
    expect(wanted.placed.map((p) => [p.action, p.entry.engineKind])).toEqual([['load', 'sglang']])
    const same = planPreset('p', [entry('m', { engineKind: 'sglang' })], [running('sglang')], need())
    expect(same.placed.map((p) => [p.action, p.instanceId])).toEqual([['keep', 'i1']])
    const any = planPreset('p', [entry('m')], [running('vllm')], need())
    expect([any.placed.map((p) => p.action), any.unloaded]).toEqual([['keep'], []])
  })

  it('gives the same plan for the same state, whatever order the pods and GPUs come in', () => {
    const a = pod('a', [gpu(1, 60), gpu(0, 60)])
    const b = pod('b', [gpu(0, 60)])
    const entries = [entry('x', { loadOrder: 2 }), entry('y', { loadOrder: 1 }), entry('z', { loadOrder: 3 })]
    const one = planPreset('p', entries, [a, b], need())
    const two = planPreset('p', [...entries].reverse(), [b, { ...a, gpus: [...a.gpus].reverse() }], need())
    expect(JSON.stringify(two)).toBe(JSON.stringify(one))
    expect(one.placed.map((p) => p.modelPath)).toEqual(['y', 'x', 'z'])
  })

  it('says so when no pod reports a GPU', () => {
    const plan = planPreset('p', [entry('m')], [pod('a', [])], need())
    expect(plan.unplaceable[0]!.reason).toBe('no healthy pod reports a GPU')
  })
})
