import { afterEach, describe, expect, it } from 'bun:test'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { VllmLogAccumulator } from '../../src/engine/vllm-log.ts'
import { waitFor } from '../support/wait.ts'
import {
  cleanupSims,
  groupAlive,
  runSmiCli,
  signalGroup,
  spawnEngine,
  tempSimDir,
  waitHealthy,
} from './helpers.ts'

afterEach(cleanupSims)

const MODEL = 'Qwen/Qwen2.5-7B-Instruct'

async function refused(port: number): Promise<boolean> {
  try {
    await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(300) })
    return false
  } catch {
    return true
  }
}

describe('sim engine start-up', () => {
  it('refuses connections while loading, then serves /health and prints vLLM start-up lines', async () => {
    const dir = tempSimDir()
    const e = await spawnEngine(MODEL, ['--max-model-len', '16k'], {
      MODELGATE_SIM_DIR: dir,
      SIM_LOAD_DELAY_MS: '600',
      SIM_VLLM_VERSION: '0.11.0',
    })
    await e.waitForOutput('Starting to load model')
    expect(await refused(e.port)).toBe(true)
    await waitHealthy(e)
    await e.waitForOutput('Application startup complete.')
    const out = e.stdout()
    const order = [
      'vLLM API server version 0.11.0',
      'Using max model len 16000',
      'max_seq_len=16000',
      'Loading weights took',
      'Model loading took 14.1934 GiB memory and',
      'Available KV cache memory:',
      'GPU KV cache size:',
      'Maximum concurrency for 16,000 tokens per request:',
      'Graph capturing finished in',
    ]
    let at = -1
    for (const text of order) {
      const i = out.indexOf(text)
      expect(i).toBeGreaterThan(at)
      at = i
    }
    expect(out).toMatch(
      new RegExp(
        `^\\(APIServer pid=${e.pid}\\) INFO \\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d \\[api_server.py:\\d+\\] vLLM API server`,
        'm',
      ),
    )
    expect(out).toMatch(/^\(EngineCore_DP0 pid=\d+\) INFO .* GPU KV cache size: [\d,]+ tokens$/m)
    expect(e.stderr()).toBe(
      `INFO:     Started server process [${e.pid}]\nINFO:     Waiting for application startup.\nINFO:     Application startup complete.\n`,
    )
    expect(out).not.toContain('Uvicorn running on')
  })

  it('records its footprint for the smi and removes it on SIGTERM, leaving no child behind', async () => {
    const dir = tempSimDir()
    const e = await spawnEngine(MODEL, ['--gpu-memory-utilization', '0.5'], {
      MODELGATE_SIM_DIR: dir,
      CUDA_VISIBLE_DEVICES: '1',
    })
    await waitHealthy(e)
    const smi = runSmiCli(['--query-gpu=index,memory.used', '--format=csv,noheader,nounits'], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(smi.stdout).toBe(`0, 4\n1, ${Math.floor(0.5 * 81559) + 4}\n`)
    // The memory is held by the engine core child (in the engine's process group), not by `vllm serve`.
    const corePid = Number(/\(EngineCore pid=(\d+)\)/.exec(e.stdout())?.[1])
    expect(corePid).not.toBe(e.pid)
    const apps = runSmiCli(['--query-compute-apps=pid,process_name', '--format=csv,noheader,nounits'], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(apps.stdout).toBe(`${corePid}, VLLM::EngineCore\n`)
    expect(existsSync(join(dir, 'engines', `${e.pid}.json`))).toBe(true)
    signalGroup(e.pid, 'SIGTERM')
    expect(await e.exited).toBe(0)
    expect(existsSync(join(dir, 'engines', `${e.pid}.json`))).toBe(false)
    expect(e.stderr()).toContain('INFO:     Shutting down')
    expect(e.stderr()).toContain(`INFO:     Finished server process [${e.pid}]`)
    await waitFor(`engine group ${e.pid} to be gone`, () => !groupAlive(e.pid), { timeoutMs: 2000 })
    expect(groupAlive(e.pid)).toBe(false)
  })

  it('kills its helper processes itself when only the leader gets SIGTERM', async () => {
    const e = await spawnEngine(MODEL, ['-tp', '2'], {
      MODELGATE_SIM_DIR: tempSimDir(),
      SIM_VLLM_VERSION: '0.11.0',
    })
    await waitHealthy(e)
    expect(e.stdout()).toMatch(/\(Worker_TP1 pid=\d+\) INFO .* Available KV cache memory: [\d.]+ GiB/)
    process.kill(e.pid, 'SIGTERM')
    expect(await e.exited).toBe(0)
    await waitFor(`engine group ${e.pid} to be gone`, () => !groupAlive(e.pid), { timeoutMs: 2000 })
    expect(groupAlive(e.pid)).toBe(false)
  })

  it('fails the second engine on a full GPU with vLLM free-memory error', async () => {
    const dir = tempSimDir()
    const first = await spawnEngine(MODEL, [], { MODELGATE_SIM_DIR: dir, CUDA_VISIBLE_DEVICES: '0' })
    await waitHealthy(first)
    const second = await spawnEngine(MODEL, ['--gpu-memory-utilization=0.9'], {
      MODELGATE_SIM_DIR: dir,
      CUDA_VISIBLE_DEVICES: '0',
      SIM_VLLM_VERSION: '0.11.0',
    })
    expect(await second.exited).toBe(1)
    const free = ((81559 - Math.floor(0.9 * 81559) - 4) / 1024).toFixed(2)
    const line = `ValueError: Free memory on device (${free}/79.65 GiB) on startup is less than desired GPU memory utilization (0.9, 71.68 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.`
    expect(second.stderr()).toContain(line)
    expect(second.stdout()).toMatch(
      /\(EngineCore_DP0 pid=\d+\) ERROR \d\d-\d\d [\d:]+ \[core.py:\d+\] ValueError: Free memory on device/,
    )
    expect(await refused(second.port)).toBe(true)
  })

  it('rejects a max model len above the model limit', async () => {
    const e = await spawnEngine('facebook/opt-125m', ['--max-model-len', '4096'], {
      MODELGATE_SIM_DIR: tempSimDir(),
    })
    expect(await e.exited).toBe(1)
    expect(e.stderr()).toContain(
      'ValueError: User-specified max_model_len (4096) is greater than the derived max_model_len (max_position_embeddings=2048',
    )
  })

  it('fails on demand (SIM_FAIL_START) and when tensor parallelism exceeds the visible GPUs', async () => {
    const dir = tempSimDir()
    const failing = await spawnEngine(MODEL, [], { MODELGATE_SIM_DIR: dir, SIM_FAIL_START: 'boom at load' })
    const tooWide = await spawnEngine(MODEL, ['--tensor-parallel-size', '2'], {
      MODELGATE_SIM_DIR: dir,
      CUDA_VISIBLE_DEVICES: '1',
    })
    expect(await failing.exited).toBe(1)
    expect(failing.stdout()).toMatch(/ERROR .* RuntimeError: boom at load/)
    expect(failing.stderr()).toContain('RuntimeError: boom at load')
    expect(await tooWide.exited).toBe(1)
    expect(tooWide.stderr()).toContain('World size (2) is larger than the number of available GPUs (1)')
  })

  it('hangs without opening the port (SIM_HANG) and can ignore SIGTERM (SIM_HANG_ON_TERM)', async () => {
    const e = await spawnEngine(MODEL, [], {
      MODELGATE_SIM_DIR: tempSimDir(),
      SIM_HANG: '1',
      SIM_HANG_ON_TERM: '1',
    })
    await e.waitForOutput('Model loading took')
    // Absences, so each is watched for a while: an engine that went on would listen 100 ms after that
    // line (SIM_LOAD_DELAY_MS 200), and one that obeyed SIGTERM would exit at once.
    await Bun.sleep(300)
    expect(await refused(e.port)).toBe(true)
    signalGroup(e.pid, 'SIGTERM')
    await Bun.sleep(300)
    expect(e.proc.exitCode).toBeNull()
    signalGroup(e.pid, 'SIGKILL')
    expect(await e.exited).not.toBe(0)
  })

  it('prints the older V0 memory lines and ANSI colours when asked', async () => {
    const e = await spawnEngine(MODEL, [], {
      MODELGATE_SIM_DIR: tempSimDir(),
      SIM_LOG_STYLE: 'v0',
      SIM_LOG_ANSI: '1',
    })
    await waitHealthy(e)
    const out = e.stdout()
    expect(out).toMatch(
      /the current vLLM instance can use total_gpu_memory \(79\.65GiB\) x gpu_memory_utilization \(0\.90\) = 71\.68GiB/,
    )
    expect(out).toMatch(
      /model weights take 14\.19GiB; non_torch_memory takes [\d.]+GiB; PyTorch activation peak memory takes [\d.]+GiB; the rest of the memory reserved for KV Cache is [\d.]+GiB\./,
    )
    expect(out).toMatch(/Model loading took 14\.1934 GiB and [\d.]+ seconds/)
    expect(out).toContain('\x1b[32mINFO\x1b[0m')
    expect(out).not.toContain('(APIServer')
  })

  it('shows the memory under one Worker_TPn process per GPU, and prints the KV memory once per node', async () => {
    const dir = tempSimDir()
    const e = await spawnEngine(MODEL, ['-tp', '2', '--gpu-memory-utilization', '0.5'], {
      MODELGATE_SIM_DIR: dir,
    })
    await waitHealthy(e)
    const out = e.stdout()
    const pid = (rank: number) => Number(new RegExp(`\\(Worker_TP${rank} pid=(\\d+)\\)`).exec(out)?.[1])
    const apps = runSmiCli(
      ['--query-compute-apps=pid,process_name,used_memory,gpu_bus_id', '--format=csv,noheader,nounits'],
      {
        MODELGATE_SIM_DIR: dir,
      },
    )
    const mib = Math.floor(0.5 * 81559)
    expect(apps.stdout).toBe(
      `${pid(0)}, VLLM::Worker_TP0, ${mib}, 00000000:18:00.0\n${pid(1)}, VLLM::Worker_TP1, ${mib}, 00000000:32:00.0\n`,
    )
    expect(out.match(/Available KV cache memory/g)).toHaveLength(1)
    expect(out).toMatch(/^\(Worker_TP0 pid=\d+\) INFO .* Available KV cache memory: [\d.]+ GiB$/m)
  })

  it('prints the start-up summary at INFO before 0.11 and after 0.20, at DEBUG between', async () => {
    const summary = (out: string) =>
      out.split('\n').find((l) => l.includes('on startup. Desired GPU memory utilization is'))
    const start = async (version: string, env: Record<string, string> = {}) => {
      const e = await spawnEngine(MODEL, [], {
        MODELGATE_SIM_DIR: tempSimDir(),
        SIM_VLLM_VERSION: version,
        ...env,
      })
      await waitHealthy(e)
      return summary(e.stdout())
    }
    expect(await start('0.10.2')).toMatch(
      /^\(EngineCore_DP0 pid=\d+\) INFO .*\[gpu_worker\.py:391\] Free memory/,
    )
    expect(await start('0.11.0')).toBeUndefined()
    expect(await start('0.20.2')).toBeUndefined()
    expect(await start('0.11.2', { VLLM_LOGGING_LEVEL: 'DEBUG' })).toMatch(
      /^\(EngineCore_DP0 pid=\d+\) DEBUG .* Free memory on device/,
    )
    expect(await start('0.29.0')).toMatch(/^\(EngineCore pid=\d+\) INFO .* Free memory on device/)
  })

  it("prints a current release's lines, which the gateway's parser reads back to the plan's figures", async () => {
    const e = await spawnEngine(MODEL, ['--max-model-len', '16k', '--gpu-memory-utilization', '0.9'], {
      MODELGATE_SIM_DIR: tempSimDir(),
    })
    await waitHealthy(e)
    const out = e.stdout()
    expect(out).toMatch(
      /^\(EngineCore pid=\d+\) INFO .* GPU KV cache size: [\d,]+ tokens, Maximum concurrency for 16,000 tokens per request: [\d.]+x$/m,
    )
    expect(out).toMatch(
      /Free memory on device \(79\.64\/79\.65 GiB\) on startup\. Desired GPU memory utilization is \(0\.9, 71\.68 GiB\)\. Actual usage is [\d.]+ GiB for consumed memory \(weights \+ non-torch\)/,
    )
    const acc = new VllmLogAccumulator()
    for (const line of `${out}\n${e.stderr()}`.split('\n')) acc.feed(line)
    expect(acc.phase()).toBe('ready')
    expect(acc.maxModelLen()).toBe(16000)
    const m = acc.metrics()
    expect(m?.max_model_len).toBe(16000)
    expect(m?.weights_memory_gib).toBe(14.1934)
    expect(m?.total_gpu_memory_gib).toBe(71.68)
    expect(m?.kv_cache_per_request_mib).toBeGreaterThan(0)
    expect(acc.startupMemory()).toEqual({
      freeGib: 79.64,
      deviceTotalGib: 79.65,
      utilization: 0.9,
      desiredGib: 71.68,
    })
  })

  it("refuses a full GPU naming the device, in a current release's words", async () => {
    const dir = tempSimDir()
    const first = await spawnEngine(MODEL, [], { MODELGATE_SIM_DIR: dir, CUDA_VISIBLE_DEVICES: '1' })
    await waitHealthy(first)
    const second = await spawnEngine(MODEL, [], { MODELGATE_SIM_DIR: dir, CUDA_VISIBLE_DEVICES: '1' })
    expect(await second.exited).toBe(1)
    const free = ((81559 - Math.floor(0.9 * 81559) - 4) / 1024).toFixed(2)
    expect(second.stderr()).toContain(
      `ValueError: Free memory on device cuda:0 (${free}/79.65 GiB) on startup is less than desired GPU memory utilization (0.9, 71.68 GiB).`,
    )
    const acc = new VllmLogAccumulator()
    for (const line of `${second.stdout()}\n${second.stderr()}`.split('\n')) acc.feed(line)
    expect(acc.freeMemoryFailure()).toMatchObject({
      device: 'cuda:0',
      freeGib: Number(free),
      utilization: 0.9,
      desiredGib: 71.68,
    })
  })
})
