import { Counter, Gauge, Histogram, type Registry } from 'prom-client'
import type { EventBus } from '../../src/host/bus.ts'
import { METRIC_PREFIX } from '../../src/host/metrics.ts'
import type { InstanceLifecycleEvent, InstanceSleepEvent, InstanceStatusEvent } from './api.ts'
import type { GatewayService } from './service.ts'

/**
 * registerGatewayMetrics: the model gauges, derived at scrape time from the live instances
 * (no state kept twice), the KV pool gauges per GPU, and, from the bus, the lifecycle histograms
 * and counters (LifecycleMetrics). The request counter and histogram belong to the proxy.
 */
const STATUSES = ['active', 'starting', 'sleeping', 'stopping', 'failed'] as const

export function registerGatewayMetrics(registry: Registry, service: GatewayService, bus: EventBus): void {
  new Gauge({
    name: `${METRIC_PREFIX}models_total`,
    help: 'Model instances by status',
    labelNames: ['status'],
    registers: [registry],
    collect() {
      this.reset()
      const counts = new Map<string, number>(STATUSES.map((s) => [s, 0]))
      for (const i of service.instances.values()) counts.set(i.status, (counts.get(i.status) ?? 0) + 1)
      for (const [status, n] of counts) this.set({ status }, n)
    },
  })
  new Gauge({
    name: `${METRIC_PREFIX}gpu_memory_used_bytes`,
    help: 'GPU memory held by each model instance (all its GPUs), as last measured',
    labelNames: ['model_id'],
    registers: [registry],
    collect() {
      this.reset()
      for (const i of service.instances.values()) {
        const byGpu = i.holdsGibByGpu()
        if (!byGpu || i.status === 'failed') continue
        const gib = Object.values(byGpu).reduce((a, b) => a + b, 0)
        this.set({ model_id: i.id }, Math.round(gib * 2 ** 30))
      }
    },
  })
  registerKvPoolMetrics(registry, service)
  registerLifecycleMetrics(registry, bus, service)
  registerGpuMetrics(registry, service)
  registerTtftMetric(registry, bus, service)
}

/**
 * GPU memory per GPU, for boards and the 95 % alert: `modelgate_gpu_memory_total_bytes{gpu}` and
 * `modelgate_gpu_memory_free_bytes{gpu}` from the GPU probe's newest reading (a scrape never waits
 * for nvidia-smi: GpuProbe.reading; `modelgate_gpu_reading_age_seconds` says how old it is), and `modelgate_model_gpu_memory_bytes{model,gpu}`: what each served model's
 * instances hold on each GPU as last measured (ready, sleep, wake). No series without a probe.
 */
function registerGpuMetrics(registry: Registry, service: GatewayService): void {
  const perGpu = (name: 'total' | 'free', help: string) =>
    new Gauge({
      name: `${METRIC_PREFIX}gpu_memory_${name}_bytes`,
      help,
      labelNames: ['gpu'],
      registers: [registry],
      async collect() {
        this.reset()
        const snap = await service.probe.reading().catch(() => null)
        if (!snap?.available) return
        for (const g of snap.gpus) {
          const mib = name === 'total' ? g.memoryTotalMib : g.memoryFreeMib
          if (mib !== null && mib !== undefined) this.set({ gpu: String(g.index) }, mib * 2 ** 20)
        }
      },
    })
  new Gauge({
    name: `${METRIC_PREFIX}gpu_reading_age_seconds`,
    help: 'Age of the GPU reading the GPU memory series come from (taken in the background, never at scrape)',
    registers: [registry],
    async collect() {
      this.reset()
      const snap = await service.probe.reading().catch(() => null)
      if (snap?.available) this.set(Math.max(0, (Date.now() - snap.takenAt) / 1000))
    },
  })
  perGpu('total', 'Memory of each GPU, as nvidia-smi reports it')
  perGpu('free', 'Free memory of each GPU, as nvidia-smi reports it')
  new Gauge({
    name: `${METRIC_PREFIX}model_gpu_memory_bytes`,
    help: 'GPU memory held by each served model on each GPU (all its instances), as last measured',
    labelNames: ['model', 'gpu'],
    registers: [registry],
    collect() {
      this.reset()
      const sums = new Map<string, { model: string; gpu: string; gib: number }>()
      for (const i of service.instances.values()) {
        const holds = i.holdsGibByGpu()
        if (!holds || i.status === 'failed') continue
        for (const [gpu, gib] of Object.entries(holds)) {
          const key = `${i.row.served_model_name}\u0000${gpu}`
          const s = sums.get(key) ?? { model: i.row.served_model_name, gpu, gib: 0 }
          s.gib += gib
          sums.set(key, s)
        }
      }
      for (const s of sums.values()) this.set({ model: s.model, gpu: s.gpu }, Math.round(s.gib * 2 ** 30))
    },
  })
}

