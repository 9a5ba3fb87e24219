import { groupPids } from '../../src/engine/process.ts'
import type { LogStream } from '../../src/engine/supervisor.ts'
import { waitHealthy } from '../../src/engine/vllm-client.ts'
import type { GpuProbe } from '../../src/gpu/smi.ts'
import type { GatewayConfig } from './config.ts'
import type { ManagedInstance } from './instance.ts'
import { usedMibByGpuForPids } from './placement.ts'
import type { SharedCache } from './shared-cache.ts'

/**
 * Supervision follows an engine from spawn to exit: its log lines become progress events, /health
 * (polled with backoff: vLLM has no readiness push) makes it active, its GPU footprint is measured
 * when it gets ready, sleeps or wakes, and an exit nobody asked for fails it with its last error
 * lines and stops the rest of its process group.
 */
export class Supervision {
  constructor(
    private readonly config: GatewayConfig,
    private readonly probe: GpuProbe,
    private readonly sharedCache: SharedCache,
  ) {}

  onLogLine(inst: ManagedInstance, stream: LogStream, line: string): void {
    inst.events.emit('log', { stream, content: line })
    inst.logs.feed(line)
    if (inst.status === 'starting') {
      const percent = inst.logs.progressPercent()
      if (percent !== inst.lastProgress) {
        inst.lastProgress = percent
        inst.events.emit('progress', { phase: inst.logs.phase(), percent, message: line.slice(0, 300) })
      }
    }
  }

  /** awaitReady polls /health until 200 (active), the process exits (failed) or the deadline (failed). */
  async awaitReady(inst: ManagedInstance, deadlineAt: number): Promise<void> {
    const { engine } = this.config
    const proc = inst.process!
    const outcome = await waitHealthy(inst.client, {
      initialMs: engine.health_poll_ms.initial,
      maxMs: engine.health_poll_ms.max,
      deadlineMs: Math.max(0, deadlineAt - Date.now()),
      stop: () => !proc.running || inst.lifecycle.state !== 'starting',
    })
    if (inst.lifecycle.state !== 'starting') return
    if (outcome === 'healthy') {
      await this.markReady(inst)
      return
    }
    if (outcome === 'timeout') {
      this.fail(inst, `engine did not become healthy within ${engine.startup_timeout_seconds} s`)
      await proc.stop(engine.stop_grace_seconds * 1000)
    }
    // 'stopped': the process exited and the exit watcher records the failure
  }

  private async markReady(inst: ManagedInstance): Promise<void> {
    const row = inst.row
    row.ready_at = new Date().toISOString()
    row.memory_metrics = inst.logs.metrics()
    row.max_tokens = inst.logs.maxModelLen() ?? row.requested_max_tokens
    row.memory_baseline_by_gpu = await this.measureFootprint(inst)
    if (inst.lifecycle.state !== 'starting') return
    inst.events.emit('progress', { phase: 'ready', percent: 100, message: 'engine is healthy' })
    inst.lifecycle.to('active', 'engine is healthy')
    this.emitMemory(inst, row.memory_baseline_by_gpu)
  }

  /** measureFootprint: GiB per GPU held by the engine's process group, else the log-derived total. */
  async measureFootprint(inst: ManagedInstance): Promise<Record<string, number> | null> {
    const row = inst.row
    this.probe.invalidate()
    const snap = await this.probe.snapshot()
    const out: Record<string, number> = {}
    if (snap.available && row.pgid) {
      const used = usedMibByGpuForPids(snap.gpus, snap.apps, new Set(groupPids(row.pgid)))
      for (const idx of row.gpu_ids) {
        const mib = used.get(idx)
        if (mib !== undefined) out[String(idx)] = Math.round((mib / 1024) * 100) / 100
      }
    }
    if (Object.keys(out).length === row.gpu_ids.length) return out
    const total = row.memory_metrics?.total_gpu_memory_gib
    if (total === undefined) return Object.keys(out).length ? out : null
    for (const idx of row.gpu_ids) out[String(idx)] ??= Math.round(total * 100) / 100
    return out
  }

  emitMemory(inst: ManagedInstance, byGpu: Record<string, number> | null): void {
    inst.currentMemoryGib = byGpu
    const total = byGpu ? Object.values(byGpu).reduce((a, b) => a + b, 0) : null
    inst.events.emit('memory', {
      gpu_ids: inst.row.gpu_ids,
      memory_used_gib_by_gpu: byGpu,
      total_memory_used_gib: total === null ? null : Math.round(total * 100) / 100,
      status: inst.status,
      memory_metrics: inst.row.memory_metrics ?? null,
    })
  }

  fail(inst: ManagedInstance, message: string): void {
    inst.row.error = message
    inst.events.emit('error', { message, source: 'engine' })
    inst.lifecycle.to('failed', message)
  }

  /** watchExit turns an unexpected engine exit into a failed instance with its last error lines. */
  watchExit(inst: ManagedInstance): void {
    const proc = inst.process!
    void proc.exited.then(async (code) => {
      proc.flushLogs()
      const state = inst.lifecycle.state
      if (state === 'stopping' || state === 'failed' || state === 'removed') return
      const reason =
        state === 'starting'
          ? (inst.logs.startupFailure() ?? `engine exited with code ${code ?? 'unknown'} during start-up`)
          : [`engine exited unexpectedly (code ${code ?? 'unknown'})`, ...inst.logs.lastErrorLines(5)].join(
              '\n',
            )
      this.fail(inst, reason)
      // The leader is gone; its workers may still hold GPU memory. Stop the rest of the group.
      await proc.stop(this.config.engine.stop_grace_seconds * 1000)
      this.sharedCache.cleanup(inst)
    })
  }
}
