import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Server } from 'bun'
import { EngineCallError, WakeError } from '../../src/engine/engine-client.ts'
import { engineDriver } from '../../src/engine/kinds.ts'
import { buildSglangArgs, buildSglangEnv } from '../../src/engine/sglang-command.ts'

/**
 * The SGLang driver's command line and control client against a stub engine that records what it
 * was asked: sleep is one `POST /release_memory_occupation {}`, refused while /get_load (or, on a
 * build without it, /metrics) shows a request in any queue (SGLang's release kills a busy engine);
 * wake is one resume (after level 2 then a reload of the weights from disk), never sent to an engine the client
 * knows is awake (a second resume kills it); a sleeping engine is probed on /get_model_info (its
 * /health would run a generation on released memory); the KV-cache usage is `sglang:token_usage`.
 */
let running = 0
let resumeStatus = 200
/** load: what /get_load counts per queue; null: a build without /get_load (404) */
let load: Record<string, number> | null = null
const seen: { line: string; body: string; type: string | null }[] = []
let engine: Server<undefined>
let url = ''

beforeAll(() => {
  engine = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    async fetch(req) {
      const u = new URL(req.url)
      seen.push({
        line: `${req.method} ${u.pathname}`,
        body: await req.text(),
        type: req.headers.get('content-type'),
      })
      switch (u.pathname) {
        case '/health':
          return new Response(null, { status: 200 })
        case '/get_model_info':
          return Response.json({ model_path: '/models/qwen', is_generation: true })
        case '/get_load':
          if (load) return Response.json([{ dp_rank: 0, num_tokens: 12, ...load }])
          break
        case '/update_weights_from_disk':
          return Response.json({ success: true, message: 'Succeeded to update model weights.' })
        case '/metrics':
          return new Response(
            'sglang:num_running_reqs{model_name="m",tp_rank="0"} 0\n' +
              'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 0\n' +
              `sglang:num_paused_reqs{model_name="m",tp_rank="0"} ${running}\n` +
              'sglang:token_usage{model_name="m",tp_rank="0"} 0.375\n' +
              'sglang:prompt_tokens_total{model_name="m"} 120\n' +
              'sglang:generation_tokens_total{model_name="m"} 45\n',
          )
        case '/release_memory_occupation':
          return Response.json(null)
        case '/resume_memory_occupation':
          return resumeStatus === 200
            ? Response.json(null)
            : Response.json({ error: { message: 'boom' } }, { status: resumeStatus })
      }
      return Response.json({ detail: 'Not Found' }, { status: 404 })
    },
  })
  url = `http://127.0.0.1:${engine.port}`
})

afterAll(() => {
  engine.stop(true)
})

const client = () => engineDriver('sglang').client(url)
const calls = () => seen.map((s) => s.line).filter((l) => !l.endsWith('/metrics') && !l.endsWith('/get_load'))

