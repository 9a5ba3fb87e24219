/**
 * spawnStub starts bench-stub-engine.ts in a child process (its own event loop) and returns its
 * URL once it prints READY. Used by the runner benchmark and the benchmarks tests.
 */
export interface StubRecord {
  ttft_ms: number
  chunks: number
  arrived_epoch: number
  first_sent_epoch: number
}

export interface StubEngine {
  url: string
  port: number
  stats(): Promise<Record<string, StubRecord>>
  reset(): Promise<void>
  stop(): void
}

export interface StubOptions {
  /** cpus pins the stub to these CPUs with taskset (e.g. '1'), when taskset exists. */
  cpus?: string
  ttftMs?: number
  ttftJitterMs?: number
  tokensPerSec?: number
  extra?: string[]
}

const ENTRY = new URL('./bench-stub-engine.ts', import.meta.url).pathname

export async function spawnStub(o: StubOptions = {}): Promise<StubEngine> {
  const argv = [
    process.execPath,
    ENTRY,
    '--port',
    '0',
    '--ttft-ms',
    String(o.ttftMs ?? 20),
    '--tokens-per-sec',
    String(o.tokensPerSec ?? 100),
    ...(o.extra ?? []),
  ]
  if (o.cpus && Bun.which('taskset')) argv.unshift('taskset', '-c', o.cpus)
  if (o.ttftJitterMs) argv.push('--ttft-jitter-ms', String(o.ttftJitterMs))
  const proc = Bun.spawn(argv, { stdout: 'pipe', stderr: 'inherit' })
  const reader = proc.stdout.getReader()
  let text = ''
  const deadline = Date.now() + 10_000
  while (!text.includes('\n')) {
    if (Date.now() > deadline) throw new Error('stub engine did not start')
    const { value, done } = await reader.read()
    if (done) throw new Error('stub engine exited before READY')
    text += new TextDecoder().decode(value)
  }
  reader.releaseLock()
  const port = Number(/READY (\d+)/.exec(text)?.[1])
  const url = `http://127.0.0.1:${port}`
  return {
    url,
    port,
    stats: async () => (await (await fetch(`${url}/stats`)).json()) as Record<string, StubRecord>,
    reset: async () => {
      await fetch(`${url}/stats/reset`, { method: 'POST' })
    },
    stop: () => proc.kill('SIGKILL'),
  }
}
