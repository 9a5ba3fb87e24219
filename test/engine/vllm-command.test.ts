import { describe, expect, it } from 'bun:test'
import { findFlagValue, hasFlag, quoteCommand, removeFlag } from '../../src/engine/argv.ts'
import { buildEngineEnv, buildVllmArgs, parseHumanInt } from '../../src/engine/vllm-command.ts'

describe('buildVllmArgs', () => {
  it('puts the model first and every option in a fixed order', () => {
    expect(
      buildVllmArgs({
        modelPath: 'Qwen/Qwen2.5-7B-Instruct',
        port: 8001,
        host: '127.0.0.1',
        servedModelName: ['qwen', 'qwen-7b'],
        maxModelLen: 32768,
        gpuMemoryUtilization: 0.9,
        tensorParallelSize: 2,
        enableSleepMode: true,
        extraArgs: ['--enforce-eager'],
      }),
    ).toEqual([
      'Qwen/Qwen2.5-7B-Instruct',
      '--port',
      '8001',
      '--host',
      '127.0.0.1',
      '--served-model-name',
      'qwen',
      'qwen-7b',
      '--max-model-len',
      '32768',
      '--gpu-memory-utilization',
      '0.9',
      '--tensor-parallel-size',
      '2',
      '--enable-sleep-mode',
      '--enforce-eager',
    ])
  })

  it('leaves out what was not asked for', () => {
    expect(
      buildVllmArgs({ modelPath: '/models/m', port: 9000, servedModelName: [], tensorParallelSize: 1 }),
    ).toEqual(['/models/m', '--port', '9000'])
    expect(buildVllmArgs({ modelPath: 'm', port: 1, servedModelName: 'only' })).toEqual([
      'm',
      '--port',
      '1',
      '--served-model-name',
      'only',
    ])
  })

  it('never passes --gpu-memory-utilization to a shared-cache engine', () => {
    const args = buildVllmArgs({ modelPath: 'm', port: 1, gpuMemoryUtilization: 0.5, sharedCache: true })
    expect(args).not.toContain('--gpu-memory-utilization')
  })
})

describe('buildEngineEnv', () => {
  it('pins the GPUs by integer index in PCI order', () => {
    expect(buildEngineEnv({ gpuIds: [2, 3] })).toEqual({
      CUDA_VISIBLE_DEVICES: '2,3',
      CUDA_DEVICE_ORDER: 'PCI_BUS_ID',
    })
  })

  it('enables the sleep endpoints with dev mode', () => {
    expect(buildEngineEnv({ gpuIds: [0], enableSleepMode: true }).VLLM_SERVER_DEV_MODE).toBe('1')
    expect(buildEngineEnv({ gpuIds: [0] }).VLLM_SERVER_DEV_MODE).toBeUndefined()
  })

  it("gives a shared-cache engine the segment name it is given, and kvcached's own default without one", () => {
    expect(
      buildEngineEnv({ gpuIds: [0], sharedCache: true, sharedCacheName: 'modelgate_opt-1a2b3c' }),
    ).toEqual({
      CUDA_VISIBLE_DEVICES: '0',
      CUDA_DEVICE_ORDER: 'PCI_BUS_ID',
      ENABLE_KVCACHED: 'true',
      KVCACHED_AUTOPATCH: '1',
      KVCACHED_IPC_NAME: 'modelgate_opt-1a2b3c',
    })
    // kvcached keeps one segment per engine: no name shared by a GPU set is ever made up.
    expect(buildEngineEnv({ gpuIds: [1, 0], sharedCache: true }).KVCACHED_IPC_NAME).toBeUndefined()
    expect(buildEngineEnv({ gpuIds: [0], sharedCacheName: 'x' }).KVCACHED_IPC_NAME).toBeUndefined()
  })
})

describe('parseHumanInt', () => {
  it('reads suffixes like vLLM', () => {
    expect(parseHumanInt('32k')).toBe(32_000)
    expect(parseHumanInt('32K')).toBe(32_768)
    expect(parseHumanInt('25.6k')).toBe(25_600)
    expect(parseHumanInt('1m')).toBe(1_000_000)
    expect(parseHumanInt('1M')).toBe(1_048_576)
    expect(parseHumanInt('2g')).toBe(2_000_000_000)
    expect(parseHumanInt(' 4096 ')).toBe(4096)
    expect(parseHumanInt('-1')).toBe(-1)
  })

  it('rejects what vLLM rejects', () => {
    for (const bad of ['1.5K', 'abc', '', '32kb', '1.5', 'k']) expect(parseHumanInt(bad)).toBeNull()
  })
})

describe('quoteCommand', () => {
  it('quotes only what the shell would misread', () => {
    expect(quoteCommand(['vllm', 'serve', 'Qwen/Qwen2.5-7B', '--port', '8000'])).toBe(
      'vllm serve Qwen/Qwen2.5-7B --port 8000',
    )
    expect(quoteCommand(['--chat-template', "it's {{ x }}", ''])).toBe(
      `--chat-template 'it'\\''s {{ x }}' ''`,
    )
    expect(quoteCommand(['--override-generation-config', '{"temperature":0.5}'])).toBe(
      `--override-generation-config '{"temperature":0.5}'`,
    )
  })
})

describe('flags in extra args', () => {
  const extra = ['--enforce-eager', '--max-model-len', '8k', '--max_num_seqs=64', '-tp', '2', '--seed', '-1']

  it('finds a flag in both the spaced and the = form, with dashes or underscores', () => {
    expect(findFlagValue(extra, '--max-model-len')).toBe('8k')
    expect(findFlagValue(extra, '--max-num-seqs')).toBe('64')
    expect(findFlagValue(extra, '--tensor-parallel-size', { aliases: ['-tp'] })).toBe('2')
    expect(findFlagValue(extra, '--seed')).toBe('-1')
    expect(findFlagValue(extra, '--enforce-eager', { takesValue: false })).toBe('')
    expect(findFlagValue(extra, '--gpu-memory-utilization')).toBeUndefined()
  })

  it('lets the last occurrence win', () => {
    expect(findFlagValue(['--max-model-len=1000', '--max-model-len', '2000'], '--max-model-len')).toBe('2000')
  })

  it('stops at -- and does not take a following flag as a value', () => {
    expect(findFlagValue(['--', '--max-model-len', '5'], '--max-model-len')).toBeUndefined()
    expect(findFlagValue(['--trust-remote-code', '--seed', '1'], '--trust-remote-code')).toBe('')
  })

  it('tells whether a flag is present', () => {
    expect(hasFlag(extra, '--enforce-eager')).toBe(true)
    expect(hasFlag(extra, '--tensor-parallel-size', { aliases: ['-tp'] })).toBe(true)
    expect(hasFlag(extra, '--port')).toBe(false)
  })

  it('removes a flag with its value so the gateway can set its own', () => {
    expect(removeFlag(extra, '--max-model-len')).toEqual([
      '--enforce-eager',
      '--max_num_seqs=64',
      '-tp',
      '2',
      '--seed',
      '-1',
    ])
    expect(removeFlag(extra, '--tensor-parallel-size', { aliases: ['-tp'] })).not.toContain('-tp')
    expect(removeFlag(['--enforce-eager', 'x'], '--enforce-eager', { takesValue: false })).toEqual(['x'])
  })
})
