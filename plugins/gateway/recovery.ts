import { sameProcess, stopGroup } from '../../src/engine/process.ts'
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
 * only when it is still the process that was started (pid and start time), never a reused one.
 */
export async function recover(h: RecoveryHost): Promise<void> {
  const { engine } = h.config
  for (const row of h.rows()) {
    const inst = h.newInstance(row)
    h.register(inst)
    if (row.status === 'failed') continue
    const alive = row.pid !== null && sameProcess(row.pid, row.process_start_time)
    if (!alive) {
      if (row.status === 'stopping') h.remove(inst, 'engine gone after restart')
      else h.supervision.fail(inst, 'engine exited while modelgate was not running')
      h.sharedCache.cleanup(inst)
      continue
    }
    const healthy = await inst.client.health(2000)
    const deadline = Date.parse(row.loaded_at) + engine.startup_timeout_seconds * 1000
    const stillLoading = row.status === 'starting' && Date.now() < deadline
    if (row.status === 'stopping' || (!healthy && !stillLoading)) {
      h.log.warn('stopping engine left by a previous run', { instance: row.id, pid: row.pid })
      if (inst.lifecycle.state !== 'stopping')
        inst.lifecycle.to('stopping', 'stopping an unhealthy engine left by a previous run')
      await stopGroup(row.pgid ?? row.pid!, engine.stop_grace_seconds * 1000)
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
