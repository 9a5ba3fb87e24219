import { randomUUID } from 'node:crypto'
import { asc, count, desc, eq } from 'drizzle-orm'
import type { BunSQLiteDatabase } from 'drizzle-orm/bun-sqlite'
import { WaitError } from '../../../src/host/abortable.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import { ReplayHub } from '../../../src/host/hub.ts'
import type { Logger } from '../../../src/host/logger.ts'
import type { SpanBase, TraceSpan } from '../../../src/host/telemetry/spans.ts'
import { Telemetry } from '../../../src/host/telemetry/telemetry.ts'
import { badRequest, conflict, notFound } from '../../../src/http/errors.ts'
import type { GatewayApi, InstanceRecord, LoadRequest, LoadResponse } from '../api.ts'
import {
  gatewayPresetEntries,
  gatewayPresets,
  type PresetEntryRow,
  type PresetSourceType,
} from '../db/presets.ts'
import type { InstanceState, WaitOptions } from '../lifecycle.ts'

/**
 * PresetService keeps configuration presets (named sets of models saved from what runs) and loads
 * one: unload everything, then load the entries, one after another on GPUs they share (in
 * loadOrder, each waiting for active or failed) and in parallel on disjoint GPUs. Progress goes out
 * as `gateway.preset.progress` bus events beside the instances' own events, and on `progress`, whose
 * replay is the latest event (a client that connects mid-load sees where it is).
 */
import type { PresetDetail, PresetEntry, PresetSummary, PresetSyncResult } from './types.ts'

export type { PresetDetail, PresetEntry, PresetSummary, PresetSyncResult }

export type PresetPhase = 'unloading' | 'loading' | 'completed' | 'failed'

export interface PresetProgressEvent {
  configId: string
  configName: string
  phase: PresetPhase
  loaded: number
  failed: number
  total: number
  message: string
  /** modelPath and instanceId name the entry a `loading` event is about. */
  modelPath?: string
  instanceId?: string
}

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    'gateway.preset.progress': PresetProgressEvent
    /** a preset saved or deleted through this pod's API (not by a sync) */
    'gateway.presets.changed': { id: string; change: 'saved' | 'deleted' }
  }
}

export interface PresetOptions {
  /** unloadTimeoutMs bounds waiting for the current models to be gone. */
  unloadTimeoutMs: number
  /** readyTimeoutMs bounds waiting for one entry to become active or failed. */
  readyTimeoutMs: number
  /** telemetry: an apply is a trace, its unloads and each entry's load in it (default off). */
  telemetry?: Telemetry
}

/** What a preset load drives: the gateway's API and a wait on an instance's state. */
type PresetGateway = Pick<GatewayApi, 'list' | 'get' | 'unload' | 'moveInProgress'> & {
  load(req: LoadRequest, opts?: { trace?: SpanBase | null }): Promise<LoadResponse>
  waitFor(id: string, ready: (s: InstanceState) => boolean, opts: WaitOptions): Promise<InstanceState>
}

/** sourceType: local paths start with / or .; anything else is a model-hub path. */
export function sourceType(modelPath: string): PresetSourceType {
  return modelPath.startsWith('/') || modelPath.startsWith('.') ? 'local' : 'huggingface'
}

const toEntry = (r: PresetEntryRow): PresetEntry => ({
  id: r.id,
  modelPath: r.model_path,
  servedModelName: r.served_model_name,
  maxTokens: r.max_tokens,
  sourceType: r.source_type,
  gpuIds: r.gpu_ids,
  tensorParallelSize: r.tensor_parallel_size,
  extraArgs: r.extra_args,
  loadOrder: r.load_order,
  enableSleepMode: r.enable_sleep_mode,
  gpuMemoryUtilization: r.gpu_memory_utilization,
  engineKind: r.engine_kind ?? null,
})

/** loadChains groups entries that share a GPU (transitively) into chains ordered by loadOrder. */
export function loadChains(entries: PresetEntry[]): PresetEntry[][] {
  let chains: { gpus: Set<number>; entries: PresetEntry[] }[] = []
  for (const e of [...entries].sort((a, b) => a.loadOrder - b.loadOrder)) {
    const gpus = e.gpuIds.length ? e.gpuIds : [-1]
    const touching = chains.filter((c) => gpus.some((g) => c.gpus.has(g)))
    chains = chains.filter((c) => !touching.includes(c))
    chains.push({
      gpus: new Set([...gpus, ...touching.flatMap((c) => [...c.gpus])]),
      entries: [...touching.flatMap((c) => c.entries), e],
    })
  }
  return chains.map((c) => c.entries.sort((a, b) => a.loadOrder - b.loadOrder))
}

