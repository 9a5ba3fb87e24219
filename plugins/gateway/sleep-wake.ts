import { EngineCallError, type SleepTag, WakeError, type WakePhase } from '../../src/engine/engine-client.ts'
import { DEFAULT_ENGINE_KIND, engineDriver } from '../../src/engine/kinds.ts'
import { groupPids } from '../../src/engine/process.ts'
import type { GpuProbe } from '../../src/gpu/smi.ts'
import { pause, WaitError } from '../../src/host/abortable.ts'
import type { EventBus } from '../../src/host/bus.ts'
import type { Logger } from '../../src/host/logger.ts'
import { PhaseSpans, type SpanBase, type TraceSpan } from '../../src/host/telemetry/spans.ts'
import type { Telemetry } from '../../src/host/telemetry/telemetry.ts'
import { AppError, badRequest, conflict } from '../../src/http/errors.ts'
import type { InstanceStatus, SleepCheck, SleepOptions, SleepResult, SleepStatus, WakeResult } from './api.ts'
import type { GatewayConfig } from './config.ts'
import type { ManagedInstance } from './instance.ts'
import { usedMibByGpuForPids } from './placement.ts'
import type { Supervision } from './supervision.ts'

/**
 * Sleep and wake of one instance through its engine's control client (the driver's: vLLM's
 * dev-mode endpoints, …). Each runs as the instance's one operation (lifecycle.ts): a second sleep,
 * wake or move meanwhile gets 409. What the engine can do (its sleep levels, partial wakes) is its
 * driver's capabilities: a level or tags it lacks are refused with 400 before anything happens.
 *
 * A sleep never cuts a request: vLLM's `/sleep` aborts what runs on the engine (its `mode`
 * defaults to `abort`). So the sleep first stops routing to the instance (`begin('sleep')`), waits
 * for its in-flight requests (`drained`, up to plugins.gateway.sleep.drain_timeout_ms), and only
 * then asks the engine to sleep, with a `mode` for whatever reached the engine by another way:
 * `keep` where the engine keeps such requests and recomputes them after the wake (the builds with
 * `vllm:engine_sleep_component_state`), so the sleep neither cuts them nor waits out a long
 * stream; else `wait` (where the engine has the parameter). The drain stays in both cases: a
 * request of ours kept on a sleeping engine would hang its client until some wake. Past the deadline the sleep is refused (409 SLEEP_DRAIN_TIMEOUT) and the instance
 * takes requests again. After the engine sleeps, nvidia-smi says what its process group still
 * holds per GPU (the memory check, `sleep_verified`).
 *
 * A wake runs the engine's sequence for the level slept at (its client's wakeUp; vLLM: after level
 * 2 the weights are reloaded before the instance serves again). The instance becomes active only
 * when the engine says it is awake and every phase finished; a wake that fails half-way
 * leaves it sleeping (not routed) with an `error` event, and the next wake resumes after the
 * phases that finished.
 */
export interface SleepWakeDeps {
  config: GatewayConfig['sleep']
  supervision: Supervision
  probe: GpuProbe
  bus: EventBus
  log: Logger
  /** telemetry: each sleep and wake is a span (a trace of its own unless a request's wake). */
  telemetry: Telemetry
  /** unload stops an instance (plugins.gateway.sleep.verify_fallback: unload). */
  unload: (id: string) => Promise<void>
  /** probeSpacingMs: the time between two readings of a sleep check that waits (the probe's reuse time). */
  probeSpacingMs?: number
}

/**
 * What a sleep of each level frees is the engine's driver's `sleepShare` (vLLM: level 1 "about
 * 90 %", level 2 "about 95 %"), taken as shares of what sleep mode can release: the weights and the
 * KV cache, or the weights alone for a shared-cache engine (kvcached maps its KV pages outside
 * vLLM's sleep allocator, so a sleep leaves them where they are).
 */
/**
 * The shortfall a verified sleep may have. The two readings come from different sources: the
 * releasable figure from log lines rounded to 0.01 GiB, what is held from nvidia-smi per process
 * in MiB, including a CUDA context that grows lazily (cuBLAS and NCCL workspaces, allocated outside
 * sleep mode's pool) and the PyTorch caching allocator's blocks (sampler, activations) that a
 * sleep does not return. 5 points of the share plus 0.25 GiB per GPU absorb those. The failure
 * looked for (vllm#32714: the weights stay on the GPU) leaves the weights' whole share, 15–60 % of
 * weights + KV cache for real models, far beyond it.
 */
