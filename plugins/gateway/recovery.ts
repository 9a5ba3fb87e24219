import { sameProcess } from '../../src/engine/process.ts'
import { EngineProcess } from '../../src/engine/supervisor.ts'
import type { Logger } from '../../src/host/logger.ts'
import type { GatewayConfig } from './config.ts'
import type { InstanceRow } from './db/schema.ts'
import { ManagedInstance } from './instance.ts'
import type { SharedCache } from './shared-cache.ts'
import type { Supervision } from './supervision.ts'

/** What recovery needs from the service: its instance table and how instances are made and removed. */
export interface RecoveryHost {
  readonly config: GatewayConfig
  readonly log: Logger
  readonly supervision: Supervision
  readonly sharedCache: SharedCache
  rows(): InstanceRow[]
  newInstance(row: InstanceRow): ManagedInstance
  register(inst: ManagedInstance): void
  remove(inst: ManagedInstance, message: string): void
  track(p: Promise<unknown>): void
}

/**
 * recover re-adopts the healthy engines of a previous run and stops the others. A pid is signalled
 * only when it is still the process that was started (pid and start time), never a reused one. An
 * engine whose leader died (with modelgate, or while it was down) may have left its EngineCore and
 * workers running in its group, holding the GPU: those are stopped too, by their group, start time and
 * marker (Supervision.stopEngine), whether the instance is now failed, was already failed or was
 * being stopped.
 */
export async function recover(h: RecoveryHost): Promise<void> {
  const { engine } = h.config
  for (const row of h.rows()) {
    const inst = h.newInstance(row)
    h.register(inst)
    const alive = row.pid !== null && sameProcess(row.pid, row.process_start_time)
    if (!alive || row.status === 'failed') {
      if (!alive && row.status !== 'failed' && row.status !== 'stopping')
        h.supervision.fail(inst, 'engine exited while modelgate was not running')
      const left = await h.supervision.stopEngine(inst)
      if (left !== 'gone')
        h.log.warn('stopped what was left of an engine of a previous run', {
          instance: row.id,
          pgid: row.pgid,
          how: left,
        })
      if (row.status === 'stopping') h.remove(inst, 'engine gone after restart')
      h.sharedCache.cleanup(inst)
      continue
    }
    const healthy = await inst.client.health(2000, { asleep: row.status === 'sleeping' })
    const deadline = Date.parse(row.loaded_at) + engine.startup_timeout_seconds * 1000
    const stillLoading = row.status === 'starting' && Date.now() < deadline
    if (row.status === 'stopping' || (!healthy && !stillLoading)) {
      h.log.warn('stopping engine left by a previous run', { instance: row.id, pid: row.pid })
      if (inst.lifecycle.state !== 'stopping')
        inst.lifecycle.to('stopping', 'stopping an unhealthy engine left by a previous run')
      await h.supervision.stopEngine(inst)
      h.remove(inst, 'stopped after restart (unhealthy)')
      h.sharedCache.cleanup(inst)
      continue
    }
    inst.process = EngineProcess.adopt(
      row.pid!,
      row.pgid ?? row.pid!,
      row.process_start_time!,
      ManagedInstance.logFiles(row.log_dir),
      (stream, line) => h.supervision.onLogLine(inst, stream, line),
    )
    h.supervision.watchExit(inst)
    h.log.info('re-adopted engine from a previous run', { instance: row.id, pid: row.pid, port: row.port })
    if (row.status === 'starting') {
      h.track(h.supervision.awaitReady(inst, deadline))
    } else if (row.enable_sleep_mode) {
      const sleeping = await inst.client.isSleeping().catch(() => row.status === 'sleeping')
      if (sleeping !== (row.status === 'sleeping')) {
        if (!sleeping) {
          row.sleep_level = null
          row.slept_at = null
        }
        inst.lifecycle.to(sleeping ? 'sleeping' : 'active', 're-adopted after restart')
      }
    }
  }
}
