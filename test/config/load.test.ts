import { describe, expect, it } from 'bun:test'
import { Type as T } from '@sinclair/typebox'
import { ConfigError, loadConfig, type PluginSchemaInfo } from '../../src/config/load.ts'

const known = new Map<string, PluginSchemaInfo>([
  [
    'alpha',
    {
      schema: T.Object(
        {
          port: T.Integer({ default: 8080, minimum: 1 }),
          nested: T.Object(
            { threshold: T.Integer({ default: 300, minimum: 1 }) },
            { additionalProperties: false, default: {} },
          ),
        },
        { additionalProperties: false },
      ),
      dependsOn: [],
    },
  ],
  ['beta', { schema: T.Object({}, { additionalProperties: false }), dependsOn: ['alpha'] }],
])

function problems(yaml: string, env: Record<string, string> = {}, plugins = known): string[] {
  try {
    loadConfig(yaml, env, plugins)
  } catch (err) {
    if (err instanceof ConfigError) return err.problems
    throw err
  }
  return []
}

describe('config loading', () => {
  it('applies defaults to an empty document', () => {
    const { root, plugins } = loadConfig('', {}, known)
    expect(root.server).toEqual({
      host: '127.0.0.1',
      port: 3000,
      idle_timeout_seconds: 120,
      request_head_timeout_seconds: 60,
      min_body_bytes_per_second: 1024,
      max_connections: 0,
      max_connections_per_address: 1024,
      max_admin_body_bytes: 16 * 1024 * 1024,
      max_buffered_body_bytes: 512 * 1024 * 1024,
      max_json_depth: 64,
      login_attempts_per_minute: 10,
    })
    expect(root.shutdown).toEqual({ timeout_ms: 30000, drain_ms: 25000 })
    expect(root.auth.mode).toBe('none')
    expect(root.log.level).toBe('info')
    expect(plugins.size).toBe(0)
  })

  it('interpolates ${VAR} and ${VAR:-default} and coerces to the schema type', () => {
    const { root } = loadConfig(
      'server:\n  port: ${PORT}\n  host: ${HOST:-0.0.0.0}\n',
      { PORT: '4100' },
      known,
    )
    expect(root.server.port).toBe(4100)
    expect(root.server.host).toBe('0.0.0.0')
  })

  it('reports an unset variable without default by its dotted path', () => {
    expect(problems('server:\n  host: ${NOPE}\n')).toContain(
      'server.host: environment variable NOPE is not set',
    )
  })

  it('lets the spec environment variables override the YAML', () => {
    const env = {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: 'pw',
      JWT_SECRET: 'x'.repeat(32),
      INFERENCE_API_KEY: 'k',
    }
    const { root } = loadConfig('auth:\n  mode: none\n', env, known)
    expect(root.auth.mode).toBe('simple')
    expect(root.auth.admin_password).toBe('pw')
    expect(root.auth.inference_api_key).toBe('k')
  })

  it('maps the OAuth and cluster variables', () => {
    const env = {
      AUTH_MODE: 'oauth',
      JWT_SECRET: 'y'.repeat(40),
      OAUTH_ISSUER_URL: 'https://idp',
      OAUTH_CLIENT_ID: 'id',
      OAUTH_CLIENT_SECRET: 'sec',
      K8S_API_URL: 'https://k8s',
      API_BASE_URL: 'https://me',
      CLUSTER_SECRET: 'z'.repeat(16),
    }
    const { root } = loadConfig('', env, known)
    expect(root.auth.oauth).toEqual({
      issuer_url: 'https://idp',
      client_id: 'id',
      client_secret: 'sec',
      k8s_api_url: 'https://k8s',
      api_base_url: 'https://me',
    })
    expect(root.auth.cluster_secret).toBe('z'.repeat(16))
  })

  it('names an unknown key by its dotted path', () => {
    expect(problems('server:\n  prot: 1\n')).toContain('server.prot: unknown key')
    expect(problems('plugins:\n  alpha:\n    nested:\n      treshold: 3\n')).toContain(
      'plugins.alpha.nested.treshold: unknown key',
    )
  })

  it('names a bad value by its dotted path', () => {
    const p = problems('plugins:\n  alpha:\n    nested:\n      threshold: 0\n')
    expect(p).toHaveLength(1)
    expect(p[0]).toStartWith('plugins.alpha.nested.threshold: ')
    expect(problems('log:\n  level: loud\n')[0]).toStartWith('log.level: ')
  })

  it('lists every problem at once', () => {
    const p = problems('server:\n  port: -1\nlog:\n  level: loud\nplugins:\n  nope: {}\n')
    expect(p.length).toBe(3)
    expect(p).toContain('plugins.nope: unknown plugin (known: alpha, beta)')
  })

  it('refuses a plugin whose dependency is not enabled', () => {
    expect(problems('plugins:\n  beta: {}\n')).toEqual([
      "plugins.beta: requires plugin 'alpha', which is not enabled",
    ])
    expect(problems('plugins:\n  alpha: { enabled: false }\n  beta: {}\n')).toHaveLength(1)
  })

  it('turns a plugin on when present and enabled is not false', () => {
    const { plugins } = loadConfig('plugins:\n  alpha:\n  beta: { enabled: true }\n', {}, known)
    expect([...plugins.keys()]).toEqual(['alpha', 'beta'])
    expect(plugins.get('alpha')).toEqual({ port: 8080, nested: { threshold: 300 } })
    const off = loadConfig('plugins:\n  alpha: { enabled: false, port: 1 }\n', {}, known)
    expect(off.plugins.has('alpha')).toBe(false)
  })

  it('rejects a non-boolean enabled', () => {
    expect(problems('plugins:\n  alpha: { enabled: "yes" }\n')).toContain(
      'plugins.alpha.enabled: must be a boolean',
    )
  })

  it('requires a 32-byte JWT secret and an admin password in simple mode', () => {
    const p = problems('auth:\n  mode: simple\n  jwt_secret: short\n')
    expect(p).toContain('auth.jwt_secret: JWT_SECRET must be at least 32 bytes when auth is enabled')
    expect(p).toContain('auth.admin_password: ADMIN_PASSWORD is required when AUTH_MODE=simple')
  })

  it('requires a 16-character cluster secret', () => {
    expect(problems('', { CLUSTER_SECRET: 'short' })).toEqual([
      'auth.cluster_secret: must be at least 16 characters',
    ])
  })

  it('reports broken YAML at its line and column, with the text of the line', () => {
    // Was `(yaml): <message>` with no position: an operator had to hunt for the line.
    expect(problems('server:\n  port: 3000\nlog: [info\n')).toEqual([
      '(yaml) line 4, column 1: Flow sequence in block collection must be sufficiently indented and end with a ]',
    ])
    expect(problems('server:\n  port: 1\nserver:\n  port: 2\n')).toEqual([
      '(yaml) line 3, column 1: Map keys must be unique: "server:"',
    ])
  })
})

