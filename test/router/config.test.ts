import { describe, expect, it } from 'bun:test'
import { knownPlugins } from '../../src/config/file.ts'
import { ConfigError, loadConfig } from '../../src/config/load.ts'
import { routerPlugin } from './support.ts'

const known = knownPlugins([routerPlugin])

function problems(yaml: string): string[] {
  try {
    loadConfig(yaml, {}, known)
    return []
  } catch (err) {
    if (err instanceof ConfigError) return err.problems
    throw err
  }
}

describe('router configuration', () => {
  it('fills every default', () => {
    const cfg = loadConfig('plugins:\n  router: {}\n', {}, known).plugins.get('router')
    expect(cfg).toEqual({
      host: 'localhost',
      port: 8080,
      models: [],
      from_gateway: true,
      auto_sleep: {
        enabled: false,
        idle_threshold: 300,
        check_interval: 30,
        level: 1,
        min_sleep_duration: 60,
      },
      wake_on_request: 'reject',
      hold_timeout: 120,
      health_timeout_ms: 2000,
      control_timeout: 300,
      proxy: { first_byte_timeout_ms: 600000, connect_timeout_ms: 5000 },
    })
  })

  it('names the dotted path of a bad value', () => {
    const found = problems(`
plugins:
  router:
    port: 70000
    auto_sleep: { idle_threshold: 0, check_interval: 0, level: 3 }
    wake_on_request: queue
    hold_timeout: -1
    models:
      - { name: a, endpoint: { port: 0 } }
      - { endpoint: { host: h, port: 1 } }
    extra: 1
`)
    expect(found).toContain('plugins.router.port: must be an integer <= 65535')
    expect(found).toContain('plugins.router.auto_sleep.idle_threshold: must be an integer >= 1')
    expect(found).toContain('plugins.router.auto_sleep.check_interval: must be an integer >= 1')
    expect(found).toContain('plugins.router.auto_sleep.level: must be an integer <= 2')
    expect(found).toContain('plugins.router.hold_timeout: must be an integer >= 1')
    expect(found).toContain('plugins.router.models[0].endpoint.port: must be an integer >= 1')
    expect(found).toContain('plugins.router.models[1].name: is required')
    expect(found).toContain('plugins.router.extra: unknown key')
    expect(found.some((p) => p.startsWith('plugins.router.wake_on_request:'))).toBe(true)
  })

  it('accepts port 0 and a model list', () => {
    const cfg = loadConfig(
      'plugins:\n  router:\n    port: 0\n    models: [{ name: m, endpoint: { port: 8001 } }]\n',
      {},
      known,
    ).plugins.get('router') as { port: number; models: unknown[] }
    expect(cfg.port).toBe(0)
    expect(cfg.models).toEqual([{ name: 'm', endpoint: { host: '127.0.0.1', port: 8001 } }])
  })

  it('does not require the gateway plugin', () => {
    expect(routerPlugin.dependsOn ?? []).not.toContain('gateway')
    expect(problems('plugins:\n  router: { from_gateway: true }\n')).toEqual([])
  })
})
