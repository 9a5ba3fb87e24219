import { waitHealthy } from '../../src/engine/engine-client.ts'
import { PHASE_PROGRESS } from '../../src/engine/engine-logs.ts'
import { groupPids, sameProcess, stopGroup, stopProcesses } from '../../src/engine/process.ts'
import type { LogStream } from '../../src/engine/supervisor.ts'
import type { GpuProbe } from '../../src/gpu/smi.ts'
import { pause } from '../../src/host/abortable.ts'
import type { GatewayConfig } from './config.ts'
import { confirmEngine } from './engine-identity.ts'
import type { ManagedInstance } from './instance.ts'
import { instanceProcesses } from './orphans/marker.ts'
import { usedMibByGpuForPids } from './placement.ts'
import type { SharedCache } from './shared-cache.ts'

/**
 * Supervision follows an engine from spawn to exit: its log lines become progress events, /health
 * makes it active, its GPU footprint is measured when it gets ready, sleeps or wakes, and an exit
 * nobody asked for fails it with its last error lines and stops the rest of its process group
 * (stopEngine: also what unload, shutdown and restart recovery use).
 *
 * Readiness: an engine has no readiness push, but its log has a line that comes when the server is
 * about to answer (vLLM: uvicorn's `Application startup complete.`; the driver's log reader says
 * which, EngineLogs.observe). That line (a hint) triggers a /health probe at once, and a few quick
 * ones after it; a 200 makes the instance active once the engine's identity is confirmed
 * (engine-identity.ts: the port's listeners are its own, its /v1/models lists its served name).
 * Polling /health with backoff (engine.health_poll_ms) stays the fallback for an engine whose line
 * never comes or is missed.
 * The log tail (src/engine/log-tail.ts) watches the files, so the line is seen when it is written.
 * The footprint is measured as soon as the log shows the API server starting (the GPU memory is
 * all allocated by then), so nvidia-smi's run is not added to the time readiness is reported.
 */
/** HINT_RETRY_MS: after the startup line, /health is probed at once, then after each of these delays. */
const HINT_RETRY_MS = [5, 10, 20, 40, 80, 160, 320]

/** Readiness: one per instance while it starts; whoever sees /health 200 first claims `ready`. */
interface Readiness {
  /** aborted once readiness is claimed (by the hint or the poll): stops the other path. */
  readonly claimed: AbortController
  /** the hint's own markReady, awaited by awaitReady when the hint claimed readiness. */
  ready: Promise<void> | null
  /** the footprint measured once the API server starts, used by markReady. */
  footprint: Promise<Record<string, number> | null> | null
  hinted: boolean
}

export class Supervision {
  private readonly readiness = new WeakMap<ManagedInstance, Readiness>()
  /** halted: the gateway is shutting down; liveness watches end. */
  private readonly halted = new AbortController()

  constructor(
    private readonly config: GatewayConfig,
    private readonly probe: GpuProbe,
    private readonly sharedCache: SharedCache,
    /** dataDir: the data dir the engines' marker names (orphans/marker.ts). */
    private readonly dataDir: string,
  ) {}

  /** halt ends every liveness watch (shutdown: the engines are stopped or left, not failed). */
  halt(): void {
    this.halted.abort()
  }

  onLogLine(inst: ManagedInstance, stream: LogStream, line: string): void {
    inst.events.emit('log', { stream, content: line })
    const readyHint = inst.logs.observe(line)
    if (inst.status === 'starting') {
      const percent = inst.logs.progressPercent()
      if (percent !== inst.lastProgress) {
        inst.lastProgress = percent
        inst.startup?.phases.enter(`load.${inst.logs.phase()}`)
        inst.events.emit('progress', { phase: inst.logs.phase(), percent, message: line.slice(0, 300) })
      }
      const r = this.readiness.get(inst)
      if (r && !r.footprint && percent >= PHASE_PROGRESS.api_server) r.footprint = this.measureFootprint(inst)
      if (r && readyHint && !r.hinted) {
        r.hinted = true
        void this.probeOnHint(inst, r)
      }
    }
  }

