import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { abortable } from '../../src/host/abortable.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Helpers for simulator tests: spawn `sim engine` / `sim smi` as real child processes (each engine in
 * its own process group, like the gateway does), capture their output, and always clean up.
 */
const ENTRY = join(import.meta.dir, 'sim-entry.ts')
const BUN = process.execPath

export interface EngineProc {
  proc: Subprocess<'ignore', 'pipe', 'pipe'>
  pid: number
  port: number
  stdout(): string
  stderr(): string
  /** waitForOutput resolves once `pattern` appears on stdout or stderr (woken by each chunk of output). */
  waitForOutput(pattern: RegExp | string, ms?: number): Promise<void>
  /** onOutput calls `f` on each chunk of output (and once the process has exited); it returns the unsubscribe. */
  onOutput(f: () => void): () => void
  exited: Promise<number>
}

const live = new Set<EngineProc>()

/** baseEnv is our environment minus every knob the simulators read, so tests start from defaults. */
export function baseEnv(): Record<string, string> {
  const env: Record<string, string> = {}
  for (const [k, v] of Object.entries(process.env)) {
    if (v === undefined) continue
    if (
      /^(SIM_|MODELGATE_SIM|MODELGATE_SHM|VLLM_|SGLANG_|KVCACHED_|ENABLE_KVCACHED|CUDA_VISIBLE_DEVICES)/.test(
        k,
      )
    )
      continue
    env[k] = v
  }
  return env
}
const dirs: string[] = []

export function tempSimDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-sim-test-'))
  dirs.push(dir)
  return dir
}

export async function freePort(): Promise<number> {
  const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const port = probe.port
  probe.stop(true)
  return port
}

async function pump(
  stream: ReadableStream<Uint8Array>,
  sink: { text: string },
  listeners: Set<() => void>,
): Promise<void> {
  const decoder = new TextDecoder()
  for await (const chunk of stream) {
    sink.text += decoder.decode(chunk, { stream: true })
    for (const f of listeners) f()
  }
}

export async function spawnEngine(
  model: string,
  args: string[],
  env: Record<string, string>,
  port?: number,
): Promise<EngineProc> {
  const p = port ?? (await freePort())
  return spawnSim(['engine', model, '--port', String(p), ...args], env, p)
}

/** spawnSglang starts `sim sglang --model-path MODEL --port P …`, the simulated SGLang server. */
export async function spawnSglang(
  model: string,
  args: string[],
  env: Record<string, string>,
): Promise<EngineProc> {
  const p = await freePort()
  return spawnSim(['sglang', '--model-path', model, '--port', String(p), ...args], env, p)
}

async function spawnSim(argv: string[], env: Record<string, string>, p: number): Promise<EngineProc> {
  const proc = Bun.spawn([BUN, ENTRY, ...argv], {
    env: { ...baseEnv(), SIM_LOAD_DELAY_MS: '200', ...env },
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'pipe',
    detached: true,
  })
  const out = { text: '' }
  const err = { text: '' }
  const listeners = new Set<() => void>()
  const pumps = Promise.all([pump(proc.stdout, out, listeners), pump(proc.stderr, err, listeners)])
  const exited = proc.exited.then(async (code) => {
    await pumps
    for (const f of listeners) f()
    return code
  })
  const onOutput = (f: () => void) => {
    listeners.add(f)
    return () => listeners.delete(f)
  }
  const engine: EngineProc = {
    proc,
    pid: proc.pid,
    port: p,
    stdout: () => out.text,
    stderr: () => err.text,
    exited,
    onOutput,
    async waitForOutput(pattern, ms = 10_000) {
      const test = (s: string) => (typeof pattern === 'string' ? s.includes(pattern) : pattern.test(s))
      await waitFor(
        `${pattern} in the output of engine ${proc.pid}`,
        () => test(out.text) || test(err.text),
        {
          timeoutMs: ms,
          wake: onOutput,
          show: () => `${out.text}\n${err.text}`,
        },
      )
    },
  }
  live.add(engine)
  void engine.exited.then(() => live.delete(engine))
  return engine
}

/** waitHealthy waits until the engine answers /health with 200 (checked again on each chunk of its output). */
export async function waitHealthy(engine: EngineProc, ms = 10_000): Promise<void> {
  await waitFor(
    `engine ${engine.pid} (port ${engine.port}) to answer /health`,
    async () => {
      if (engine.proc.exitCode !== null)
        throw new Error(`engine exited ${engine.proc.exitCode} before it was healthy\n${engine.stderr()}`)
      const res = await fetch(`http://127.0.0.1:${engine.port}/health`, {
        signal: AbortSignal.timeout(500),
      }).catch(() => null)
      return res?.status === 200
    },
    {
      timeoutMs: ms,
      wake: engine.onOutput,
      pollMs: 25,
      show: () => `${engine.stdout()}\n${engine.stderr()}`,
    },
  )
}