describe('SGLang command line', () => {
  const spec = {
    modelPath: 'Qwen/Qwen2.5-7B-Instruct',
    port: 8140,
    host: '127.0.0.1',
    servedModelName: 'qwen',
    maxModelLen: 8192,
    gpuMemoryUtilization: 0.5,
    tensorParallelSize: 2,
    gpuIds: [2, 3],
    enableSleepMode: true,
    sharedCache: false,
    extraArgs: ['--chunked-prefill-size', '4096'],
  }

  it('names everything with its own flags, sleep mode as the memory saver with a CPU copy of the weights', () => {
    expect(buildSglangArgs(spec)).toEqual([
      '--model-path',
      'Qwen/Qwen2.5-7B-Instruct',
      '--port',
      '8140',
      '--host',
      '127.0.0.1',
      '--served-model-name',
      'qwen',
      '--context-length',
      '8192',
      '--mem-fraction-static',
      '0.5',
      '--tp-size',
      '2',
      '--enable-memory-saver',
      '--enable-weights-cpu-backup',
      '--enable-metrics',
      '--chunked-prefill-size',
      '4096',
    ])
    expect(buildSglangEnv(spec)).toEqual({
      CUDA_VISIBLE_DEVICES: '2,3',
      CUDA_DEVICE_ORDER: 'PCI_BUS_ID',
      SGLANG_MEMORY_SAVER_CUDA_GRAPH: 'true',
    })
    const plain = { ...spec, tensorParallelSize: 1, enableSleepMode: false, extraArgs: [] }
    delete (plain as { maxModelLen?: number }).maxModelLen
    expect(buildSglangArgs(plain)).not.toContain('--enable-memory-saver')
    expect(buildSglangArgs(plain)).not.toContain('--tp-size')
    expect(buildSglangArgs(plain)).not.toContain('--context-length')
    expect(buildSglangEnv(plain)).toEqual({ CUDA_VISIBLE_DEVICES: '2,3', CUDA_DEVICE_ORDER: 'PCI_BUS_ID' })
  })

  it('says which flags the load body owns, aliases included', () => {
    const d = engineDriver('sglang')
    for (const f of [
      '--model-path',
      '--model',
      '--tp',
      '--tp-size',
      '--tensor-parallel-size',
      '--mem-fraction-static',
    ])
      expect(d.managedFlags).toContain(f)
    expect(d.capabilities).toEqual({ sleepLevels: [1, 2], partialWake: false, sharedCache: false })
    expect(d.wakePhases(1)).toEqual(['resume'])
    expect(d.wakePhases(2)).toEqual(['resume', 'reload_weights'])
  })
})