const TOLERANCE_SHARE = 0.05
const TOLERANCE_GIB = 0.25

/** What a sleep and the wakes after it leave for the sleep status (kept while the instance lives). */
interface SleepRecord {
  check: SleepCheck | null
  wake: SleepStatus['wake']
}

type Measured = { mibByGpu: Map<number, number> } | { reason: string }

export class SleepWake {
  /** The whole wake running per instance, which a second caller joins. */
  private readonly waking = new WeakMap<ManagedInstance, Promise<WakeResult>>()
  private readonly records = new WeakMap<ManagedInstance, SleepRecord>()

  constructor(private readonly deps: SleepWakeDeps) {}

  private record(inst: ManagedInstance): SleepRecord {
    let r = this.records.get(inst)
    if (!r) {
      r = { check: null, wake: null }
      this.records.set(inst, r)
    }
    return r
  }

  async sleep(inst: ManagedInstance, level: 1 | 2, opts: SleepOptions = {}): Promise<SleepResult> {
    const span = this.deps.telemetry.operation('gateway.sleep', {
      ...instanceAttributes(inst),
      'modelgate.sleep.level': level,
    })
    try {
      const result = await this.sleepTraced(inst, level, opts, new PhaseSpans(span))
      span.setAttributes({
        'modelgate.sleep.verified': result.sleep_verified ?? undefined,
        'modelgate.sleep.drained_requests': result.drained_requests,
        'modelgate.sleep.fallback': result.fallback ?? undefined,
      })
      // A sleep that freed too little succeeded for its caller, yet is what an operator looks for.
      span.end(
        result.sleep_verified === false ? 'sleep freed less GPU memory than its level should' : undefined,
      )
      return result
    } catch (err) {
      span.end(err instanceof Error ? err.message : String(err))
      throw err
    }
  }

  private async sleepTraced(
    inst: ManagedInstance,
    level: 1 | 2,
    opts: SleepOptions,
    phases: PhaseSpans,
  ): Promise<SleepResult> {
    const id = inst.id
    if (inst.status !== 'active')
      throw conflict(`Instance ${id} is ${inst.status}; only a running instance can sleep`, 'INVALID_STATE')
    if (!inst.row.enable_sleep_mode)
      throw badRequest(`Instance ${id} was loaded without enable_sleep_mode`, 'SLEEP_MODE_NOT_ENABLED')
    const levels = inst.driver.capabilities.sleepLevels
    if (!levels.includes(level))
      throw badRequest(
        `Instance ${id} runs ${inst.driver.label}, which sleeps at level ${levels.join(' or ')} only`,
        'SLEEP_LEVEL_NOT_SUPPORTED',
      )
    inst.lifecycle.begin('sleep')
    let result: SleepResult
    try {
      const t0 = performance.now()
      phases.enter('sleep.drain', { 'modelgate.in_flight': inst.inFlight })
      const drained = await this.drain(inst, opts)
      const drainMs = Math.round(performance.now() - t0)
      stillThere(inst, 'active')
      phases.enter('sleep.measure_awake')
      const awake = await this.measure(inst)
      stillThere(inst, 'active')
      phases.enter('sleep.engine', { 'server.port': inst.row.port })
      const asked = (await inst.client.drainedSleepMode?.().catch(() => null)) ?? 'wait'
      const mode = await engineCall(() => inst.client.sleep(level, { mode: asked }))
      stillThere(inst, 'active')
      phases.enter('sleep.verify')
      const now = new Date().toISOString()
      inst.row.sleep_level = level
      inst.row.slept_at = now
      inst.lifecycle.to('sleeping', `sleep level ${level}`)
      const record = this.record(inst)
      record.wake = null
      const { asleep, check } = await this.settle(inst, level, awake)
      record.check = check
      const measured = 'mibByGpu' in asleep && check.verified !== null
      this.deps.supervision.emitMemory(
        inst,
        measured
          ? toGib(asleep.mibByGpu, inst.row.gpu_ids)
          : await this.deps.supervision.measureFootprint(inst),
      )
      const fallback = check.verified === false ? this.deps.config.verify_fallback : null
      this.report(inst, level, check, fallback)
      result = {
        status: 'sleeping',
        instance_id: id,
        model_path: inst.row.model_path,
        sleep_level: level,
        slept_at: now,
        drained_requests: drained,
        drain_ms: drainMs,
        mode: mode === 'wait' || mode === 'keep' ? mode : null,
        sleep_verified: check.verified,
        memory_check: check,
        fallback,
      }
    } finally {
      phases.end()
      inst.lifecycle.end('sleep')
    }
    if (result.fallback === 'unload' && inst.lifecycle.state === 'sleeping') {
      await this.deps.unload(id)
      result.status = 'stopping'
    }
    return result
  }

