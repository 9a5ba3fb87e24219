import type { TSchema } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { parseDocument } from 'yaml'
import type { ValidateContext } from '../host/plugin.ts'
import { oauthProblems } from '../http/oauth.ts'
import { ENV_OVERRIDES, type RootConfig, RootConfigSchema } from './schema.ts'

/**
 * Config loading: YAML text → `${VAR}` / `${VAR:-default}` interpolation → environment overrides
 * → defaults → validation. Every problem is collected with its dotted path so an operator sees
 * all of them at once (`check-config` exits 2 listing them).
 */
export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n  ${problems.join('\n  ')}`)
    this.name = 'ConfigError'
  }
}

export type Env = Record<string, string | undefined>

/** PluginSchemas gives the host's validator each known plugin's config schema and dependencies. */
export interface PluginSchemaInfo {
  schema: TSchema
  dependsOn: string[]
  /** validate: the plugin's own checks across keys (PluginDefinition.validate), run once its schema passed. */
  // biome-ignore lint/suspicious/noExplicitAny: each plugin's section has its own static type
  validate?: (cfg: any, ctx: ValidateContext) => string[]
}

export interface LoadedConfig {
  root: RootConfig
  /** plugins holds the validated, defaulted config of each enabled plugin, in YAML order. */
  plugins: Map<string, Record<string, unknown>>
  /** file: the YAML file it was read from (absolute), so a plugin can name it; absent when not from a file. */
  file?: string
}

const VAR = /\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g

/** interpolate replaces `${VAR}` and `${VAR:-default}` in every string of a parsed YAML tree. */
export function interpolate(value: unknown, env: Env, path: string, problems: string[]): unknown {
  if (typeof value === 'string') {
    return value.replace(VAR, (_m, name: string, def: string | undefined) => {
      const v = env[name]
      if (v !== undefined && v !== '') return v
      if (def !== undefined) return def
      problems.push(`${path || '(root)'}: environment variable ${name} is not set`)
      return ''
    })
  }
  if (Array.isArray(value)) return value.map((v, i) => interpolate(v, env, `${path}[${i}]`, problems))
  if (value && typeof value === 'object') {
    const out: Record<string, unknown> = {}
    for (const [k, v] of Object.entries(value))
      out[k] = interpolate(v, env, path ? `${path}.${k}` : k, problems)
    return out
  }
  return value
}

function setPath(obj: Record<string, unknown>, dotted: string, value: unknown): void {
  const parts = dotted.split('.')
  let cur = obj
  for (const p of parts.slice(0, -1)) {
    const next = cur[p]
    if (!next || typeof next !== 'object') cur[p] = {}
    cur = cur[p] as Record<string, unknown>
  }
  cur[parts[parts.length - 1]!] = value
}

/** pointerToDotted turns a JSON pointer from TypeBox (`/plugins/router/port`) into `plugins.router.port`. */
function pointerToDotted(prefix: string, pointer: string): string {
  const parts = pointer
    .split('/')
    .slice(1)
    .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'))
  const segs: string[] = prefix ? [prefix] : []
  for (const p of parts) {
    if (/^\d+$/.test(p) && segs.length > 0) segs[segs.length - 1] += `[${p}]`
    else segs.push(p)
  }
  return segs.join('.') || '(root)'
}

/** validate applies defaults and returns the value plus one message per problem, by dotted path. */
export function validateAgainst<T>(schema: TSchema, input: unknown, prefix: string, problems: string[]): T {
  const value = coerceStrings(schema, Value.Default(schema, Value.Clone(input ?? {})))
  for (const e of Value.Errors(schema, value)) {
    const path = pointerToDotted(prefix, e.path)
    const choices = literalChoices(e.schema)
    // A schema may carry the rule's reason (`errorMessage`), for a value TypeBox's words leave unclear.
    const reason = (e.schema as { errorMessage?: unknown }).errorMessage
    const msg =
      typeof reason === 'string' ? reason : choices ? `must be one of ${choices}` : humanize(e.message)
    const line = `${path}: ${msg}`
    if (!problems.includes(line)) problems.push(line)
  }
  return value as T
}

/**
 * coerceStrings turns strings into the numbers or booleans the schema expects (what `${PORT:-3000}`
 * interpolation produces) and changes nothing else: `1.5` for an integer stays an error.
 */
function coerceStrings(schema: TSchema, value: unknown): unknown {
  const s = schema as TSchema & {
    type?: string
    properties?: Record<string, TSchema>
    items?: TSchema
    patternProperties?: Record<string, TSchema>
    anyOf?: TSchema[]
  }
  if (typeof value === 'string') {
    const types = s.anyOf ? s.anyOf.map((x) => (x as { type?: string }).type) : [s.type]
    if (
      (types.includes('integer') || types.includes('number')) &&
      value.trim() !== '' &&
      !Number.isNaN(Number(value))
    )
      return Number(value)
    if (types.includes('boolean') && (value === 'true' || value === 'false')) return value === 'true'
    return value
  }
  if (Array.isArray(value) && s.items) return value.map((v) => coerceStrings(s.items!, v))
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    const out: Record<string, unknown> = {}
    const record = s.patternProperties ? Object.values(s.patternProperties)[0] : undefined
    for (const [k, v] of Object.entries(value)) {
      const sub = s.properties?.[k] ?? record
      out[k] = sub ? coerceStrings(sub, v) : v
    }
    return out
  }
  return value
}

/** literalChoices lists a union of literals (`'reject' | 'hold'`) for a readable message. */
function literalChoices(schema: unknown): string | null {
  const anyOf = (schema as { anyOf?: { const?: unknown }[] } | undefined)?.anyOf
  if (!anyOf?.length || !anyOf.every((x) => x.const !== undefined)) return null
  return anyOf.map((x) => JSON.stringify(x.const)).join(', ')
}

/** humanize rewrites TypeBox's messages as rules: `must be an integer >= 1024`. */
function humanize(message: string): string {
  if (message === 'Unexpected property') return 'unknown key'
  if (message === 'Expected required property') return 'is required'
  const bound = /^Expected (\w+) to be (greater|less) (?:or equal to|than) (.+)$/.exec(message)
  if (bound) {
    const [, type, dir, n] = bound
    const op = message.includes('or equal')
      ? dir === 'greater'
        ? '>='
        : '<='
      : dir === 'greater'
        ? '>'
        : '<'
    return `must be ${type === 'integer' ? 'an integer' : `a ${type}`} ${op} ${n}`
  }
  const m = /^Expected (.+)$/.exec(message)
  if (!m) return message.toLowerCase()
  const what = m[1]!
  return `must be ${/^(integer|array|object)$/.test(what) ? 'an ' : /^(string|number|boolean)$/.test(what) ? 'a ' : ''}${what}`
}

function isEnabled(section: unknown): boolean {
  if (section === null || section === undefined) return true
  if (typeof section !== 'object') return true
  return (section as Record<string, unknown>).enabled !== false
}

/** loadConfig parses and validates a YAML document against the root and plugin schemas. */
export function loadConfig(yamlText: string, env: Env, known: Map<string, PluginSchemaInfo>): LoadedConfig {
  const problems: string[] = []
  const parsed = parseYamlText(yamlText)
  if (typeof parsed !== 'object' || Array.isArray(parsed))
    throw new ConfigError(['(root): must be a mapping'])
  const doc = interpolate(parsed, env, '', problems) as Record<string, unknown>
  for (const [name, path] of Object.entries(ENV_OVERRIDES)) {
    const v = env[name]
    if (v !== undefined && v !== '') setPath(doc, path, v)
  }
  const root = validateAgainst<RootConfig>(RootConfigSchema, doc, '', problems)
  checkAuth(root, problems)

  const plugins = new Map<string, Record<string, unknown>>()
  const sections = (root.plugins ?? {}) as Record<string, unknown>
  for (const [id, section] of Object.entries(sections)) {
    const info = known.get(id)
    if (!info) {
      problems.push(`plugins.${id}: unknown plugin (known: ${[...known.keys()].join(', ')})`)
      continue
    }
    if (
      section !== null &&
      section !== undefined &&
      (typeof section !== 'object' || Array.isArray(section))
    ) {
      problems.push(`plugins.${id}: must be a mapping`)
      continue
    }
    if (!isEnabled(section)) continue
    const { enabled: _enabled, ...rest } = (section ?? {}) as Record<string, unknown>
    if (_enabled !== undefined && typeof _enabled !== 'boolean')
      problems.push(`plugins.${id}.enabled: must be a boolean`)
    const before = problems.length
    const cfg = validateAgainst<Record<string, unknown>>(info.schema, rest, `plugins.${id}`, problems)
    // A section that failed its schema is not the shape validate expects: those problems come first.
    if (info.validate && problems.length === before) problems.push(...info.validate(cfg, { root, env }))
    plugins.set(id, cfg)
  }
  for (const id of plugins.keys()) {
    for (const dep of known.get(id)?.dependsOn ?? []) {
      if (!plugins.has(dep)) problems.push(`plugins.${id}: requires plugin '${dep}', which is not enabled`)
    }
  }
  if (problems.length > 0) throw new ConfigError([...new Set(problems)])
  return { root, plugins }
}

/**
 * parseYamlText parses the document, or throws a ConfigError with every syntax error at its line
 * and column and the text of that line, so the operator sees where to look.
 */
function parseYamlText(yamlText: string): unknown {
  const doc = parseDocument(yamlText)
  if (doc.errors.length > 0) {
    const lines = yamlText.split(/\r?\n/)
    throw new ConfigError(
      doc.errors.map((e) => {
        const at = e.linePos?.[0]
        const what =
          e.code === 'MULTIPLE_DOCS'
            ? 'a config file holds one YAML document (a second starts here)'
            : e.message.replace(/ at line \d+, column \d+:?[\s\S]*$/, '')
        if (!at) return `(yaml): ${what}`
        const text = lines[at.line - 1]
        return `(yaml) line ${at.line}, column ${at.col}: ${what}${text ? `: ${JSON.stringify(text)}` : ''}`
      }),
    )
  }
  try {
    return doc.toJS() ?? {}
  } catch (err) {
    // What only resolving finds (an alias to an anchor that is not there) has no position.
    throw new ConfigError([`(yaml): ${(err as Error).message}`])
  }
}

function checkAuth(root: RootConfig, problems: string[]): void {
  const a = root.auth
  if (!a) return
  if (a.mode !== 'none') {
    const secret = a.jwt_secret ?? ''
    if (Buffer.byteLength(secret) < 32)
      problems.push('auth.jwt_secret: JWT_SECRET must be at least 32 bytes when auth is enabled')
  }
  if (a.mode === 'simple' && !a.admin_password)
    problems.push('auth.admin_password: ADMIN_PASSWORD is required when AUTH_MODE=simple')
  if (a.mode === 'oauth') problems.push(...oauthProblems(a.oauth))
  for (const k of ['cluster_secret', 'cluster_secret_previous'] as const) {
    const s = a[k]
    if (s !== undefined && s.length < 16) problems.push(`auth.${k}: must be at least 16 characters`)
  }
}
