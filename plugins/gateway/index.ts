import { definePlugin } from '../../src/host/plugin.ts'
import type { GatewayApi } from './api.ts'
import { GatewayConfig } from './config.ts'
import { registerGatewayMetrics } from './metrics.ts'
import instancesSql from './migrations/0001_instances.sql' with { type: 'text' }
import { InstanceRepo } from './repo.ts'
import { gatewayRoutes } from './routes.ts'
import { GatewayService } from './service.ts'

/**
 * The gateway plugin: engine lifecycle, GPU and memory views, sleep and wake, inference proxy.
 */
export default definePlugin<typeof GatewayConfig, GatewayApi>({
  id: 'gateway',
  description:
    'Starts and stops vLLM engines, reports GPU and memory, sleeps and wakes models, proxies inference.',
  config: GatewayConfig,
  migrations: [{ id: '0001_instances', sql: instancesSql }],
  setup(ctx, cfg) {
    const service = new GatewayService({
      config: cfg,
      repo: new InstanceRepo(ctx.store.db),
      bus: ctx.bus,
      log: ctx.log,
      dataDir: ctx.dataDir,
      selfCommand: ctx.selfCommand,
    })
    registerGatewayMetrics(ctx.metrics, service)
    return {
      routes: gatewayRoutes(service, cfg.sharedcache.shm_dir),
      api: service,
      start: () => service.recover(),
      stop: (deadline) => service.stop(deadline),
      kill: () => service.kill(),
    }
  },
})