  /**
   * drain waits until no request is in flight on the instance (routing to it is already off) and
   * returns how many there were. Past the deadline (0: no waiting at all) it refuses the sleep
   * with 409 SLEEP_DRAIN_TIMEOUT; the caller's signal cancels it with 409 SLEEP_CANCELLED.
   */
  private async drain(inst: ManagedInstance, opts: SleepOptions): Promise<number> {
    const open = inst.inFlight
    if (open === 0) return 0
    const timeoutMs = opts.drainTimeoutMs ?? this.deps.config.drain_timeout_ms
    const refused = () =>
      conflict(
        `Instance ${inst.id} still has ${inst.inFlight} request(s) in flight after ${timeoutMs} ms; ` +
          'it was not put to sleep and keeps serving',
        'SLEEP_DRAIN_TIMEOUT',
      )
    if (timeoutMs <= 0) throw refused()
    inst.events.emit('progress', {
      phase: 'draining',
      percent: 0,
      message: `waiting for ${open} request(s) in flight before sleeping (up to ${timeoutMs} ms)`,
    })
    try {
      await inst.lifecycle.drained({ timeoutMs, ...(opts.signal ? { signal: opts.signal } : {}) })
    } catch (err) {
      if (!(err instanceof WaitError)) throw err
      if (err.kind === 'timeout') throw refused()
      throw conflict(
        `The sleep of instance ${inst.id} was cancelled while it waited for ${inst.inFlight} request(s)`,
        'SLEEP_CANCELLED',
      )
    }
    return open
  }

  /**
   * settle reads what the engine holds after its sleep until the check passes or is unknown, for up
   * to plugins.gateway.sleep.verify_wait_ms where the engine's driver says it may answer before its
   * memory is given back (`freesAfterSleep`: SGLang frees the pages after its release returned), so
   * a reading taken at once would count memory on its way out as kept; other engines are judged on
   * the first reading. Each reading is a fresh nvidia-smi run (spaced by the probe's
   * own reuse time); the last one is judged.
   */
  private async settle(
    inst: ManagedInstance,
    level: 1 | 2,
    awake: Measured,
  ): Promise<{ asleep: Measured; check: SleepCheck }> {
    const wait = inst.driver.freesAfterSleep ? this.deps.config.verify_wait_ms : 0
    const deadline = performance.now() + wait
    for (;;) {
      const asleep = await this.measure(inst)
      const check = checkSleep(inst, level, awake, asleep)
      const left = deadline - performance.now()
      if (check.verified !== false || left <= 0 || inst.lifecycle.state !== 'sleeping')
        return { asleep, check }
      await pause(Math.min(left, Math.max(50, this.deps.probeSpacingMs ?? 250)))
    }
  }

  /** measure: MiB per GPU that nvidia-smi shows for the engine's process group (a GPU not listed: 0). */
  private async measure(inst: ManagedInstance): Promise<Measured> {
    const { probe } = this.deps
    probe.invalidate()
    const snap = await probe.snapshot()
    if (!snap.available) return { reason: `no GPU probe (${snap.reason})` }
    const pgid = inst.row.pgid
    if (!pgid) return { reason: "the engine's process group is not known" }
    return { mibByGpu: usedMibByGpuForPids(snap.gpus, snap.apps, new Set(groupPids(pgid))) }
  }