export function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal)
  } catch {}
}

export function groupAlive(pid: number): boolean {
  try {
    process.kill(-pid, 0)
    return true
  } catch {
    return false
  }
}

/** cleanupSims SIGKILLs every engine group still alive and removes temp dirs; use in afterEach. */
export async function cleanupSims(): Promise<void> {
  const waits: Promise<unknown>[] = []
  for (const e of live) {
    signalGroup(e.pid, 'SIGKILL')
    waits.push(abortable(e.exited, { timeoutMs: 2000, what: `engine ${e.pid} to exit` }).catch(() => {}))
  }
  await Promise.all(waits)
  live.clear()
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true })
}

export function runSmiCli(args: string[], env: Record<string, string>): { code: number; stdout: string } {
  const res = Bun.spawnSync([BUN, ENTRY, 'smi', ...args], { env: { ...baseEnv(), ...env } })
  return { code: res.exitCode, stdout: res.stdout.toString() }
}

export async function postJson(
  port: number,
  path: string,
  body: unknown,
  signal?: AbortSignal,
): Promise<Response> {
  return fetch(`http://127.0.0.1:${port}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: signal ?? AbortSignal.timeout(15_000),
  })
}

/** sseFrames splits an SSE body into its `data:` payloads. */
export function sseFrames(body: string): string[] {
  return body
    .split('\n\n')
    .filter((f) => f.startsWith('data: '))
    .map((f) => f.slice('data: '.length))
}

export interface OpenStream {
  /** frames received so far (`data:` payloads, `[DONE]` included). */
  frames: string[]
  /** tokens counts the chunks that carry generated text or a finish reason. */
  tokens(): number
  /** waitTokens resolves once `n` token chunks have arrived. */
  waitTokens(n: number, ms?: number): Promise<void>
  /** done resolves with every frame once the server closed the stream (or the connection was cut). */
  done: Promise<string[]>
}

/** openStream posts a streaming request and reads its SSE frames as they come. */
export async function openStream(
  port: number,
  path: string,
  body: Record<string, unknown>,
): Promise<OpenStream> {
  const res = await postJson(port, path, { ...body, stream: true }, AbortSignal.timeout(30_000))
  if (!res.ok || !res.body) throw new Error(`stream ${path} answered ${res.status}`)
  const frames: string[] = []
  const listeners = new Set<() => void>()
  const isToken = (f: string) =>
    f.startsWith('{') && /"(text|content)":|"finish_reason":"/.test(f) && !f.includes('"role"')
  const done = (async () => {
    const decoder = new TextDecoder()
    let buffer = ''
    try {
      for await (const chunk of res.body as ReadableStream<Uint8Array>) {
        buffer += decoder.decode(chunk, { stream: true })
        const parts = buffer.split('\n\n')
        buffer = parts.pop() ?? ''
        for (const part of parts) if (part.startsWith('data: ')) frames.push(part.slice('data: '.length))
        for (const f of listeners) f()
      }
    } catch {
      // The connection was cut (the engine died): the frames so far are the answer.
    }
    for (const f of listeners) f()
    return frames
  })()
  const tokens = () => frames.filter(isToken).length
  return {
    frames,
    tokens,
    done,
    waitTokens: (n, ms = 10_000) =>
      waitFor(`${n} token chunks from ${path}`, () => tokens() >= n, {
        timeoutMs: ms,
        wake: (notify) => {
          listeners.add(notify)
          return () => listeners.delete(notify)
        },
      }).then(() => undefined),
  }
}

/** usedMibOnGpu reads memory.used of one simulated GPU through the smi simulator. */
export function smiUsedMib(dir: string, gpu: number): number {
  const res = runSmiCli(['--query-gpu=memory.used', '--format=csv,noheader,nounits', '-i', String(gpu)], {
    MODELGATE_SIM_DIR: dir,
  })
  return Number(res.stdout.trim())
}

/** metricValue reads one series of an engine's /metrics (the first line starting with `series`). */
export async function metricValue(port: number, series: string): Promise<number | undefined> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()
  const line = text.split('\n').find((l) => l.startsWith(series))
  return line === undefined ? undefined : Number(line.split(' ').pop())
}