/** TTFT_BUCKETS_S: time to first byte, from a cached prefix (10 ms) to a long prefill on a busy engine. */
export const TTFT_BUCKETS_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]

/**
 * `modelgate_request_ttft_seconds{model}`: time from a proxied request's start to the first byte of
 * its answer, by served model name. On the request's end (a bus event): one observation on a
 * labelled child kept per model, no label hashing per request.
 */
function registerTtftMetric(registry: Registry, bus: EventBus, service: GatewayService): void {
  const name = `${METRIC_PREFIX}request_ttft_seconds`
  if (registry.getSingleMetric(name)) return
  const ttft = new Histogram({
    name,
    help: 'Time from a proxied request to the first byte of its answer, by served model name',
    labelNames: ['model'],
    buckets: TTFT_BUCKETS_S,
    registers: [registry],
  })
  const children = new Map<string, ReturnType<typeof ttft.labels>>()
  bus.on('proxy.request', (e) => {
    if (e.ttft_ms === null) return
    const model = (e.instance_id && service.instances.get(e.instance_id)?.row.served_model_name) || e.model
    let child = children.get(model)
    if (!child) {
      child = ttft.labels(model)
      children.set(model, child)
    }
    child.observe(e.ttft_ms / 1000)
  })
}

/**
 * EngineFigures: what the engines' own /metrics say, read once per time-series sample
 * (timeseries/sampler.ts) and exposed by served model name: `modelgate_model_generation_tokens_total`
 * and `modelgate_model_prompt_tokens_total` (counters fed with deltas, so they never go back when an
 * engine restarts or a move replaces it) and `modelgate_model_kv_cache_usage_ratio` (0–1, mean over
 * the model's active instances).
 */
export class EngineFigures {
  private readonly generation: Counter<'model'>
  private readonly prompt: Counter<'model'>
  private readonly kv: Gauge<'model'>
  private readonly kvModels = new Set<string>()

  constructor(registry: Registry) {
    const registers = [registry]
    this.generation = new Counter({
      name: `${METRIC_PREFIX}model_generation_tokens_total`,
      help: "Output tokens generated by each served model's engines (vllm:generation_tokens_total)",
      labelNames: ['model'],
      registers,
    })
    this.prompt = new Counter({
      name: `${METRIC_PREFIX}model_prompt_tokens_total`,
      help: "Prompt tokens processed by each served model's engines (vllm:prompt_tokens_total)",
      labelNames: ['model'],
      registers,
    })
    this.kv = new Gauge({
      name: `${METRIC_PREFIX}model_kv_cache_usage_ratio`,
      help: "KV-cache use of each served model's active engines, 0-1 (vllm:kv_cache_usage_perc, mean)",
      labelNames: ['model'],
      registers,
    })
  }

  tokens(model: string, generated: number, prompt: number): void {
    this.generation.inc({ model }, generated)
    this.prompt.inc({ model }, prompt)
  }

  kvCacheUsage(model: string, ratio: number): void {
    this.kv.set({ model }, ratio)
    this.kvModels.add(model)
  }

  /** kvCacheKeep drops the KV gauge of models with no active engine left. */
  kvCacheKeep(models: Set<string>): void {
    for (const model of this.kvModels) {
      if (models.has(model)) continue
      this.kv.remove({ model })
      this.kvModels.delete(model)
    }
  }
}

