import { afterEach, describe, expect, it } from 'bun:test'
import { groupPids } from '../../src/engine/process.ts'
import { SglangLogAccumulator } from '../../src/engine/sglang-log.ts'
import { waitFor } from '../support/wait.ts'
import { cleanupSims, type EngineProc, postJson, runSmiCli, spawnSglang, tempSimDir } from './helpers.ts'

afterEach(cleanupSims)

/**
 * `sim sglang` as a real process, against what SGLang does (sources in src/engine/sglang-*.ts and
 * src/sim/sglang-engine.ts): its start-up lines parse into figures that match what nvidia-smi
 * shows; /health answers 503 until the warmup, then after its one-second look; release and resume
 * free and restore the memory; the failures that kill a real SGLang server kill this one.
 */
const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
const READY = 'The server is fired up and ready to roll!'

function usedOnGpu0(dir: string): number {
  const res = runSmiCli(['--query-gpu=memory.used', '--format=csv,noheader,nounits', '-i', '0'], {
    MODELGATE_SIM_DIR: dir,
  })
  return Number(res.stdout.trim()) - 4
}

async function start(
  dir: string,
  args: string[] = [],
  env: Record<string, string> = {},
): Promise<EngineProc> {
  const e = await spawnSglang(MODEL, ['--mem-fraction-static', '0.5', '--enable-metrics', ...args], {
    MODELGATE_SIM_DIR: dir,
    CUDA_VISIBLE_DEVICES: '0',
    SIM_SGLANG_HEALTH_TICK_MS: '50',
    SIM_WAKE_DELAY_MS: '60',
    ...env,
  })
  await e.waitForOutput(READY)
  return e
}

