import { describe, expect, it } from 'bun:test'
import { visibleDevices } from '../../src/sim/devices.ts'
import { freeMemoryError } from '../../src/sim/engine-logs.ts'
import { parseGpuSpec } from '../../src/sim/gpus.ts'
import { kvCacheError, planMemory, pyRound } from '../../src/sim/memory-plan.ts'
import { lookupModel, paramsFromName, weightsGiB } from '../../src/sim/models.ts'
import { extractSimFlags } from '../../src/sim/sim-flags.ts'
import { SleepState } from '../../src/sim/sleep-state.ts'
import { FakeTokenizer, renderChat, WORDS, wordId } from '../../src/sim/tokenizer.ts'
import { NEWEST_PROFILE, resolveProfile } from '../../src/sim/versions.ts'
import { humanReadableInt, parseVllmArgs } from '../../src/sim/vllm-args.ts'

describe('vllm serve argument parsing', () => {
  it('reads the flags the gateway passes, in both --flag value and --flag=value forms', () => {
    const a = parseVllmArgs([
      'Qwen/Qwen2.5-7B-Instruct',
      '--port=8001',
      '--served-model-name',
      'qwen',
      'qwen-7b',
      '--gpu-memory-utilization',
      '0.45',
      '--max-model-len=32k',
      '-tp',
      '2',
      '--enable-sleep-mode',
      '--enforce-eager',
      '--dtype',
      'bfloat16',
      '--trust-remote-code',
    ])
    expect(a.model).toBe('Qwen/Qwen2.5-7B-Instruct')
    expect(a.port).toBe(8001)
    expect(a.servedModelNames).toEqual(['qwen', 'qwen-7b'])
    expect(a.gpuMemoryUtilization).toBe(0.45)
    expect(a.maxModelLen).toBe(32000)
    expect(a.tensorParallelSize).toBe(2)
    expect(a.enableSleepMode).toBe(true)
    expect(a.host).toBe('127.0.0.1')
  })

  it('parses human-readable ints like vLLM (k=1000, K=1024)', () => {
    expect(humanReadableInt('32k')).toBe(32000)
    expect(humanReadableInt('32K')).toBe(32768)
    expect(humanReadableInt('1.5k')).toBe(1500)
    expect(humanReadableInt('1M')).toBe(1048576)
    expect(humanReadableInt('4096')).toBe(4096)
    expect(() => humanReadableInt('1.5K')).toThrow(/Decimals are not allowed/)
    expect(() => humanReadableInt('abc')).toThrow()
  })

  it('accepts underscores, unknown valued flags and the --model form', () => {
    const a = parseVllmArgs([
      '--model',
      'm',
      '--max_model_len',
      '2048',
      '--some-flag',
      'x',
      '--tensor-parallel-size=1',
    ])
    expect(a.model).toBe('m')
    expect(a.maxModelLen).toBe(2048)
    expect(a.servedModelNames).toEqual(['m'])
  })

  it('pulls --sim-dir and --sim-gpus out of argv wherever they are', () => {
    const f = extractSimFlags(['m', '--sim-dir', '/x', '--port', '1', '--sim-gpus=1x24'])
    expect(f).toEqual({ simDir: '/x', gpuSpec: '1x24', rest: ['m', '--port', '1'] })
  })
})