  /** report: a sleep that freed too little is an `error` event, a log line and a bus event (the metric). */
  private report(
    inst: ManagedInstance,
    level: 1 | 2,
    check: SleepCheck,
    fallback: 'warn' | 'unload' | null,
  ): void {
    if (check.verified === false) {
      const then = fallback === 'unload' ? 'unloading it (verify_fallback: unload)' : 'it stays asleep'
      const message = `sleep level ${level} freed less GPU memory than expected: ${check.reason}; ${then}`
      inst.events.emit('error', { message, source: 'sleep_check', memory_check: check })
      this.deps.log.warn(`instance ${inst.id}: ${message}`, { gpus: check.gpus })
    }
    this.deps.bus.emit('gateway.instance.sleep', {
      instance_id: inst.id,
      served_model_name: inst.row.served_model_name,
      level,
      verified: check.verified,
      memory_check: check,
      fallback,
    })
  }

  /**
   * wake wakes a sleeping instance. A whole wake (no tags) asked for while one runs joins it and
   * gets its result: a request, an operator and the router asking at once share one wake, and none
   * of them is refused because another asked first. `trace`: the span of whoever asks (a request
   * held for the wake), under which the wake's own span goes; one joining a wake under way gets an
   * event instead.
   */
  wake(inst: ManagedInstance, tags: SleepTag[] = [], trace: SpanBase | null = null): Promise<WakeResult> {
    const running = this.waking.get(inst)
    if (running && tags.length === 0) {
      trace?.event('modelgate.wake.joined', { 'modelgate.instance_id': inst.id })
      return running
    }
    const wake = this.wakeOnce(inst, tags, trace)
    if (tags.length > 0) return wake
    this.waking.set(inst, wake)
    const forget = () => {
      if (this.waking.get(inst) === wake) this.waking.delete(inst)
    }
    wake.then(forget, forget)
    return wake
  }

  private async wakeOnce(
    inst: ManagedInstance,
    tags: SleepTag[],
    trace: SpanBase | null,
  ): Promise<WakeResult> {
    const span = this.deps.telemetry.operation(
      'gateway.wake',
      { ...instanceAttributes(inst), 'modelgate.wake.tags': tags },
      trace,
    )
    try {
      const result = await this.wakeTraced(inst, tags, span)
      span.setAttributes({
        'modelgate.sleep.level': result.sleep_level ?? undefined,
        'modelgate.outcome': result.status,
      })
      span.end()
      return result
    } catch (err) {
      span.end(err instanceof Error ? err.message : String(err))
      throw err
    }
  }

