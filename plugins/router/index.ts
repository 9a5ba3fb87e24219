import { definePlugin } from '../../src/host/plugin.ts'
import { RouterConfig } from './config.ts'
import { routerRoutes } from './routes.ts'
import { RouterService } from './service.ts'

/**
 * The router plugin: the standalone traffic-routing controller of router-api.md on its own
 * listener (with its own /docs). It routes OpenAI-style inference to configured vLLM endpoints
 * and, when the gateway plugin is on and `from_gateway` is set, to the gateway's instances; it
 * keeps traffic statistics and sleeps idle models. It does not depend on the gateway: alone it
 * routes the configured endpoints only.
 */
const DESCRIPTION =
  'Traffic-routing controller: OpenAI-compatible /v1 inference routed by model name, traffic statistics, ' +
  'sleep and wake of models (manual and automatic after an idle threshold), health. No authentication: ' +
  'put it behind a reverse proxy that adds it. Every error has the shape {error: {message, type, code}}.'

export default definePlugin({
  id: 'router',
  description: 'Routes inference to configured endpoints, tracks traffic, sleeps idle models.',
  config: RouterConfig,
  setup(ctx, cfg) {
    const names = new Set<string>()
    cfg.models.forEach((m, i) => {
      if (names.has(m.name))
        throw new Error(`plugins.router.models[${i}].name: duplicate model name '${m.name}'`)
      names.add(m.name)
    })
    const service = new RouterService(cfg, ctx)
    return {
      listeners: [
        {
          name: 'router',
          host: cfg.host,
          port: cfg.port,
          app: routerRoutes(service, ctx.log),
          rawRoutes: service.inference.rawRoutes(),
          errorShape: 'proxy',
          title: 'modelgate router',
          description: DESCRIPTION,
        },
      ],
      api: service,
      start: () => service.start(),
      stop: () => service.stop(),
    }
  },
})