/**
 * KV pool gauges per GPU, from the kvcached segments of the shared-cache engines on it, summed at
 * scrape (SharedCache.usageByGpu, the figures the memory views use). Labelled by GPU index only, so
 * engines coming and going never add series. A GPU without shared-cache engines has no series.
 */
const KV_POOL_FIELDS = [
  ['used', 'usedBytes', 'KV cache memory in use in the shared pool of each GPU (sum of its engines)'],
  [
    'prealloc',
    'preallocBytes',
    'KV cache memory preallocated (mapped, not yet used) in the shared pool of each GPU',
  ],
  ['limit', 'totalBytes', "Sum of the KV limits (kvcached's total) of the shared-cache engines on each GPU"],
] as const

function registerKvPoolMetrics(registry: Registry, service: GatewayService): void {
  for (const [name, field, help] of KV_POOL_FIELDS) {
    new Gauge({
      name: `${METRIC_PREFIX}kv_pool_${name}_bytes`,
      help,
      labelNames: ['gpu'],
      registers: [registry],
      collect() {
        this.reset()
        for (const [gpu, u] of service.sharedCache.usageByGpu())
          this.set({ gpu: String(gpu) }, Math.round(u[field]))
      },
    })
  }
}

/**
 * Lifecycle metrics: how long loads, sleeps and wakes take and how often they go wrong, timed from
 * the `gateway.instance.lifecycle` bus events (`at`, performance.now() of each change), so they
 * measure what every caller sees (the API, the router, a move, a preset load) in one place.
 *
 * Series are labelled by served model name (`model`) and sleep `level`, never by instance id: a
 * move or a preset load replaces instances of the same model, which must not add series.
 *
 * - `modelgate_model_load_duration_seconds{model}`: engine spawned → instance `active`.
 * - `modelgate_model_load_failures_total{model}`: loads that ended `failed` (never active).
 * - `modelgate_model_sleep_duration_seconds{model,level}`: sleep began (routing off, drain
 *   included) → instance `sleeping`.
 * - `modelgate_model_wake_duration_seconds{model,level}`: wake began → instance `active` (the
 *   level it slept at; `unknown` for an engine found asleep after a restart).
 * - `modelgate_model_sleep_verification_failures_total{model,level}`: sleeps that freed less GPU
 *   memory than their level should (`gateway.instance.sleep` with `verified: false`).
 *
 * Beside them, with the same `model` label: the held requests' `modelgate_request_hold_seconds
 * {model,outcome}` (src/directory/wake.ts, registered by the host's model directory); per GPU:
 * `modelgate_kv_pool_*_bytes{gpu}` (above).
 *
 */
export const LOAD_DURATION = `${METRIC_PREFIX}model_load_duration_seconds`

/** registerLifecycleMetrics: the lifecycle metrics of the gateway's instances, once per registry. */
function registerLifecycleMetrics(
  registry: Registry,
  bus: EventBus,
  service: Pick<GatewayService, 'instances'>,
): void {
  if (registry.getSingleMetric(LOAD_DURATION)) return
  new LifecycleMetrics(registry, bus, (id) => service.instances.get(id)?.row.sleep_level ?? null)
}

export const LOAD_BUCKETS_S = [0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 600, 1200]
export const SLEEP_WAKE_BUCKETS_S = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300]

type Level = 1 | 2 | null | undefined

export class LifecycleMetrics {
  private readonly loadDuration: Histogram<'model'>
  private readonly loadFailures: Counter<'model'>
  private readonly sleepDuration: Histogram<'model' | 'level'>
  private readonly wakeDuration: Histogram<'model' | 'level'>
  private readonly sleepVerifyFailures: Counter<'model' | 'level'>
  /** When each instance still loading was spawned; removed once it is active, failed or stopping. */
  private readonly spawnedAt = new Map<string, number>()
  /** The sleep or wake under way on each instance: when it began and (wake) the level slept at. */
  private readonly opBegan = new Map<string, { op: 'sleep' | 'wake'; at: number; level: Level }>()