  private async wakeTraced(inst: ManagedInstance, tags: SleepTag[], span: TraceSpan): Promise<WakeResult> {
    const id = inst.id
    if (inst.status !== 'sleeping')
      throw conflict(
        `Instance ${id} is ${inst.status}; only a sleeping instance can be woken`,
        'INVALID_STATE',
      )
    if (tags.length && !inst.driver.capabilities.partialWake)
      throw badRequest(
        `Instance ${id} runs ${inst.driver.label}, which wakes whole: a wake cannot name tags`,
        'WAKE_TAGS_NOT_SUPPORTED',
      )
    inst.lifecycle.begin('wake')
    let ended = false
    try {
      const level = await this.sleptAt(inst)
      const record = this.record(inst)
      const prior = record.wake?.phases_done ?? []
      const done: WakePhase[] = [...prior]
      let outcome: Awaited<ReturnType<typeof inst.client.wakeUp>>
      // Each engine phase (weights, reload_weights, kv_cache, reset_prefix_cache) is a child span,
      // drawn when it is reported done, from the end of the one before.
      let phaseStart = epochMs()
      try {
        outcome = await inst.client.wakeUp(level, tags, {
          done: prior,
          onPhase: (phase) => {
            span
              .child(
                `wake.${phase}`,
                { 'server.port': inst.row.port },
                { kind: 'client', startTime: phaseStart },
              )
              .end()
            phaseStart = epochMs()
            done.push(phase)
            const total = inst.driver.wakePhases(level).length
            const percent = Math.min(99, Math.round((done.length / total) * 100))
            inst.events.emit('progress', { phase: 'waking', percent, message: `wake: ${phase} done` })
          },
        })
      } catch (err) {
        if (!(err instanceof WakeError)) throw err
        span.child(`wake.${err.phase}`, {}, { kind: 'client', startTime: phaseStart }).end(err.message)
        record.wake = { phases_done: done, failed_phase: err.phase, error: err.message, at: now() }
        const message = `${err.message}; the instance stays sleeping (not routed) until a wake finishes`
        inst.events.emit('error', { message, source: 'wake', phase: err.phase })
        this.deps.log.warn(`instance ${id}: ${message}`)
        throw new AppError(502, 'ENGINE_ERROR', message, 'server_error')
      }
      record.wake = { phases_done: done, failed_phase: null, error: null, at: now() }
      stillThere(inst, 'sleeping')
      const at = now()
      if (!outcome.sleeping) {
        inst.row.sleep_level = null
        inst.row.slept_at = null
        // Until the footprint after the wake is read (below), what it holds is its awake footprint,
        // measured at readiness, not the asleep figure (ManagedInstance.holdsGibByGpu).
        inst.currentMemoryGib = null
        inst.lifecycle.to('active', tags.length ? `woke (${tags.join(', ')})` : 'woke')
      } else {
        inst.events.emit('progress', { phase: 'waking', percent: 50, message: `woke ${tags.join(', ')}` })
      }
      // The wake is over for its callers (and for requests held on it) once the engine is awake; the
      // footprint after it is read off their wait (nvidia-smi takes tens of milliseconds).
      inst.lifecycle.end('wake')
      ended = true
      void this.deps.supervision
        .measureFootprint(inst)
        .then((m) => this.deps.supervision.emitMemory(inst, m))
        .catch((err) =>
          this.deps.log.warn(`instance ${id}: footprint after wake not read`, { error: String(err) }),
        )
      return {
        status: outcome.sleeping ? 'sleeping' : 'running',
        instance_id: id,
        model_path: inst.row.model_path,
        woke_at: at,
        ...(tags.length ? { tags } : {}),
        sleep_level: level,
        phases: outcome.phases,
      }
    } finally {
      if (!ended) inst.lifecycle.end('wake')
    }
  }

  /**
   * sleptAt: the level the engine sleeps at. Ours when we put it to sleep; else (found asleep
   * after a restart) what the engine says (vLLM's `vllm:engine_sleep_component_state`, or the
   * older `vllm:engine_sleep_state`: VllmClient.sleepLevel); else the deepest
   * level the engine has, whose wake is correct after any level (a needless reload from disk after
   * level 1 costs time, a level-1 wake after level 2 would serve garbage).
   */
  private async sleptAt(inst: ManagedInstance): Promise<1 | 2> {
    const known = inst.row.sleep_level
    if (known === 1 || known === 2) return known
    const reported = await inst.client.sleepLevel().catch(() => null)
    if (reported === 1 || reported === 2) return reported
    return inst.driver.capabilities.sleepLevels.includes(2) ? 2 : 1
  }

  /** status is the sleep-status body (documented in the README). */
  async status(inst: ManagedInstance): Promise<SleepStatus> {
    let engineSleeping: boolean | null = null
    if (inst.status === 'active' || inst.status === 'sleeping') {
      engineSleeping = inst.row.enable_sleep_mode ? await inst.client.isSleeping().catch(() => null) : false
    }
    const record = this.records.get(inst)
    return {
      instance_id: inst.id,
      status: inst.status,
      is_sleeping: inst.status === 'sleeping',
      sleep_level: inst.row.sleep_level ?? null,
      slept_at: inst.row.slept_at,
      enable_sleep_mode: inst.row.enable_sleep_mode,
      engine_is_sleeping: engineSleeping,
      operation: inst.lifecycle.operation,
      in_flight: inst.inFlight,
      sleep_verified: record?.check?.verified ?? null,
      memory_check: record?.check ?? null,
      wake: record?.wake ?? null,
    }
  }
}

/**
 * checkSleep compares, per GPU, what the engine's process group held right before the sleep with
 * what it holds right after, against the share its level should free (the driver's sleepShare, less the
 * tolerance) of what it can release (`releases`: weights + KV cache, or the weights alone for a
 * shared-cache engine). Unknown (null) when either reading is missing, the group held nothing on
 * one of its GPUs awake (nvidia-smi sees other PIDs: a container without the host's PID
 * namespace), or a shared-cache engine's weights are not known from its log.
 */
