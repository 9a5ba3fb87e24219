import { type Static, Type as T, type TLiteral } from '@sinclair/typebox'
import { WakeOnRequestKeys } from '../../src/directory/wake.ts'
import { DEFAULT_ENGINE_KIND, ENGINE_KINDS, type EngineKind, engineDriver } from '../../src/engine/kinds.ts'
import type { ValidateContext } from '../../src/host/plugin.ts'

/**
 * RouterConfig is `plugins.router` in the YAML: the controller's own listener, the engines it
 * routes to, whether it follows the gateway plugin's instances, and the auto-sleep policy. Times
 * are whole seconds (positive integers) so a typo fails at start with its dotted path, e.g.
 * `plugins.router.auto_sleep.idle_threshold: must be an integer >= 1`.
 */
const Endpoint = T.Object(
  {
    host: T.String({ default: '127.0.0.1', minLength: 1, description: 'address of the engine' }),
    port: T.Integer({ minimum: 1, maximum: 65535, description: 'port of the engine' }),
    engine_kind: T.Optional(
      T.Union(ENGINE_KINDS.map((k) => T.Literal(k)) as [TLiteral<EngineKind>, ...TLiteral<EngineKind>[]], {
        description: `the engine at that address (${ENGINE_KINDS.join(', ')}; default ${DEFAULT_ENGINE_KIND})`,
      }),
    ),
  },
  { additionalProperties: false, description: 'where the engine serving this name listens' },
)

const ModelEndpoint = T.Object(
  {
    name: T.String({
      minLength: 1,
      description: "model name clients put in `model` (also the engine's served model name)",
    }),
    endpoint: Endpoint,
  },
  { additionalProperties: false },
)

const AutoSleep = T.Object(
  {
    enabled: T.Boolean({ default: false, description: 'put idle models to sleep automatically' }),
    idle_threshold: T.Integer({
      default: 300,
      minimum: 1,
      description: 'seconds without traffic before a model is a sleep candidate',
    }),
    check_interval: T.Integer({
      default: 30,
      minimum: 1,
      description: "seconds between idle checks (each also re-reads the engines' /is_sleeping)",
    }),
    level: T.Integer({
      default: 1,
      minimum: 1,
      maximum: 2,
      description:
        'sleep level of automatic and manual sleeps: 1 offloads weights to CPU RAM, 2 discards them',
    }),
    min_sleep_duration: T.Integer({
      default: 60,
      minimum: 0,
      description:
        'seconds a model stays asleep before a manual wakeup is allowed (requests may always wake it)',
    }),
  },
  {
    additionalProperties: false,
    default: {},
    description: 'automatic sleep of idle models (for gateway models, the residency manager decides)',
  },
)

const ProxyDeadlines = T.Object(
  {
    first_byte_timeout_ms: T.Integer({
      default: 600_000,
      minimum: 1,
      description: 'deadline for the first byte from the engine → 504 upstream_timeout',
    }),
    connect_timeout_ms: T.Integer({
      default: 5_000,
      minimum: 0,
      description: 'deadline for reaching the engine → 504 upstream_connect_timeout; 0 disables the probe',
    }),
  },
  {
    additionalProperties: false,
    default: {},
    description: "the router's upstream deadlines (as the gateway's)",
  },
)

export const RouterConfig = T.Object(
  {
    host: T.String({ default: 'localhost', minLength: 1, description: 'address of the router listener' }),
    port: T.Integer({
      default: 8080,
      minimum: 0,
      maximum: 65535,
      description: 'port of the router listener (0 picks a free port)',
    }),
    models: T.Array(ModelEndpoint, {
      default: [],
      description:
        'engines reached directly by model name (their engine_kind says which engine each is); names are ' +
        "unique, and with auto-sleep on its level must be one each endpoint's engine has",
    }),
    from_gateway: T.Boolean({
      default: true,
      description:
        "also route to the gateway plugin's instances by served model name, kept in sync as they load, " +
        'move and unload (nothing to follow when the gateway plugin is off)',
    }),
    auto_sleep: AutoSleep,
    ...WakeOnRequestKeys,
    health_timeout_ms: T.Integer({
      default: 2_000,
      minimum: 1,
      description: 'deadline of engine /health and /is_sleeping probes',
    }),
    control_timeout: T.Integer({
      default: 300,
      minimum: 1,
      description: 'seconds an engine sleep or wake_up call may take before it counts as not answering',
    }),
    proxy: ProxyDeadlines,
  },
  { additionalProperties: false },
)

export type RouterConfig = Static<typeof RouterConfig>

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1'])
const WILDCARD = new Set(['0.0.0.0', '::', '*'])

/** sameSocket: two listeners on these addresses and one port would collide (the second fails to listen). */
function sameSocket(a: string, b: string): boolean {
  return a === b || WILDCARD.has(a) || WILDCARD.has(b) || (LOOPBACK.has(a) && LOOPBACK.has(b))
}

/**
 * routerProblems is the router plugin's `validate`: a model name routes to one endpoint, so a name
 * given twice is refused; auto-sleep's level must be one every configured engine can sleep at; and
 * the router's listener cannot share the main listener's port.
 */
export function routerProblems(cfg: RouterConfig, { root }: ValidateContext): string[] {
  const problems: string[] = []
  const seen = new Set<string>()
  cfg.models.forEach((m, i) => {
    if (seen.has(m.name)) problems.push(`plugins.router.models[${i}].name: duplicate model name '${m.name}'`)
    seen.add(m.name)
    const driver = engineDriver(m.endpoint.engine_kind ?? DEFAULT_ENGINE_KIND)
    const levels = driver.capabilities.sleepLevels
    if (cfg.auto_sleep.enabled && !levels.includes(cfg.auto_sleep.level as 1 | 2))
      problems.push(
        `plugins.router.models[${i}].endpoint.engine_kind: ${driver.label} sleeps at level ${levels.join(' or ')} ` +
          `only, not plugins.router.auto_sleep.level ${cfg.auto_sleep.level}`,
      )
  })
  if (cfg.port !== 0 && cfg.port === root.server.port && sameSocket(cfg.host, root.server.host))
    problems.push(
      `plugins.router.port: ${cfg.port} is server.port too (hosts ${cfg.host} and ${root.server.host}); the router needs a port of its own`,
    )
  return problems
}
