import { engineDriver } from '../../src/engine/kinds.ts'
import { definePlugin } from '../../src/host/plugin.ts'
import type { GatewayPodApi, GatewayProfiles } from './api.ts'
import { catalogRoutes } from './catalog/routes.ts'
import { catalogProblems } from './catalog/rules.ts'
import { CatalogStore } from './catalog/store.ts'
import { GatewayConfig, gatewayProblems } from './config.ts'
import { gatewayFeed } from './dashboard/events.ts'
import { gatewayDashboard } from './dashboard/pages.ts'
import { timeseriesRoutes } from './dashboard/routes.ts'
import instancesSql from './db/migrations/0001_instances.sql' with { type: 'text' }
import presetsProfilesSql from './db/migrations/0002_presets_profiles.sql' with { type: 'text' }
import catalogSql from './db/migrations/0003_catalog.sql' with { type: 'text' }
import engineKindSql from './db/migrations/0004_engine_kind.sql' with { type: 'text' }
import catalogEngineKindSql from './db/migrations/0005_catalog_engine_kind.sql' with { type: 'text' }
import presetEngineKindSql from './db/migrations/0006_preset_engine_kind.sql' with { type: 'text' }
import { EngineFigures, registerGatewayMetrics } from './metrics.ts'
import { moveRoutes } from './move/routes.ts'
import { orphanRoutes } from './orphans/routes.ts'
import { OrphanService } from './orphans/service.ts'
import { PodGateway } from './pod-gateway.ts'
import { presetRoutes } from './presets/routes.ts'
import { PresetService } from './presets/service.ts'
import { estimateNeed, makePreloadCheck } from './profiles/check.ts'
import { profileRoutes } from './profiles/routes.ts'
import { ProfileRecorder, ProfileStore } from './profiles/service.ts'
import { createInference } from './proxy/routes.ts'
import { InstanceRepo } from './repo.ts'
import { catalogSource } from './residency/catalog-backend.ts'
import { ResidencyManager } from './residency/manager.ts'
import { residencyRoutes } from './residency/routes.ts'
import { gatewayRoutes } from './routes.ts'
import { type GatewayDeps, gpuProbe } from './service.ts'
import { settingsRoutes } from './settings/routes.ts'
import { SettingsStore } from './settings/service.ts'
import { TimeSeriesSampler } from './timeseries/sampler.ts'

/**
 * The gateway plugin: engine lifecycle, GPU and memory views, sleep and wake, inference proxy.
 */