  /**
   * awaitReady waits until /health answers 200 (active), the process exits (failed) or the deadline
   * (failed). Two paths may see the 200: the startup line's probes (probeOnHint) and the polling.
   * Whatever goes wrong on the way, an instance is never left `starting` with nobody following it: it
   * fails with the error and its engine is stopped.
   */
  async awaitReady(inst: ManagedInstance, deadlineAt: number): Promise<void> {
    try {
      await this.followStartup(inst, deadlineAt)
    } catch (err) {
      if (inst.lifecycle.state !== 'starting') throw err
      this.fail(inst, `start-up supervision failed: ${(err as Error).message ?? String(err)}`)
      await this.stopEngine(inst)
      throw err
    } finally {
      this.endStartupTrace(inst)
    }
  }

  /**
   * endStartupTrace ends the load's span once start-up is over: fine when the instance is active,
   * else failed with its error. An engine that exited is failed by the exit watcher a moment later,
   * so that case waits for the state to leave `starting`.
   */
  private endStartupTrace(inst: ManagedInstance): void {
    const startup = inst.startup
    if (!startup) return
    inst.startup = null
    const end = () => {
      const error = inst.status === 'active' ? undefined : (inst.row.error ?? `instance ${inst.status}`)
      startup.phases.end(error)
      startup.span.setAttributes({ 'modelgate.outcome': inst.status })
      startup.span.end(error)
    }
    if (inst.lifecycle.state !== 'starting') {
      end()
      return
    }
    void inst.lifecycle
      .waitUntil((l) => l.state !== 'starting', { timeoutMs: 60_000, what: 'the end of start-up' })
      .catch(() => {})
      .then(end)
  }

  private async followStartup(inst: ManagedInstance, deadlineAt: number): Promise<void> {
    const { engine } = this.config
    const proc = inst.process!
    const r: Readiness = { claimed: new AbortController(), ready: null, footprint: null, hinted: false }
    this.readiness.set(inst, r)
    let outcome: Awaited<ReturnType<typeof waitHealthy>>
    try {
      try {
        outcome = await waitHealthy(inst.client, {
          initialMs: engine.health_poll_ms.initial,
          maxMs: engine.health_poll_ms.max,
          deadlineMs: Math.max(0, deadlineAt - Date.now()),
          stop: () => !proc.running || inst.lifecycle.state !== 'starting',
          signal: r.claimed.signal,
        })
      } catch (err) {
        // The hint claimed readiness while a probe of the polling was under way (its call aborted).
        if (!r.claimed.signal.aborted) throw err
        outcome = 'stopped'
      }
      if (outcome === 'healthy' && !r.claimed.signal.aborted && inst.lifecycle.state === 'starting') {
        r.claimed.abort()
        r.ready = this.markReady(inst, r.footprint)
      }
      if (r.ready) return await r.ready
    } finally {
      this.readiness.delete(inst)
    }
    if (inst.lifecycle.state !== 'starting') return
    if (outcome === 'timeout') {
      this.fail(inst, `engine did not become healthy within ${engine.startup_timeout_seconds} s`)
      await this.stopEngine(inst)
    }
    // 'stopped': the process exited and the exit watcher records the failure
  }

  /**
   * probeOnHint: the startup line came; probe /health at once and a few times shortly after (the
   * line may precede the listening socket by a moment). A 200 claims readiness unless the polling
   * claimed it first; without one the polling carries on.
   */
  private async probeOnHint(inst: ManagedInstance, r: Readiness): Promise<void> {
    const { signal } = r.claimed
    for (const delay of [0, ...HINT_RETRY_MS]) {
      if (delay) await pause(delay, signal)
      if (signal.aborted || inst.lifecycle.state !== 'starting') return
      // An abort (the polling claimed readiness) may end the call with an error rather than false.
      const healthy = await inst.client.health(2000, { signal }).catch(() => false)
      if (signal.aborted || inst.lifecycle.state !== 'starting') return
      if (healthy) {
        r.claimed.abort()
        r.ready = this.markReady(inst, r.footprint)
        // awaitReady awaits it (its failure reaches the caller there); this only keeps a failure
        // after awaitReady already returned from being an unhandled rejection.
        r.ready.catch(() => {})
        return
      }
    }
  }

