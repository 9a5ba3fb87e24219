import { definePlugin } from '../../src/host/plugin.ts'
import { RouterConfig, routerProblems } from './config.ts'
import { routerDashboardRoutes } from './dashboard/routes.ts'
import { routerRoutes } from './routes.ts'
import { RouterService } from './service.ts'

/**
 * The router plugin: the standalone traffic-routing controller (README "Router plugin") on its own
 * listener (with its own /docs). It routes OpenAI-style inference to configured vLLM endpoints
 * and, when the gateway plugin is on and `from_gateway` is set, to the gateway's instances; it
 * keeps traffic statistics and sleeps idle models. It does not depend on the gateway: alone it
 * routes the configured endpoints only. Beside the gateway it honours the gateway's inference key
 * for the gateway's models (access.ts): the router is no way around it.
 */
const DESCRIPTION =
  'Traffic-routing controller: OpenAI-compatible /v1 inference routed by model name, traffic statistics, ' +
  'sleep and wake of models (manual and automatic after an idle threshold), health. Authentication: ' +
  'none for standalone models (`plugins.router.models`, the default: put the router behind a ' +
  'reverse proxy that adds it). With `auth.inference_api_key` set and the router following the gateway, ' +
  "the gateway's models need that key (`Authorization: Bearer <key>`, 401 missing_api_key / " +
  'invalid_api_key otherwise) on POST /v1/chat/completions, POST /v1/completions, POST ' +
  '/action/sleep/{model_name} and POST /action/wakeup/{model_name}; so does a model name the router ' +
  'does not know. GET /models and /v1/models then list the standalone models and those the key may use ' +
  '(engine addresses for an admin token only). The other read-only routes (/models/*, /traffic/stats*, ' +
  '/sleep/*, /health*, /get_server_info) need no key. Every error has the shape {error: {message, type, code}}.'

export interface RouterOptions {
  /** the router's clock (epoch ms); Date.now unless a test moves time forward itself */
  now?: () => number
}

/** routerPlugin: the plugin definition, with its clock (the default export uses Date.now). */
export const routerPlugin = (opts: RouterOptions = {}) =>
  definePlugin({
    id: 'router',
    description: 'Routes inference to configured endpoints, tracks traffic, sleeps idle models.',
    config: RouterConfig,
    // Its page on the host's dashboard, fed by the overview it publishes on change (dashboard/changes.ts).
    dashboard: {
      client: `${import.meta.dir}/dashboard/client.ts`,
      pages: [{ id: 'router', title: 'Router', nav: 'Router', path: '/router' }],
      events: ['router.changed'],
    },
    // Duplicate model names and a port shared with the main listener: refused before setup runs.
    validate: routerProblems,
    setup(ctx, cfg) {
      const service = new RouterService(cfg, ctx, opts.now)
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
        routes: routerDashboardRoutes(service, () => ctx.auth.ownInferenceKey() ?? undefined),
        api: service,
        start: () => service.start(),
        stop: () => service.stop(),
      }
    },
  })

export default routerPlugin()