export function checkSleep(
  inst: Pick<ManagedInstance, 'row'>,
  level: 1 | 2,
  awake: Measured,
  asleep: Measured,
): SleepCheck {
  const share = engineDriver(inst.row.engine_kind ?? DEFAULT_ENGINE_KIND).sleepShare[level] ?? 1
  const weightsOnly = inst.row.sharedcache_enabled
  const base = {
    releases: weightsOnly ? ('weights' as const) : ('weights_and_kv_cache' as const),
    expected_share: share,
    tolerance_share: TOLERANCE_SHARE,
    tolerance_gib: TOLERANCE_GIB,
    checked_at: now(),
  }
  const unknown = (reason: string): SleepCheck => ({ ...base, verified: null, gpus: {}, reason })
  if ('reason' in awake) return unknown(awake.reason)
  if ('reason' in asleep) return unknown(asleep.reason)
  const { gpu_ids, memory_metrics: mm } = inst.row
  const unseen = gpu_ids.filter((g) => !awake.mibByGpu.get(g))
  if (unseen.length)
    return unknown(
      `nvidia-smi shows no process of the engine's group on GPU ${unseen.join(', ')} (another PID namespace?)`,
    )
  if (weightsOnly && !mm)
    return unknown('the weights of this shared-cache engine are not known (no memory figures in its log)')
  const what = weightsOnly ? 'weights (kvcached keeps the KV cache mapped)' : 'weights + KV cache'
  const gpus: SleepCheck['gpus'] = {}
  const short: string[] = []
  for (const g of gpu_ids) {
    const awakeGib = awake.mibByGpu.get(g)! / 1024
    const asleepGib = (asleep.mibByGpu.get(g) ?? 0) / 1024
    const freed = awakeGib - asleepGib
    const releasable = mm
      ? Math.min(awakeGib, mm.weights_memory_gib + (weightsOnly ? 0 : mm.kv_cache_available_gib))
      : awakeGib
    const required = Math.max(0, releasable * (share - TOLERANCE_SHARE) - TOLERANCE_GIB)
    gpus[String(g)] = {
      awake_gib: round2(awakeGib),
      asleep_gib: round2(asleepGib),
      freed_gib: round2(freed),
      releasable_gib: round2(releasable),
      required_gib: round2(required),
    }
    if (freed < required)
      short.push(
        `GPU ${g} freed ${round2(freed)} of ${round2(awakeGib)} GiB (${pct(freed, releasable)} of ` +
          `${round2(releasable)} GiB ${what}; at least ${round2(required)} GiB expected)`,
      )
  }
  return { ...base, verified: short.length === 0, gpus, reason: short.length ? short.join('; ') : null }
}

function toGib(mibByGpu: Map<number, number>, gpuIds: number[]): Record<string, number> {
  const out: Record<string, number> = {}
  for (const g of gpuIds) out[String(g)] = round2((mibByGpu.get(g) ?? 0) / 1024)
  return out
}

const round2 = (x: number) => Math.round(x * 100) / 100
const pct = (part: number, whole: number) => (whole > 0 ? `${Math.round((part / whole) * 100)} %` : 'n/a')
const now = () => new Date().toISOString()

/** stillThere: after an engine call, the instance was not unloaded (or failed) meanwhile. */
function stillThere(inst: ManagedInstance, status: InstanceStatus): void {
  if (inst.lifecycle.state !== status)
    throw conflict(`Instance ${inst.id} became ${inst.lifecycle.state} during the operation`, 'INVALID_STATE')
}

async function engineCall<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn()
  } catch (err) {
    if (err instanceof EngineCallError) throw new AppError(502, 'ENGINE_ERROR', err.message, 'server_error')
    throw err
  }
}

/** instanceAttributes: what every span of an instance's operation carries. */
function instanceAttributes(inst: ManagedInstance) {
  return {
    'modelgate.instance_id': inst.id,
    'gen_ai.request.model': inst.row.served_model_name,
    'modelgate.gpu_ids': inst.row.gpu_ids.join(','),
  }
}

/** epochMs: now, in epoch milliseconds with sub-millisecond precision (a span's start time). */
const epochMs = () => performance.timeOrigin + performance.now()
