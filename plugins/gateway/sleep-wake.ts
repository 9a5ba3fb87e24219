import { EngineCallError } from '../../src/engine/vllm-client.ts'
import { AppError, badRequest, conflict } from '../../src/http/errors.ts'
import type { InstanceStatus, SleepResult, WakeResult } from './api.ts'
import type { ManagedInstance } from './instance.ts'
import type { Supervision } from './supervision.ts'

/**
 * Sleep and wake of one instance through the engine's dev-mode endpoints. Each runs as the
 * instance's one operation (lifecycle.ts): a second sleep, wake or move meanwhile gets 409. While
 * an instance goes to sleep it takes no new requests; it becomes sleeping only once the engine
 * said so, and active again only when `/is_sleeping` says it is awake (a wake of some tags only
 * leaves it sleeping).
 */
export class SleepWake {
  constructor(private readonly supervision: Supervision) {}

  async sleep(inst: ManagedInstance, level: 1 | 2): Promise<SleepResult> {
    const id = inst.id
    if (inst.status !== 'active')
      throw conflict(`Instance ${id} is ${inst.status}; only a running instance can sleep`, 'INVALID_STATE')
    if (!inst.row.enable_sleep_mode)
      throw badRequest(`Instance ${id} was loaded without enable_sleep_mode`, 'SLEEP_MODE_NOT_ENABLED')
    inst.lifecycle.begin('sleep')
    try {
      await engineCall(() => inst.client.sleep(level))
      stillThere(inst, 'active')
      const now = new Date().toISOString()
      inst.row.sleep_level = level
      inst.row.slept_at = now
      inst.lifecycle.to('sleeping', `sleep level ${level}`)
      this.supervision.emitMemory(inst, await this.supervision.measureFootprint(inst))
      return {
        status: 'sleeping',
        instance_id: id,
        model_path: inst.row.model_path,
        sleep_level: level,
        slept_at: now,
      }
    } finally {
      inst.lifecycle.end('sleep')
    }
  }

  async wake(inst: ManagedInstance, tags: string[] = []): Promise<WakeResult> {
    const id = inst.id
    if (inst.status !== 'sleeping')
      throw conflict(
        `Instance ${id} is ${inst.status}; only a sleeping instance can be woken`,
        'INVALID_STATE',
      )
    inst.lifecycle.begin('wake')
    try {
      await engineCall(() => inst.client.wake(tags))
      const stillSleeping = await engineCall(() => inst.client.isSleeping())
      stillThere(inst, 'sleeping')
      const now = new Date().toISOString()
      if (!stillSleeping) {
        inst.row.sleep_level = null
        inst.row.slept_at = null
        inst.lifecycle.to('active', tags.length ? `woke (${tags.join(', ')})` : 'woke')
      } else {
        inst.events.emit('progress', { phase: 'waking', percent: 50, message: `woke ${tags.join(', ')}` })
      }
      this.supervision.emitMemory(inst, await this.supervision.measureFootprint(inst))
      return {
        status: stillSleeping ? 'sleeping' : 'running',
        instance_id: id,
        model_path: inst.row.model_path,
        woke_at: now,
        ...(tags.length ? { tags } : {}),
      }
    } finally {
      inst.lifecycle.end('wake')
    }
  }

  /** status is the sleep-status body (spec: not shown; documented in the README). */
  async status(inst: ManagedInstance) {
    let engineSleeping: boolean | null = null
    if (inst.status === 'active' || inst.status === 'sleeping') {
      engineSleeping = inst.row.enable_sleep_mode ? await inst.client.isSleeping().catch(() => null) : false
    }
    return {
      instance_id: inst.id,
      status: inst.status,
      is_sleeping: inst.status === 'sleeping',
      sleep_level: inst.row.sleep_level ?? null,
      slept_at: inst.row.slept_at,
      enable_sleep_mode: inst.row.enable_sleep_mode,
      engine_is_sleeping: engineSleeping,
    }
  }
}

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
