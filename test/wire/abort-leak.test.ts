import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { waitFor } from '../support/wait.ts'
import { encoder, type Stub, startStub } from './support.ts'

/**
 * Aborting a streaming fetch has leaked its body off-heap on some Bun versions (bun#32659), which
 * heap statistics do not show: run the proxy in its own process and watch its RSS while hundreds
 * of streams are abandoned mid-way by their clients.
 */
const SERVER = join(import.meta.dir, '../perf/proxy-server.ts')

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return m ? Number(m[1]) / 1024 : Number.NaN
}

describe.skipIf(process.platform !== 'linux')('aborted streams', () => {
  let stub: Stub
  let proc: Subprocess<'ignore', 'pipe', 'inherit'>
  let url = ''
  let pid = 0
  let opened = 0

  beforeAll(async () => {
    const chunk = encoder.encode(`data: ${'y'.repeat(16_000)}\n\n`)
    stub = startStub(() => {
      opened++
      return new Response(
        new ReadableStream<Uint8Array>({ pull: (c) => c.enqueue(chunk) }, { highWaterMark: 0 }),
        { headers: { 'content-type': 'text/event-stream' } },
      )
    })
    proc = Bun.spawn([process.execPath, SERVER, '--upstream', String(stub.port)], {
      stdin: 'ignore',
      stdout: 'pipe',
      stderr: 'inherit',
    })
    const first = await proc.stdout.getReader().read()
    ;({ url, pid } = JSON.parse(new TextDecoder().decode(first.value)))
  })
  afterAll(() => {
    proc?.kill()
    stub?.stop()
  })

  async function abandon(streams: number, concurrency: number): Promise<void> {
    let next = 0
    const worker = async () => {
      while (next < streams) {
        next++
        const ac = new AbortController()
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          body: '{"model":"bench-model","stream":true,"messages":[]}',
          signal: ac.signal,
        })
        const reader = res.body!.getReader()
        let got = 0
        while (got < 512 * 1024) {
          const r = await reader.read()
          if (r.done) break
          got += r.value.byteLength
        }
        ac.abort()
      }
    }
    await Promise.all(Array.from({ length: concurrency }, worker))
  }

  it('keeps the proxy RSS flat over hundreds of abandoned streams, and the engine sees every cancel', async () => {
    // Both readings are taken at the same point: once the engine has seen every cancel.
    const settled = () =>
      waitFor('every upstream request to be aborted', () => stub.aborts >= opened, { timeoutMs: 5000 })
    await abandon(100, 16)
    await settled()
    const before = rssMb(pid)
    await abandon(600, 16)
    await settled()
    const after = rssMb(pid)
    console.log(`proxy RSS ${before.toFixed(1)} MB → ${after.toFixed(1)} MB over 600 abandoned streams`)
    // 600 streams × 512 KiB = 300 MiB went through; a leaked body per stream would show here.
    expect(after - before).toBeLessThan(40)
  }, 60_000)
})