  constructor(
    registry: Registry,
    bus: EventBus,
    /** sleepLevel: the level an instance sleeps at, as its row says now (null when not known). */
    private readonly sleepLevel: (instanceId: string) => Level,
  ) {
    const registers = [registry]
    this.loadDuration = new Histogram({
      name: LOAD_DURATION,
      help: 'Time from spawning an engine to its instance becoming active, by served model name',
      labelNames: ['model'],
      buckets: LOAD_BUCKETS_S,
      registers,
    })
    this.loadFailures = new Counter({
      name: `${METRIC_PREFIX}model_load_failures_total`,
      help: 'Loads that failed before the instance became active, by served model name',
      labelNames: ['model'],
      registers,
    })
    this.sleepDuration = new Histogram({
      name: `${METRIC_PREFIX}model_sleep_duration_seconds`,
      help: 'Time from a sleep beginning (routing off, drain included) to the instance sleeping, by model and level',
      labelNames: ['model', 'level'],
      buckets: SLEEP_WAKE_BUCKETS_S,
      registers,
    })
    this.wakeDuration = new Histogram({
      name: `${METRIC_PREFIX}model_wake_duration_seconds`,
      help: 'Time from a wake beginning to the instance being active again, by model and the level it slept at',
      labelNames: ['model', 'level'],
      buckets: SLEEP_WAKE_BUCKETS_S,
      registers,
    })
    this.sleepVerifyFailures = new Counter({
      name: `${METRIC_PREFIX}model_sleep_verification_failures_total`,
      help: 'Sleeps after which the engine still held more GPU memory than its level allows, by model and level',
      labelNames: ['model', 'level'],
      registers,
    })
    bus.on('gateway.instance.status', (e) => this.onStatus(e))
    bus.on('gateway.instance.lifecycle', (e) => this.onLifecycle(e))
    bus.on('gateway.instance.sleep', (e) => this.onSleep(e))
  }

  /** onStatus: a load's spawn is announced as `null → starting` (a lifecycle starts in that state). */
  private onStatus(e: InstanceStatusEvent): void {
    if (e.previousStatus === null && e.currentStatus === 'starting')
      this.spawnedAt.set(e.instance.id, performance.now())
  }

  private onLifecycle(e: InstanceLifecycleEvent): void {
    const { change, instance_id: id } = e
    const model = e.served_model_name
    if (change.kind === 'operation') {
      if (change.operation !== 'sleep' && change.operation !== 'wake') return
      if (change.running) {
        const level = change.operation === 'wake' ? this.sleepLevel(id) : null
        this.opBegan.set(id, { op: change.operation, at: e.at, level })
      } else this.opBegan.delete(id)
      return
    }
    if (change.kind !== 'state') return
    const { previous, current } = change
    if (previous === 'starting') {
      const spawned = this.spawnedAt.get(id)
      this.spawnedAt.delete(id)
      if (current === 'active' && spawned !== undefined)
        this.loadDuration.observe({ model }, seconds(e.at - spawned))
      if (current === 'failed') this.loadFailures.inc({ model })
      return
    }
    const began = this.opBegan.get(id)
    if (current === 'sleeping' && began?.op === 'sleep') {
      this.sleepDuration.observe({ model, level: levelLabel(this.sleepLevel(id)) }, seconds(e.at - began.at))
    } else if (previous === 'sleeping' && current === 'active' && began?.op === 'wake') {
      this.wakeDuration.observe({ model, level: levelLabel(began.level) }, seconds(e.at - began.at))
    }
    if (current === 'removed') {
      this.spawnedAt.delete(id)
      this.opBegan.delete(id)
    }
  }

  private onSleep(e: InstanceSleepEvent): void {
    if (e.verified === false)
      this.sleepVerifyFailures.inc({ model: e.served_model_name, level: levelLabel(e.level) })
  }
}

const seconds = (ms: number): number => Math.max(0, ms) / 1000
const levelLabel = (level: Level): string => (level === 1 || level === 2 ? String(level) : 'unknown')