const post = (e: EngineProc, path: string, body: unknown = {}) => postJson(e.port, path, body)
const chat = (e: EngineProc, model = MODEL) =>
  post(e, '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'hi there' }], max_tokens: 4 })

/** killed: the process ended by a signal (SGLang's kill_process_tree SIGKILLs the server itself). */
async function killed(e: EngineProc): Promise<void> {
  await e.exited
  expect(e.proc.signalCode).toBe('SIGKILL')
  expect(e.stderr()).toContain('Received sigquit from a child process. It usually means the child failed.')
}

describe('sim sglang start-up', () => {
  it('logs what SGLang logs, opens its port before it is ready, and its figures match nvidia-smi', async () => {
    const dir = tempSimDir()
    const e = await spawnSglang(MODEL, ['--mem-fraction-static', '0.5'], {
      MODELGATE_SIM_DIR: dir,
      CUDA_VISIBLE_DEVICES: '0',
      SIM_LOAD_DELAY_MS: '3000',
    })
    await e.waitForOutput('Uvicorn running on')
    expect((await fetch(`http://127.0.0.1:${e.port}/health`)).status).toBe(503)
    await e.waitForOutput(READY)
    const t0 = performance.now()
    expect((await fetch(`http://127.0.0.1:${e.port}/health`)).status).toBe(200)
    expect(performance.now() - t0).toBeGreaterThanOrEqual(900)

    const acc = new SglangLogAccumulator()
    let hint = 0
    for (const line of `${e.stdout()}\n${e.stderr()}`.split('\n')) if (acc.observe(line)) hint++
    expect(hint).toBe(1)
    expect(acc.phase()).toBe('ready')
    const m = acc.metrics()!
    expect(m.max_model_len).toBe(32768)
    expect(m.weights_memory_gib).toBeCloseTo((7.62e9 * 2) / 2 ** 30, 1)
    // fraction × (free at start − context) − weights goes to the KV pool
    expect(m.kv_cache_available_gib).toBeCloseTo(
      0.5 * (81559 / 1024 - 4 / 1024 - 0.5) - m.weights_memory_gib,
      0,
    )
    expect(m.cuda_graph_memory_gib).toBeGreaterThan(0)
    expect(Math.abs(usedOnGpu0(dir) / 1024 - (m.total_gpu_memory_gib + 0.5))).toBeLessThan(0.05)
    const apps = runSmiCli(['--query-compute-apps=pid,process_name', '--format=csv,noheader,nounits'], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(apps.stdout).toContain('sglang::scheduler')
    expect(e.stdout()).toMatch(/"POST \/generate HTTP\/1\.1" 200 OK[\s\S]*The server is fired up/)
  }, 30_000)

  it('refuses a flag SGLang does not have, as argparse does (exit 2)', async () => {
    const e = await spawnSglang(MODEL, ['--enable-sleep-mode'], { MODELGATE_SIM_DIR: tempSimDir() })
    expect(await e.exited).toBe(2)
    expect(e.stderr()).toContain('launch_server.py: error: unrecognized arguments: --enable-sleep-mode')
  }, 30_000)

  it("fails with SGLang's own line when the fraction leaves no room for the KV cache", async () => {
    const e = await spawnSglang(MODEL, ['--mem-fraction-static', '0.1'], {
      MODELGATE_SIM_DIR: tempSimDir(),
      CUDA_VISIBLE_DEVICES: '0',
    })
    await killed(e)
    const acc = new SglangLogAccumulator()
    for (const line of `${e.stdout()}\n${e.stderr()}`.split('\n')) acc.observe(line)
    expect(acc.startupFailure()).toBe(
      'RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.',
    )
  }, 30_000)
})

describe('sim sglang API', () => {
  it("answers in SGLang's shapes: any model name echoed, its length errors, FastAPI's 400 and 404", async () => {
    const e = await start(tempSimDir())
    const ok = await chat(e, 'whatever-name')
    expect(ok.status).toBe(200)
    expect(((await ok.json()) as { model: string }).model).toBe('whatever-name')
    const long = await post(e, '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 40_000,
    })
    expect(long.status).toBe(400)
    expect(await long.json()).toMatchObject({
      object: 'error',
      type: 'BadRequestError',
      code: 400,
      message: expect.stringContaining("exceeds the model's maximum context length of 32768 tokens"),
    })
    const noType = await fetch(`http://127.0.0.1:${e.port}/v1/chat/completions`, {
      method: 'POST',
      body: '{}',
    })
    expect(noType.status).toBe(400)
    expect(await noType.json()).toMatchObject({ object: 'error', type: 'Bad Request', code: 400 })
    const models = (await (await fetch(`http://127.0.0.1:${e.port}/v1/models`)).json()) as {
      data: { id: string; owned_by: string; max_model_len: number }[]
    }
    expect(models.data).toEqual([
      expect.objectContaining({ id: MODEL, owned_by: 'sglang', max_model_len: 32768 }),
    ])
    const missing = await fetch(`http://127.0.0.1:${e.port}/sleep`, { method: 'POST' })
    expect(missing.status).toBe(404)
    expect(await missing.json()).toEqual({ detail: 'Not Found' })
    const tok = (await (await post(e, '/tokenize', { prompt: 'one two three' })).json()) as { count: number }
    expect(tok.count).toBe(3)
    const metrics = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text()
    expect(metrics).toMatch(/^sglang:token_usage\{.*model_name="Qwen\/Qwen2.5-7B-Instruct".*\} 0\.0$/m)
    // The warmup's 8 tokens count, as in SGLang (its health checks do not: log_metrics=False).
    expect(metrics).toMatch(/^sglang:generation_tokens_total\{model_name="[^"]+"\} 12\.0$/m)
  }, 30_000)
})

describe('sim sglang release and resume', () => {
  it('frees weights, KV cache and CUDA graphs on release and restores them on resume', async () => {
    const dir = tempSimDir()
    const e = await start(dir, ['--enable-memory-saver', '--enable-weights-cpu-backup'])
    const awake = usedOnGpu0(dir)
    const noBody = await fetch(`http://127.0.0.1:${e.port}/release_memory_occupation`, { method: 'POST' })
    expect(noBody.status).toBe(400)
    expect(usedOnGpu0(dir)).toBe(awake)
    const released = await post(e, '/release_memory_occupation')
    expect(released.status).toBe(200)
    expect(await released.json()).toBeNull()
    expect(usedOnGpu0(dir)).toBe(512)
    expect((await fetch(`http://127.0.0.1:${e.port}/get_model_info`)).status).toBe(200)
    expect((await post(e, '/resume_memory_occupation')).status).toBe(200)
    expect(usedOnGpu0(dir)).toBe(awake)
    const res = await chat(e)
    const text = ((await res.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message
      .content
    expect(text).not.toContain('!')
  }, 30_000)

  it('frees nothing without --enable-memory-saver, though it answers 200', async () => {
    const dir = tempSimDir()
    const e = await start(dir)
    const awake = usedOnGpu0(dir)
    expect((await post(e, '/release_memory_occupation')).status).toBe(200)
    expect(usedOnGpu0(dir)).toBe(awake)
    expect((await chat(e)).status).toBe(200)
  }, 30_000)

  it('answers garbage after a release without the weights backup, until the weights are reloaded', async () => {
    const e = await start(tempSimDir(), ['--enable-memory-saver'])
    await post(e, '/release_memory_occupation')
    await post(e, '/resume_memory_occupation')
    const content = async () =>
      ((await (await chat(e)).json()) as { choices: { message: { content: string } }[] }).choices[0]!.message
        .content
    expect(await content()).toBe('!!!!')
    const reload = await post(e, '/update_weights_from_disk', { model_path: MODEL })
    expect(await reload.json()).toMatchObject({ success: true })
    expect(await content()).not.toContain('!')
  }, 30_000)

  it('dies on a release while a request runs (the scheduler asserts it is idle)', async () => {
    const e = await start(tempSimDir(), ['--enable-memory-saver'], { SIM_TOKENS_PER_SEC: '5' })
    const running = post(e, '/v1/completions', { prompt: 'slow', max_tokens: 50 }).catch(() => null)
    await waitFor('the request to run', async () => {
      const m = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text()
      return /^sglang:num_running_reqs\{[^}]*\} 1\.0$/m.test(m)
    })
    void post(e, '/release_memory_occupation').catch(() => null)
    await killed(e)
    expect(e.stderr()).toContain(
      'AssertionError: release_memory_occupation should be called only when no ongoing request.',
    )
    expect(await running).toBeNull()
  }, 30_000)

  it('reports a paused request on /get_load (not on running or queued), and dies on a release then', async () => {
    const e = await start(tempSimDir(), ['--enable-memory-saver'], { SIM_TOKENS_PER_SEC: '20' })
    const load = async () =>
      ((await (await fetch(`http://127.0.0.1:${e.port}/get_load`)).json()) as Record<string, number>[])[0]!
    expect(await load()).toMatchObject({
      dp_rank: 0,
      num_reqs: 0,
      num_paused_reqs: 0,
      num_grammar_queue_reqs: 0,
    })
    const pending = post(e, '/v1/completions', { prompt: 'held', max_tokens: 40 }).catch(() => null)
    await waitFor('the request to run', async () =>
      (await load()).num_running_reqs === 1 ? true : undefined,
    )
    expect((await post(e, '/pause_generation', { mode: 'in_place' })).status).toBe(200)
    expect(await load()).toMatchObject({
      num_reqs: 1,
      num_running_reqs: 0,
      num_waiting_reqs: 0,
      num_paused_reqs: 1,
    })
    const m = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text()
    expect(m).toMatch(/^sglang:num_running_reqs\{[^}]*\} 0(\.0)?$/m)
    expect(m).toMatch(/^sglang:num_paused_reqs\{[^}]*\} 1(\.0)?$/m)
    void post(e, '/release_memory_occupation').catch(() => null)
    await killed(e)
    expect(e.stderr()).toContain(
      'AssertionError: release_memory_occupation should be called only when no ongoing request.',
    )
    expect(await pending).toBeNull()
  }, 30_000)

  it('goes on with a paused request after /continue_generation', async () => {
    const e = await start(tempSimDir(), [], { SIM_TOKENS_PER_SEC: '50' })
    const pending = post(e, '/v1/completions', { prompt: 'held', max_tokens: 20 })
    await waitFor('the request to run', async () => {
      const m = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text()
      return /^sglang:num_running_reqs\{[^}]*\} 1(\.0)?$/m.test(m)
    })
    expect((await post(e, '/pause_generation', { mode: 'in_place' })).status).toBe(200)
    const load = (await (await fetch(`http://127.0.0.1:${e.port}/get_load`)).json()) as Record<
      string,
      number
    >[]
    expect(load[0]!.num_paused_reqs).toBe(1)
    expect((await post(e, '/continue_generation')).status).toBe(200)
    const res = (await (await pending).json()) as { usage: { completion_tokens: number } }
    expect(res.usage.completion_tokens).toBe(20)
  }, 30_000)

  it('gives the released memory back SIM_SGLANG_RELEASE_LAG_MS after its release answered, as nvidia-smi shows', async () => {
    const dir = tempSimDir()
    const e = await start(dir, ['--enable-memory-saver', '--enable-weights-cpu-backup'], {
      SIM_SGLANG_RELEASE_LAG_MS: '3000',
    })
    const awake = usedOnGpu0(dir)
    expect((await post(e, '/release_memory_occupation')).status).toBe(200)
    expect(usedOnGpu0(dir)).toBe(awake)
    await waitFor('the memory to be given back', () => (usedOnGpu0(dir) === 512 ? true : undefined))
    expect((await post(e, '/resume_memory_occupation')).status).toBe(200)
    expect(usedOnGpu0(dir)).toBe(awake)
  }, 30_000)

  it('dies on a resume of what is not released, and on a generation on released memory', async () => {
    const a = await start(tempSimDir(), ['--enable-memory-saver'])
    void post(a, '/resume_memory_occupation').catch(() => null)
    await killed(a)
    expect(a.stderr()).toContain("KeyError: 'kv_cache'")

    const b = await start(tempSimDir(), ['--enable-memory-saver', '--enable-weights-cpu-backup'])
    await post(b, '/release_memory_occupation')
    void fetch(`http://127.0.0.1:${b.port}/health`).catch(() => null)
    await killed(b)
    expect(b.stderr()).toContain('CUDA error: an illegal memory access was encountered')
  }, 30_000)

  it('stays up when a scheduler dies by a signal: /health gives up after its timeout with 503', async () => {
    const e = await start(tempSimDir(), [], { SGLANG_HEALTH_CHECK_TIMEOUT: '1' })
    const victim = groupPids(e.pid).find((p) => p !== e.pid)!
    expect(victim).toBeGreaterThan(0)
    process.kill(victim, 'SIGKILL')
    await e.waitForOutput('Child process unexpectedly failed')
    expect((await fetch(`http://127.0.0.1:${e.port}/health`)).status).toBe(503)
    expect(e.proc.exitCode).toBeNull()
  }, 30_000)
})