describe("a plugin's validate", () => {
  const seen: { cfg: unknown; secret: unknown; pod: unknown }[] = []
  const withValidate = new Map<string, PluginSchemaInfo>([
    [
      'ranged',
      {
        schema: T.Object(
          { start: T.Integer({ default: 1 }), end: T.Integer({ default: 9 }) },
          { additionalProperties: false },
        ),
        dependsOn: [],
        validate: (cfg: { start: number; end: number }, { root, env }) => {
          seen.push({ cfg, secret: root.auth.cluster_secret, pod: env.POD })
          return cfg.start > cfg.end ? ['plugins.ranged.start: must not be above end'] : []
        },
      },
    ],
  ])
  const run = (yaml: string, env: Record<string, string> = {}) => problems(yaml, env, withValidate)

  it('reports its problems with the schema problems of every other section', () => {
    expect(run('log:\n  level: loud\nplugins:\n  ranged: { start: 5, end: 2 }\n')).toEqual([
      'log.level: must be one of "debug", "info", "warn", "error"',
      'plugins.ranged.start: must not be above end',
    ])
  })

  it('gets its section with defaults, the root config and the environment', () => {
    seen.length = 0
    expect(run('plugins:\n  ranged: { end: 4 }\n', { CLUSTER_SECRET: 's'.repeat(16), POD: 'p-1' })).toEqual(
      [],
    )
    expect(seen).toEqual([{ cfg: { start: 1, end: 4 }, secret: 's'.repeat(16), pod: 'p-1' }])
  })

  it('is not run on a section that failed its schema, nor on a disabled one', () => {
    seen.length = 0
    expect(run('plugins:\n  ranged: { start: x }\n')).toEqual(['plugins.ranged.start: must be an integer'])
    expect(run('plugins:\n  ranged: { enabled: false, start: 5, end: 2 }\n')).toEqual([])
    expect(seen).toEqual([])
  })
})

describe('config value checks', () => {
  const k = new Map<string, PluginSchemaInfo>([
    [
      'r',
      {
        schema: T.Object(
          {
            mode: T.Union([T.Literal('reject'), T.Literal('hold')], { default: 'reject' }),
            every: T.Integer({ default: 30, minimum: 1 }),
            on: T.Boolean({ default: false }),
          },
          { additionalProperties: false },
        ),
        dependsOn: [],
      },
    ],
  ])
  const errs = (yaml: string, env: Record<string, string> = {}) => {
    try {
      loadConfig(yaml, env, k)
      return []
    } catch (err) {
      return (err as ConfigError).problems
    }
  }

  it('lists the choices of a union of literals', () => {
    expect(errs('plugins:\n  r: { mode: queue }\n')).toEqual([
      'plugins.r.mode: must be one of "reject", "hold"',
    ])
  })

  it('refuses a fraction for an integer instead of rounding it', () => {
    expect(errs('plugins:\n  r: { every: 1.5 }\n')).toEqual(['plugins.r.every: must be an integer'])
  })

  it('coerces interpolated strings to numbers and booleans, and nothing else', () => {
    const { plugins } = loadConfig(
      'plugins:\n  r: { every: "${E}", on: "${ON}" }\n',
      { E: '5', ON: 'true' },
      k,
    )
    expect(plugins.get('r')).toEqual({ mode: 'reject', every: 5, on: true })
    expect(errs('plugins:\n  r: { every: "${E}" }\n', { E: 'five' })[0]).toStartWith(
      'plugins.r.every: must be',
    )
  })
})