export class PresetService {
  /** progress: every preset load's events; the latest one is replayed to a new subscriber. */
  readonly progress = new ReplayHub<PresetProgressEvent>({ keep: () => 'latest' })
  private running: { id: string; name: string; abort: AbortController; task: Promise<void> } | null = null

  constructor(
    private readonly db: BunSQLiteDatabase,
    private readonly gateway: PresetGateway,
    private readonly bus: EventBus,
    private readonly log: Logger,
    private readonly opts: PresetOptions,
  ) {}

  list(): PresetSummary[] {
    const counts = new Map(
      this.db
        .select({ id: gatewayPresetEntries.preset_id, n: count() })
        .from(gatewayPresetEntries)
        .groupBy(gatewayPresetEntries.preset_id)
        .all()
        .map((r) => [r.id, r.n]),
    )
    return this.db
      .select()
      .from(gatewayPresets)
      .orderBy(desc(gatewayPresets.created_at))
      .all()
      .map((p) => ({
        id: p.id,
        name: p.name,
        description: p.description,
        modelCount: counts.get(p.id) ?? 0,
        createdAt: p.created_at,
        updatedAt: p.updated_at,
      }))
  }

  detail(id: string): PresetDetail {
    const p = this.db.select().from(gatewayPresets).where(eq(gatewayPresets.id, id)).get()
    if (!p) throw notFound(`No configuration with id '${id}'`, 'CONFIGURATION_NOT_FOUND')
    const entries = this.db
      .select()
      .from(gatewayPresetEntries)
      .where(eq(gatewayPresetEntries.preset_id, id))
      .orderBy(asc(gatewayPresetEntries.load_order))
      .all()
      .map(toEntry)
    const { created_at: createdAt, updated_at: updatedAt, ...rest } = p
    return { ...rest, createdAt, updatedAt, modelCount: entries.length, entries }
  }

  /** save stores the running models (active or sleeping), in the order they were loaded. */
  save(input: { name: string; description?: string | undefined }): PresetSummary {
    const name = input.name.trim()
    if (!name) throw badRequest('body.name: must not be blank')
    const taken = this.db.select({ name: gatewayPresets.name }).from(gatewayPresets).all()
    if (taken.some((p) => p.name.toLowerCase() === name.toLowerCase()))
      throw conflict(`A configuration named '${name}' already exists`, 'CONFIGURATION_EXISTS')
    const running = this.gateway
      .list()
      .filter((i) => i.status === 'active' || i.status === 'sleeping')
      .sort((a, b) => a.loaded_at.localeCompare(b.loaded_at) || a.id.localeCompare(b.id))
    if (!running.length) throw badRequest('No running models to save', 'NO_RUNNING_MODELS')
    const now = new Date().toISOString()
    const id = randomUUID()
    const description = input.description?.trim() || null
    this.db.transaction((tx) => {
      tx.insert(gatewayPresets).values({ id, name, description, created_at: now, updated_at: now }).run()
      running.forEach((r: InstanceRecord, i) => {
        tx.insert(gatewayPresetEntries)
          .values({
            id: randomUUID(),
            preset_id: id,
            model_path: r.model_path,
            served_model_name: r.served_model_name,
            max_tokens: r.max_tokens,
            source_type: sourceType(r.model_path),
            gpu_ids: r.gpu_ids,
            tensor_parallel_size: r.tensor_parallel_size,
            extra_args: r.extra_args,
            enable_sleep_mode: r.enable_sleep_mode,
            gpu_memory_utilization: r.gpu_memory_utilization,
            load_order: i,
            engine_kind: r.engine_kind,
          })
          .run()
      })
    })
    this.log.info('configuration saved', { id, name, models: running.length })
    this.bus.emit('gateway.presets.changed', { id, change: 'saved' })
    return { id, name, description, modelCount: running.length, createdAt: now, updatedAt: now }
  }

  delete(id: string): void {
    this.detail(id)
    this.db.transaction((tx) => {
      tx.delete(gatewayPresetEntries).where(eq(gatewayPresetEntries.preset_id, id)).run()
      tx.delete(gatewayPresets).where(eq(gatewayPresets.id, id)).run()
    })
    this.bus.emit('gateway.presets.changed', { id, change: 'deleted' })
  }

