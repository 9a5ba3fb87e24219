import { describe, expect, it } from 'bun:test'
import { readFileSync } from 'node:fs'
import { resolve } from 'node:path'
import type { TSchema } from '@sinclair/typebox'
import { parse, stringify } from 'yaml'
import { plugins } from '../../plugins/index.ts'
import { knownPlugins } from '../../src/config/file.ts'
import { type ConfigError, loadConfig } from '../../src/config/load.ts'
import { RootConfigSchema } from '../../src/config/schema.ts'

/**
 * config/modelgate.example.yaml claims every key: each key of the TypeBox schemas (the host's and
 * every plugin's) must be in it, set or commented out (`# key: value`), and nothing else; and it
 * must be a configuration modelgate accepts, as written and with every commented key set.
 */
const EXAMPLE = readFileSync(resolve(import.meta.dir, '../../config/modelgate.example.yaml'), 'utf8')

type Node = TSchema & {
  type?: string
  properties?: Record<string, Node>
  items?: Node
  anyOf?: Node[]
  patternProperties?: Record<string, Node>
}

/** schemaKeys: every key path of a schema (`a.b`, `a.list[].c`); `records` gets the free-form maps. */
function schemaKeys(schema: Node, prefix: string, keys: Set<string>, records: Set<string>): void {
  for (const alt of schema.anyOf ?? []) schemaKeys(alt, prefix, keys, records)
  if (schema.patternProperties) records.add(prefix)
  for (const [k, sub] of Object.entries(schema.properties ?? {})) {
    const path = prefix ? `${prefix}.${k}` : k
    keys.add(path)
    schemaKeys(sub, path, keys, records)
  }
  if (schema.type === 'array' && schema.items) schemaKeys(schema.items, `${prefix}[]`, keys, records)
}

function allSchemaKeys() {
  const keys = new Set<string>()
  const records = new Set<string>()
  schemaKeys(RootConfigSchema as Node, '', keys, records)
  records.delete('plugins')
  for (const def of plugins) {
    keys.add(`plugins.${def.id}`)
    schemaKeys(def.config as Node, `plugins.${def.id}`, keys, records)
  }
  return { keys, records }
}

/** uncommented: the example with every commented-out key (`# key:`, `# - key:`, `# - { key:`) set. */
function uncommented(text: string): string {
  return text
    .split('\n')
    .map((line) => line.replace(/^(\s*)# ((?:\s*- )?\s*(?:\{ )?[a-z_][a-z0-9_]*:(?:\s|$))/, '$1$2'))
    .join('\n')
}

/** documentKeys: every key path a YAML document sets, lists' items as `[]`. */
function documentKeys(value: unknown, prefix: string, keys: Set<string>): void {
  if (Array.isArray(value)) {
    for (const item of value) documentKeys(item, `${prefix}[]`, keys)
    return
  }
  if (!value || typeof value !== 'object') return
  for (const [k, v] of Object.entries(value)) {
    const path = prefix ? `${prefix}.${k}` : k
    keys.add(path)
    documentKeys(v, path, keys)
  }
}

/** Values for the example's ${VAR}s that have no default. */
const env = {
  ADMIN_PASSWORD: 'an-admin-password',
  JWT_SECRET: 'j'.repeat(32),
  INFERENCE_API_KEY: 'an-inference-key',
  CLUSTER_SECRET: 'c'.repeat(32),
  CLUSTER_SECRET_PREVIOUS: 'p'.repeat(32),
  OAUTH_CLIENT_SECRET: 'an-oauth-client-secret',
  ETCD_PASSWORD: 'an-etcd-password',
}

function problems(yaml: string, vars: Record<string, string>): string[] {
  try {
    loadConfig(yaml, vars, knownPlugins(plugins))
    return []
  } catch (err) {
    return (err as ConfigError).problems
  }
}

describe('config/modelgate.example.yaml', () => {
  const { keys: schema, records } = allSchemaKeys()
  const example = new Set<string>()
  documentKeys(parse(uncommented(EXAMPLE)), '', example)
  // Keys inside a free-form map (engine.env) and a plugin's `enabled` are not schema keys.
  const isExtra = (k: string) =>
    [...records].some((r) => k.startsWith(`${r}.`)) || /^plugins\.[a-z]+\.enabled$/.test(k)

  it('has every key of the schemas', () => {
    expect(schema.size).toBeGreaterThan(100)
    expect([...schema].filter((k) => !example.has(k))).toEqual([])
  })

  it('has no key the schemas do not know', () => {
    expect([...example].filter((k) => !schema.has(k) && !isExtra(k))).toEqual([])
  })

  it('is accepted as written (check-config passes it with nothing in the environment)', () => {
    expect(problems(EXAMPLE, {})).toEqual([])
  })

  it('is accepted with every commented key set and the cluster on', () => {
    const doc = parse(uncommented(EXAMPLE)) as {
      server: { tls?: unknown }
      plugins: { cluster: { enabled?: boolean } }
    }
    delete doc.plugins.cluster.enabled
    // The cluster's pod-to-pod calls are plain HTTP: server.tls and the cluster do not go together.
    delete doc.server.tls
    expect(problems(stringify(doc), env)).toEqual([])
  })

  it('is accepted with every commented key set and TLS on (the cluster off)', () => {
    expect(problems(uncommented(EXAMPLE), env)).toEqual([])
  })

  it('the check is live: a key taken out of the example is reported', () => {
    const without = new Set<string>()
    documentKeys(parse(uncommented(EXAMPLE.replace(/^\s*drain_ms:.*$/m, ''))), '', without)
    expect([...schema].filter((k) => !without.has(k))).toEqual(['shutdown.drain_ms'])
  })
})