  /** markReady: active once confirmEngine shows the engine alone answers; else failed and stopped. */
  private async markReady(
    inst: ManagedInstance,
    footprint: Promise<Record<string, number> | null> | null,
  ): Promise<void> {
    const impostor = await confirmEngine(inst, this.config.engine.host)
    if (inst.lifecycle.state !== 'starting') return
    if (impostor) {
      this.fail(inst, `${impostor}. Nothing was routed there; the engine's process group is stopped.`)
      await this.stopEngine(inst)
      this.sharedCache.cleanup(inst)
      return
    }
    const row = inst.row
    inst.startup?.phases.enter('load.ready')
    row.ready_at = new Date().toISOString()
    row.memory_metrics = inst.logs.metrics()
    row.max_tokens = inst.logs.maxModelLen() ?? row.requested_max_tokens
    row.memory_baseline_by_gpu = await (footprint ?? this.measureFootprint(inst))
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

  /**
   * stopEngine stops whatever runs of an instance's engine. While its leader is alive (same pid and
   * start time) it pins the group id, so the whole group is stopped (TERM, the grace, KILL). Once the
   * leader is gone the group id proves nothing by itself, yet vLLM's EngineCore and workers may live on
   * in it holding the GPU: then only processes of that group that started after the engine and carry
   * its marker are stopped (instanceProcesses), each checked by pid and start time before its signal.
   */
  async stopEngine(inst: ManagedInstance): Promise<'gone' | 'terminated' | 'killed'> {
    const row = inst.row
    const graceMs = this.config.engine.stop_grace_seconds * 1000
    if (row.pid !== null && sameProcess(row.pid, row.process_start_time))
      return inst.process ? inst.process.stop(graceMs) : stopGroup(row.pgid ?? row.pid, graceMs)
    inst.process?.close()
    return stopProcesses(() => instanceProcesses(row, this.dataDir), graceMs)
  }

  fail(inst: ManagedInstance, message: string): void {
    inst.row.error = message
    inst.events.emit('error', { message, source: 'engine' })
    inst.lifecycle.to('failed', message)
  }

  /**
   * watchExit turns an unexpected engine exit into a failed instance with its last error lines, and
   * watches the liveness of a serving engine until it exits.
   */
  watchExit(inst: ManagedInstance): void {
    const proc = inst.process!
    const exited = new AbortController()
    void this.watchLiveness(inst, AbortSignal.any([exited.signal, this.halted.signal]))
    void proc.exited.then(async (code) => {
      exited.abort()
      // Shut down, with engines left running: what happens to them is the next start's to see.
      if (this.halted.signal.aborted && this.config.engine.on_shutdown === 'leave') return
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
      await this.stopEngine(inst)
      this.sharedCache.cleanup(inst)
    })
  }

  /**
   * watchLiveness probes the health of an active or sleeping engine every `engine.liveness.interval_ms`
   * (a sleeping vLLM still answers 200; the driver's client probes a sleeping engine its own way). When its engine core dies, vLLM's API server answers 503 and
   * may live on (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH, or until a request meets the dead core): without
   * this an idle or sleeping instance would stay `active`/`sleeping` until someone used it. After
   * `failures` failed probes in a row the instance fails with what the probes saw and its last error
   * lines, and its process group is stopped (its GPU memory freed). Probes pause while a state change
   * or an operation (sleep, wake, move) is under way: those have their own deadlines.
   */
  private async watchLiveness(inst: ManagedInstance, exited: AbortSignal): Promise<void> {
    const { interval_ms: intervalMs, failures, timeout_ms: timeoutMs } = this.config.engine.liveness
    if (intervalMs === 0) return
    let misses = 0
    let seen = ''
    while (!exited.aborted) {
      await pause(intervalMs, exited)
      const state = inst.lifecycle.state
      if (exited.aborted || state === 'failed' || state === 'removed' || state === 'stopping') return
      if ((state !== 'active' && state !== 'sleeping') || inst.lifecycle.operation !== null) {
        misses = 0
        continue
      }
      const probe = await inst.client.probe({ timeoutMs, signal: exited, asleep: state === 'sleeping' })
      if (exited.aborted || inst.lifecycle.state !== state || inst.lifecycle.operation !== null) continue
      if (probe.ok) {
        misses = 0
        continue
      }
      misses++
      seen = probe.error
      if (misses < failures) continue
      const reason = [
        `engine failed ${failures} liveness probes in a row, ${intervalMs} ms apart (last: ${seen}); its engine core is presumed dead`,
        ...inst.logs.lastErrorLines(5),
      ].join('\n')
      this.fail(inst, reason)
      await this.stopEngine(inst)
      this.sharedCache.cleanup(inst)
      return
    }
  }
}