describe('simulated GPUs and models', () => {
  it('expands shorthands and NAME:MIB entries with stable uuids', () => {
    const gpus = parseGpuSpec('2x80,NVIDIA L4:23034', '/d')
    expect(gpus.map((g) => [g.index, g.name, g.totalMib])).toEqual([
      [0, 'NVIDIA H100 80GB HBM3', 81559],
      [1, 'NVIDIA H100 80GB HBM3', 81559],
      [2, 'NVIDIA L4', 23034],
    ])
    expect(gpus[0]?.uuid).toMatch(/^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/)
    expect(parseGpuSpec('2x80', '/d')[1]?.uuid).toBe(gpus[1]?.uuid as string)
    expect(parseGpuSpec('2x80', '/other')[1]?.uuid).not.toBe(gpus[1]?.uuid as string)
    expect(() => parseGpuSpec('2x99', '/d')).toThrow()
  })

  it('guesses parameter counts from unknown names', () => {
    expect(paramsFromName('org/Qwen2.5-7B-Instruct')).toBe(7)
    expect(paramsFromName('llama-13b')).toBe(13)
    expect(paramsFromName('foo-1.5B')).toBe(1.5)
    expect(paramsFromName('x-125m')).toBe(0.125)
    expect(lookupModel('my/unknown-model').paramsB).toBe(7)
    expect(weightsGiB(lookupModel('Qwen/Qwen2.5-7B-Instruct'))).toBeCloseTo(14.19, 1)
  })

  it('plans memory so that the parts add up to the budget', () => {
    const plan = planMemory(lookupModel('Qwen/Qwen2.5-7B-Instruct'), 81559, 0.9, 1, 32768)
    const parts = plan.weightsGiB + plan.graphsGiB + plan.activationGiB + plan.nonTorchGiB + plan.kvAvailGiB
    expect(parts).toBeCloseTo(plan.budgetGiB, 6)
    expect(plan.kvTokens % 16).toBe(0)
    expect(plan.concurrency).toBeGreaterThan(1)
    const tight = planMemory(lookupModel('meta-llama/Llama-3.1-70B-Instruct'), 81559, 0.9, 1, 131072)
    expect(kvCacheError(tight)).toMatch(/No available memory for the cache blocks/)
  })

  it('formats the free-memory error like vLLM (Python rounding)', () => {
    expect(freeMemoryError(7.6, 79.647, 0.9, 71.68)).toBe(
      'ValueError: Free memory on device (7.6/79.65 GiB) on startup is less than desired GPU memory utilization (0.9, 71.68 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.',
    )
    expect(pyRound(3)).toBe('3.0')
  })

  it('resolves CUDA_VISIBLE_DEVICES with CUDA rules', () => {
    expect(visibleDevices(undefined, 2)).toEqual({ ok: true, gpus: [0, 1] })
    expect(visibleDevices('1', 2)).toEqual({ ok: true, gpus: [1] })
    expect(visibleDevices('1,5,0', 2)).toEqual({ ok: true, gpus: [1] })
    expect(visibleDevices('', 2).ok).toBe(false)
    expect(visibleDevices('GPU-abc', 2)).toEqual({
      ok: false,
      error: "ValueError: invalid literal for int() with base 10: 'GPU-abc'",
    })
  })
})

describe('fake tokenizer', () => {
  it('is reversible for single-spaced text and stable across instances', () => {
    const text = 'the quick model streams tokens over the gateway'
    const a = new FakeTokenizer()
    const ids = a.encode(text)
    expect(ids.length).toBe(8)
    expect(a.decode(ids)).toBe(text)
    expect(new FakeTokenizer().encode(text)).toEqual(ids)
    expect(new FakeTokenizer().decode(a.encode(WORDS.slice(0, 5).join(' ')))).toBe(
      WORDS.slice(0, 5).join(' '),
    )
  })

  it('gives every output word its own id', () => {
    expect(new Set(WORDS.map(wordId)).size).toBe(WORDS.length)
  })

  it('splits chat special markers into their own tokens', () => {
    const t = new FakeTokenizer()
    const text = renderChat([{ role: 'user', content: 'hello there' }])
    expect(text).toBe('<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n')
    expect(t.encode(text)).toEqual([
      151644,
      wordId('user'),
      wordId('hello'),
      wordId('there'),
      151645,
      151644,
      wordId('assistant'),
    ])
  })
})