  /**
   * sync takes presets from the cluster's leader, keeping their ids: a new id is created, a known one
   * replaced when the incoming updatedAt is newer (entries and all), and nothing is deleted (a pod's
   * own presets stay). A preset whose name another preset here already has (another id) is left out
   * and reported: names are unique per pod.
   */
  sync(presets: readonly PresetDetail[]): PresetSyncResult {
    const result: PresetSyncResult = { created: 0, updated: 0, unchanged: 0, conflicts: [] }
    for (const p of presets) {
      const here = this.db.select().from(gatewayPresets).where(eq(gatewayPresets.id, p.id)).get()
      if (here && Date.parse(here.updated_at) >= Date.parse(p.updatedAt)) {
        result.unchanged++
        continue
      }
      const clash = this.db
        .select({ id: gatewayPresets.id, name: gatewayPresets.name })
        .from(gatewayPresets)
        .all()
        .find((x) => x.id !== p.id && x.name.toLowerCase() === p.name.toLowerCase())
      if (clash) {
        result.conflicts.push({ id: p.id, name: p.name, reason: `a configuration '${p.name}' exists here` })
        continue
      }
      this.db.transaction((tx) => {
        tx.delete(gatewayPresetEntries).where(eq(gatewayPresetEntries.preset_id, p.id)).run()
        tx.delete(gatewayPresets).where(eq(gatewayPresets.id, p.id)).run()
        tx.insert(gatewayPresets)
          .values({
            id: p.id,
            name: p.name,
            description: p.description,
            created_at: p.createdAt,
            updated_at: p.updatedAt,
          })
          .run()
        for (const e of p.entries)
          tx.insert(gatewayPresetEntries)
            .values({
              id: e.id,
              preset_id: p.id,
              model_path: e.modelPath,
              served_model_name: e.servedModelName,
              max_tokens: e.maxTokens,
              source_type: e.sourceType,
              gpu_ids: e.gpuIds,
              tensor_parallel_size: e.tensorParallelSize,
              extra_args: e.extraArgs,
              enable_sleep_mode: e.enableSleepMode,
              gpu_memory_utilization: e.gpuMemoryUtilization,
              load_order: e.loadOrder,
              engine_kind: e.engineKind ?? null,
            })
            .run()
      })
      result[here ? 'updated' : 'created']++
    }
    return result
  }

  /** startLoad begins loading a preset in the background; 409 while another preset load runs. */
  startLoad(id: string) {
    const preset = this.detail(id)
    if (this.running)
      throw conflict(
        `Configuration '${this.running.name}' is still loading; wait for it to finish`,
        'CONFIGURATION_LOAD_IN_PROGRESS',
      )
    if (this.gateway.moveInProgress())
      throw conflict(
        'A model move is in progress; load the configuration when it has finished',
        'MOVE_IN_PROGRESS',
      )
    const abort = new AbortController()
    const task = this.apply(preset, abort.signal).finally(() => {
      this.running = null
    })
    this.running = { id, name: preset.name, abort, task }
    return {
      status: 'started' as const,
      configId: id,
      configName: preset.name,
      modelCount: preset.modelCount,
    }
  }

  /** stop abandons a running preset load (no further entries start) and waits for it to notice. */
  async stop(): Promise<void> {
    const run = this.running
    if (!run) return
    run.abort.abort()
    await run.task
  }

  private async apply(preset: PresetDetail, signal: AbortSignal): Promise<void> {
    const span = (this.opts.telemetry ?? Telemetry.OFF).operation('gateway.preset.apply', {
      'modelgate.preset_id': preset.id,
      'modelgate.preset_name': preset.name,
      'modelgate.preset.models': preset.modelCount,
    })
    let failure: string | undefined
    try {
      failure = await this.applyTraced(preset, signal, span)
    } finally {
      span.end(failure)
    }
  }