export default definePlugin<typeof GatewayConfig, GatewayPodApi>({
  id: 'gateway',
  description:
    'Starts and stops inference engines (vLLM, …), reports GPU and memory, sleeps and wakes models, proxies inference.',
  config: GatewayConfig,
  dashboard: gatewayDashboard,
  // The catalogue's rules (a name that is a path or repeats, what a load would refuse) need the
  // load's own checks (launch.ts), which need config.ts: they are added here, not in config.ts.
  validate: (cfg, ctx) => [
    ...gatewayProblems(cfg, ctx),
    ...catalogProblems(cfg.catalog, 'plugins.gateway.catalog', engineDriver(cfg.engine.kind)),
  ],
  migrations: [
    { id: '0001_instances', sql: instancesSql },
    { id: '0002_presets_profiles', sql: presetsProfilesSql },
    { id: '0003_catalog', sql: catalogSql },
    { id: '0004_engine_kind', sql: engineKindSql },
    { id: '0005_catalog_engine_kind', sql: catalogEngineKindSql },
    { id: '0006_preset_engine_kind', sql: presetEngineKindSql },
  ],
  setup(ctx, cfg) {
    const settings = new SettingsStore(ctx.dataDir, ctx.log.child('settings'))
    const repo = new InstanceRepo(ctx.store.db)
    const probe = gpuProbe(cfg, ctx.selfCommand)
    const snapshots = { gpuSnapshot: () => probe.snapshot() }
    const profiles = new ProfileStore(ctx.store.db)
    const checkOptions = { defaultUtilization: cfg.engine.gpu_memory_utilization }
    const estimate: GatewayProfiles['estimate'] = (q) =>
      estimateNeed(profiles, q, checkOptions.defaultUtilization)
    const catalog = new CatalogStore({
      db: ctx.store.db,
      config: cfg.catalog,
      configFile: ctx.configFile,
      bus: ctx.bus,
      log: ctx.log.child('catalog'),
      snapshot: snapshots.gpuSnapshot,
      estimate,
      engineKind: cfg.engine.kind,
    })
    // engineEnv reaches launchPlan through the deps (its `where`): HF_TOKEN from the settings.
    const deps: GatewayDeps & { engineEnv: () => Record<string, string> } = {
      config: cfg,
      repo,
      bus: ctx.bus,
      log: ctx.log,
      dataDir: ctx.dataDir,
      selfCommand: ctx.selfCommand,
      engineEnv: () => settings.engineEnv(),
      telemetry: ctx.telemetry,
      probe,
      preloadCheck: makePreloadCheck(profiles, snapshots, checkOptions),
      catalogue: catalog,
    }
    // The gateway, then what is built on it, in order (PodParts).
    const service = new PodGateway(deps, {
      profiles: { list: () => profiles.list(), importAll: (ps) => profiles.importAll(ps), estimate },
      presets: (gateway) =>
        new PresetService(ctx.store.db, gateway, ctx.bus, ctx.log, {
          unloadTimeoutMs: (cfg.engine.stop_grace_seconds + 30) * 1000,
          readyTimeoutMs: (cfg.engine.startup_timeout_seconds + 30) * 1000,
          telemetry: ctx.telemetry,
        }),
      // What is resident on this host's GPUs: catalogued models on demand, room made by measured cost.
      residency: (gateway) => {
        const residency = new ResidencyManager({
          service: gateway,
          catalog: { entries: () => catalog.list(), entry: (name) => catalog.get(name) },
          config: cfg.residency,
          defaultUtilization: cfg.engine.gpu_memory_utilization,
          defaultEngineKind: cfg.engine.kind,
          bus: ctx.bus,
          log: ctx.log.child('residency'),
          metrics: ctx.metrics,
          held: (model) => ctx.directory.held(model),
        })
        ctx.directory.addSource(catalogSource(residency))
        return residency
      },
      inference: (gateway) =>
        createInference({
          api: gateway,
          directory: ctx.directory,
          bus: ctx.bus,
          metrics: ctx.metrics,
          log: ctx.log,
          config: {
            firstByteTimeoutMs: cfg.proxy.first_byte_timeout_ms,
            connectTimeoutMs: cfg.proxy.connect_timeout_ms,
            idleTimeoutSeconds: ctx.config.server.idle_timeout_seconds,
            wakeOnRequest: cfg.proxy.wake_on_request,
            holdTimeoutSeconds: cfg.proxy.hold_timeout,
            maxJsonDepth: ctx.config.server.max_json_depth,
          },
        }),
    })
    const { presets, residency, proxy: inference } = service
    const orphans = new OrphanService({
      probe: service.probe,
      managed: () => [...[...service.instances.values()].map((i) => i.row), ...repo.all()],
      dataDir: ctx.dataDir,
      graceMs: cfg.engine.stop_grace_seconds * 1000,
      log: ctx.log.child('orphans'),
    })
    registerGatewayMetrics(ctx.metrics, service, ctx.bus)
    const timeseries = new TimeSeriesSampler({
      bus: ctx.bus,
      instances: () => service.instances.values(),
      figures: new EngineFigures(ctx.metrics),
      log: ctx.log.child('timeseries'),
    })
    const recorder = new ProfileRecorder(profiles, service, ctx.bus, ctx.log)
    return {
      rawRoutes: inference.rawRoutes,
      routes: gatewayRoutes(service, service.records, cfg.sharedcache.shm_dir)
        .use(inference.routes)
        .use(moveRoutes(service.moves))
        .use(profileRoutes(profiles, service, { ...checkOptions, version: ctx.version }))
        .use(presetRoutes(presets))
        .use(residencyRoutes(residency))
        .use(catalogRoutes(catalog))
        .use(settingsRoutes(settings))
        .use(orphanRoutes(orphans))
        .use(timeseriesRoutes(timeseries)),
      live: gatewayFeed({
        bus: ctx.bus,
        list: () => service.list(),
        events: (id) => service.instances.get(id)?.events,
        timeseries,
      }),
      api: service,
      start: async () => {
        await service.recover()
        timeseries.start()
        await catalog.reviewConfig()
        // Preloads run behind the start: the host answers (health, the dashboard) while they load.
        void residency.start()
      },
      stop: async (deadline) => {
        residency.stop()
        timeseries.stop()
        await presets.stop()
        await service.stop(deadline)
        await recorder.stop()
      },
      kill: () => service.kill(),
    }
  },
})