describe('SglangClient', () => {
  it('sleeps with one release carrying a JSON body, and wakes with one resume', async () => {
    seen.length = 0
    running = 0
    const c = client()
    expect(c.sleepMode).toBeNull()
    expect(await c.sleep(1, { mode: 'wait' })).toBeNull()
    expect(c.sleepMode).toBe(true)
    expect(await c.isSleeping()).toBe(true)
    expect(await c.sleepLevel()).toBe(1)
    const phases: string[] = []
    expect(await c.wakeUp(1, [], { onPhase: (p) => phases.push(p) })).toEqual({
      phases: ['resume'],
      sleeping: false,
    })
    expect(phases).toEqual(['resume'])
    expect(await c.isSleeping()).toBe(false)
    expect(calls()).toEqual(['POST /release_memory_occupation', 'POST /resume_memory_occupation'])
    expect(seen.filter((s) => s.line.startsWith('POST')).map((s) => [s.body, s.type])).toEqual([
      ['{}', 'application/json'],
      ['{}', 'application/json'],
    ])
  })

  it('does not release an engine whose /get_load shows a request in any queue, nor one an older build shows busy', async () => {
    seen.length = 0
    const idle = {
      num_reqs: 0,
      num_running_reqs: 0,
      num_waiting_reqs: 0,
      num_grammar_queue_reqs: 0,
      num_paused_reqs: 0,
      num_retracted_reqs: 0,
    }
    for (const queue of [
      'num_waiting_reqs',
      'num_grammar_queue_reqs',
      'num_paused_reqs',
      'num_retracted_reqs',
    ]) {
      load = { ...idle, [queue]: 2 }
      const err = await client()
        .sleep(1)
        .catch((e: unknown) => e)
      expect(err).toBeInstanceOf(EngineCallError)
      expect((err as Error).message).toContain('2 request(s) running, queued or paused')
    }
    // An older build: no /get_load (404), its /metrics gauges of the same queues are read instead.
    load = null
    running = 1
    expect(
      (
        (await client()
          .sleep(2)
          .catch((e: unknown) => e)) as Error
      ).message,
    ).toContain('1 request(s)')
    running = 0
    expect(calls()).toEqual([])
    expect(seen.filter((s) => s.line === 'GET /get_load')).toHaveLength(5)
  })

  it('sleeps at level 2 and wakes by resuming, then reloading the weights it read before the release', async () => {
    seen.length = 0
    load = { num_reqs: 0, num_waiting_reqs: 0, num_paused_reqs: 0 }
    const c = client()
    await c.sleep(2)
    expect(await c.sleepLevel()).toBe(2)
    const phases: string[] = []
    expect(await c.wakeUp(2, [], { onPhase: (p) => phases.push(p) })).toEqual({
      phases: ['resume', 'reload_weights'],
      sleeping: false,
    })
    expect(phases).toEqual(['resume', 'reload_weights'])
    expect(calls()).toEqual([
      'GET /get_model_info',
      'POST /release_memory_occupation',
      'POST /resume_memory_occupation',
      'POST /update_weights_from_disk',
    ])
    expect(seen.find((s) => s.line === 'POST /update_weights_from_disk')!.body).toBe(
      JSON.stringify({ model_path: '/models/qwen' }),
    )
    // A wake that failed after `resume` goes on with the reload only.
    seen.length = 0
    await c.sleep(2)
    expect(await c.wakeUp(2, [], { done: ['resume'] })).toEqual({
      phases: ['reload_weights'],
      sleeping: false,
    })
    expect(await c.wakeUp(2)).toEqual({ phases: [], sleeping: false })
    // A client that did not release it (modelgate restarted) asks the server for the path to reload.
    seen.length = 0
    expect(await client().wakeUp(2)).toEqual({ phases: ['resume', 'reload_weights'], sleeping: false })
    expect(calls()).toEqual([
      'POST /resume_memory_occupation',
      'GET /get_model_info',
      'POST /update_weights_from_disk',
    ])
    load = null
  })

  it('never resumes an engine it knows is awake, nor after a wake that already resumed it', async () => {
    seen.length = 0
    const c = client()
    await c.sleep(1)
    await c.wakeUp(1)
    expect(await c.wakeUp(1)).toEqual({ phases: [], sleeping: false })
    expect(await client().wakeUp(1, [], { done: ['resume'] })).toEqual({ phases: [], sleeping: false })
    expect(calls()).toEqual(['POST /release_memory_occupation', 'POST /resume_memory_occupation'])
  })

  it('names the failing phase when the resume fails, and refuses tags', async () => {
    resumeStatus = 400
    const c = client()
    const err = (await c.wakeUp(1).catch((e: unknown) => e)) as WakeError
    resumeStatus = 200
    expect(err).toBeInstanceOf(WakeError)
    expect(err.phase).toBe('resume')
    expect(err.status).toBe(400)
    expect(err.message).toContain('boom')
    expect(((await c.wakeUp(1, ['weights']).catch((e: unknown) => e)) as Error).message).toContain(
      'wakes whole',
    )
  })

  it('probes /health awake and /get_model_info asleep, as it knows or as the caller says', async () => {
    seen.length = 0
    const c = client()
    expect((await c.probe()).ok).toBe(true)
    expect((await c.probe({ asleep: true })).ok).toBe(true)
    await c.sleep(1)
    expect(await c.health(1000)).toBe(true)
    expect(calls()).toEqual([
      'GET /health',
      'GET /get_model_info',
      'POST /release_memory_occupation',
      'GET /get_model_info',
    ])
  })

  it('cannot tell whether an engine it did not put to sleep sleeps', async () => {
    expect(await client().sleepLevel()).toBeNull()
    expect(
      (
        (await client()
          .isSleeping()
          .catch((e: unknown) => e)) as Error
      ).message,
    ).toContain('no endpoint')
  })

  it('reads the KV-cache usage and the token counters under their sglang: names', async () => {
    expect(await client().kvCacheUsage()).toBe(0.375)
    expect(await client().usage()).toEqual({ generationTokens: 45, promptTokens: 120, kvCacheUsage: 0.375 })
  })
})