  /** applyTraced: the apply; answers its failure (none: it ran to the end, entries may have failed). */
  private async applyTraced(
    preset: PresetDetail,
    signal: AbortSignal,
    span: TraceSpan,
  ): Promise<string | undefined> {
    const tally = { loaded: 0, failed: 0 }
    const emit = (phase: PresetPhase, message: string, extra: Partial<PresetProgressEvent> = {}) => {
      const event = {
        configId: preset.id,
        configName: preset.name,
        phase,
        ...tally,
        total: preset.modelCount,
      }
      const progress = { ...event, message, ...extra }
      this.progress.publish(progress)
      this.bus.emit('gateway.preset.progress', progress)
      this.log.info(`configuration ${preset.name}: ${message}`, { phase })
    }
    const unloads = span.child('preset.unload_all')
    try {
      await this.unloadAll(signal, emit).finally(() => unloads.end())
      const chains = loadChains(preset.entries)
      emit('loading', `loading ${preset.modelCount} model(s) in ${chains.length} parallel chain(s)`)
      await Promise.all(chains.map((chain) => this.loadChain(chain, signal, tally, emit, span)))
      emit('completed', `${tally.loaded} of ${preset.modelCount} model(s) loaded, ${tally.failed} failed`)
      span.setAttributes({ 'modelgate.preset.loaded': tally.loaded, 'modelgate.preset.failed': tally.failed })
      return undefined
    } catch (err) {
      emit('failed', `configuration load stopped: ${(err as Error).message}`)
      return (err as Error).message
    }
  }

  private async unloadAll(signal: AbortSignal, emit: (p: PresetPhase, m: string) => void): Promise<void> {
    const current = this.gateway.list()
    emit('unloading', `unloading ${current.length} model(s)`)
    for (const r of current) {
      if (r.status === 'stopping') continue
      // An instance that vanished meanwhile (unloaded elsewhere) is already what we want.
      await this.gateway.unload(r.id).catch((err: { status?: number }) => {
        if (err.status !== 404) throw err
      })
    }
    const deadline = AbortSignal.timeout(this.opts.unloadTimeoutMs)
    const gone = current.map((r) =>
      this.gateway
        .waitFor(r.id, (s) => s === 'removed', { signal: AbortSignal.any([signal, deadline]) })
        .catch((err) => {
          if (signal.aborted) throw new Error('preset load aborted')
          if (!(err instanceof WaitError)) throw err
        }),
    )
    await Promise.all(gone)
    const left = current.filter((r) => this.gateway.get(r.id)).map((r) => r.id)
    if (left.length)
      throw new Error(`models still present after ${this.opts.unloadTimeoutMs / 1000} s: ${left.join(', ')}`)
  }

  private async loadChain(
    chain: PresetEntry[],
    signal: AbortSignal,
    tally: { loaded: number; failed: number },
    emit: (p: PresetPhase, m: string, extra?: Partial<PresetProgressEvent>) => void,
    span: SpanBase,
  ): Promise<void> {
    for (const e of chain) {
      if (signal.aborted) throw new Error('preset load aborted')
      const where = e.gpuIds.length ? `GPU ${e.gpuIds.join(', ')}` : 'any GPU'
      let instanceId: string
      try {
        instanceId = (await this.gateway.load(loadRequest(e), { trace: span })).instance_id
      } catch (err) {
        tally.failed++
        emit('loading', `${e.modelPath} on ${where} refused: ${(err as Error).message}`, {
          modelPath: e.modelPath,
        })
        continue
      }
      emit('loading', `${e.modelPath} starting on ${where}`, { modelPath: e.modelPath, instanceId })
      const settled = (s: InstanceState) => s === 'active' || s === 'failed' || s === 'removed'
      const outcome = await this.gateway
        .waitFor(instanceId, settled, { signal, timeoutMs: this.opts.readyTimeoutMs })
        .catch((err) => {
          if (err instanceof WaitError && err.kind === 'timeout') return undefined
          if (signal.aborted) throw new Error('preset load aborted')
          throw err
        })
      if (outcome === 'active') tally.loaded++
      else tally.failed++
      const error = this.gateway.get(instanceId)?.error
      const what =
        outcome === 'active'
          ? 'is active'
          : `did not become active (${outcome ?? 'timed out'}${error ? `: ${error}` : ''})`
      emit('loading', `${e.modelPath} ${what}`, { modelPath: e.modelPath, instanceId })
    }
  }
}

/** loadRequest: an entry as the gateway's load body (sleep mode, extra args, utilization and engine kept). */
function loadRequest(e: PresetEntry): LoadRequest {
  return {
    model_path: e.modelPath,
    served_model_name: e.servedModelName,
    ...(e.maxTokens !== null ? { max_tokens: e.maxTokens } : {}),
    ...(e.gpuIds.length ? { gpu_ids: e.gpuIds } : {}),
    tensor_parallel_size: e.tensorParallelSize,
    extra_args: e.extraArgs,
    enable_sleep_mode: e.enableSleepMode,
    ...(e.gpuMemoryUtilization !== null ? { gpu_memory_utilization: e.gpuMemoryUtilization } : {}),
    ...(e.engineKind ? { engine_kind: e.engineKind } : {}),
  }
}