describe('sleep state', () => {
  it('keeps a residual per level and restores parts by tag', () => {
    const s = new SleepState()
    s.sleep(1)
    expect(s.footprintMib(10000, 3000)).toBe(1000)
    s.wake(['weights'])
    expect(s.sleeping).toBe(true)
    expect(s.footprintMib(10000, 3000)).toBe(4000)
    let woke = false
    s.whenAwake(() => {
      woke = true
    })
    s.wake(['kv_cache'])
    expect(woke).toBe(true)
    expect(s.footprintMib(10000, 3000)).toBe(10000)
    s.sleep(2)
    expect(s.footprintMib(10000, 3000)).toBe(500)
  })
})

describe('vLLM release profiles', () => {
  it('picks the newest profile not newer than the version asked for, and reports that version', () => {
    expect(resolveProfile(undefined, undefined)).toBe(NEWEST_PROFILE)
    expect(resolveProfile(undefined, 'v0')).toMatchObject({ version: '0.8.5', engine: 'v0' })
    expect(resolveProfile('0.15.1', undefined)).toMatchObject({
      version: '0.15.1',
      sleepKeepsWeights: true,
      sleepModes: false,
      freeMemoryDeviceName: true,
    })
    expect(resolveProfile('0.11.0', 'v0')).toMatchObject({
      version: '0.11.0',
      engine: 'v1',
      coreTag: 'EngineCore_DP0',
    })
    expect(resolveProfile('0.7.3', undefined)).toMatchObject({ version: '0.7.3', engine: 'v0' })
    expect(resolveProfile('v0.30.1', undefined)).toMatchObject({
      version: '0.30.1',
      mergedKvLine: true,
      sleepModes: true,
    })
    expect(resolveProfile('nightly', undefined)).toBe(NEWEST_PROFILE)
  })

  it('places each boundary at the release whose source has it (v0.10.2–v0.20.2 tags)', () => {
    expect(resolveProfile('0.16.1', undefined).sleepModes).toBe(false)
    expect(resolveProfile('0.17.0', undefined).sleepModes).toBe(true)
    expect(resolveProfile('0.11.0', undefined).sleepStateMetric).toBe(false)
    expect(resolveProfile('0.11.1', undefined).sleepStateMetric).toBe(true)
    expect(resolveProfile('0.10.2', undefined)).toMatchObject({ engine: 'v1', startupMemoryDebug: false })
    for (const v of ['0.11.0', '0.14.0', '0.20.2'])
      expect(resolveProfile(v, undefined).startupMemoryDebug).toBe(true)
    expect(resolveProfile('0.29.0', undefined).startupMemoryDebug).toBe(false)
  })

  it("has current builds' sleep surface from 0.30.0 only, in place of the old gauge; unset still runs 0.29.0", () => {
    expect(resolveProfile('0.29.9', undefined)).toMatchObject({
      sleepComponents: false,
      sleepStateMetric: true,
    })
    expect(resolveProfile('0.30.0', undefined)).toMatchObject({
      sleepComponents: true,
      sleepStateMetric: false,
    })
    expect(resolveProfile('0.31.2', undefined)).toMatchObject({ version: '0.31.2', sleepComponents: true })
    expect(resolveProfile(undefined, undefined).version).toBe('0.29.0')
  })
})

describe('what a sleep frees', () => {
  it('keeps the weights when the release frees only the KV cache, and everything without sleep mode', () => {
    const kv = new SleepState()
    kv.sleep(2, 'kv_cache')
    expect(kv.footprintMib(10000, 3000)).toBe(3500)
    expect(kv.weightsValid).toBe(true)
    expect(kv.weightsReleased).toBe(false)
    const none = new SleepState()
    none.sleep(1, 'nothing')
    expect(none.footprintMib(10000, 3000)).toBe(10000)
    expect(none.blocksInference).toBe(false)
    expect(none.sleeping).toBe(true)
    const all = new SleepState()
    all.sleep(2)
    expect(all.weightsValid).toBe(false)
    expect(all.weightsReleased).toBe(true)
    all.wake(['weights'])
    expect(all.weightsReleased).toBe(false)
    expect(all.weightsValid).toBe(false)
  })
})
