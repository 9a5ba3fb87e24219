import { writeFileSync } from 'node:fs'
import { resolve } from 'node:path'
import { plugins } from '../plugins/index.ts'
import { ENV_OVERRIDES, RootConfigSchema } from '../src/config/schema.ts'

/**
 * The configuration reference (config/REFERENCE.md), written from the TypeBox schemas themselves:
 * the host's (src/config/schema.ts) and each plugin's, so every key, type, default and meaning has
 * one source. `npm run docs:config` writes it; test/config/reference.test.ts fails when the
 * committed file is not what this prints.
 */
export const REFERENCE_PATH = resolve(import.meta.dir, '../config/REFERENCE.md')

/** Node: the parts of a TypeBox schema the reference reads. */
interface Node {
  type?: string
  const?: unknown
  default?: unknown
  description?: string
  properties?: Record<string, Node>
  required?: string[]
  items?: Node
  anyOf?: Node[]
  patternProperties?: Record<string, Node>
  minimum?: number
  maximum?: number
  exclusiveMinimum?: number
  minItems?: number
  minLength?: number
  maxLength?: number
  pattern?: string
}

/** ReferenceRow: one key of the YAML. */
export interface ReferenceRow {
  key: string
  type: string
  default: string
  /** hint: said after the default (a byte count in MiB). */
  hint?: string
  description: string
}

/** typeOf: a key's type in YAML terms, with its bounds (`integer, 1024–65535`; `` `warn` or `unload` ``). */
function typeOf(n: Node): string {
  if (n.anyOf) {
    const alts = n.anyOf.map(typeOf)
    return alts.length > 1 ? `${alts.slice(0, -1).join(', ')} or ${alts.at(-1)}` : (alts[0] ?? 'any')
  }
  if (n.const !== undefined) return `\`${String(n.const)}\``
  if (n.patternProperties) {
    const value = Object.values(n.patternProperties)[0]
    return `map of string → ${value ? typeOf(value) : 'any'}`
  }
  if (n.type === 'array') return `list of ${n.items ? typeOf(n.items) : 'any'}`
  if (n.type === 'object') return 'object'
  if (n.type === 'integer' || n.type === 'number') {
    const lo = n.minimum ?? (n.exclusiveMinimum !== undefined ? `> ${n.exclusiveMinimum}` : undefined)
    const bounds =
      lo !== undefined && n.maximum !== undefined
        ? typeof lo === 'number'
          ? `${lo}–${n.maximum}`
          : `${lo}, ≤ ${n.maximum}`
        : lo !== undefined
          ? typeof lo === 'number'
            ? `≥ ${lo}`
            : lo
          : n.maximum !== undefined
            ? `≤ ${n.maximum}`
            : ''
    return bounds ? `${n.type}, ${bounds}` : (n.type ?? 'any')
  }
  return n.type ?? 'any'
}

/** defaultOf: the schema's default as YAML would spell it; `—` when the key has none (unset). */
function defaultOf(n: Node): string {
  if (n.default === undefined) return '—'
  if (n.type === 'object' && n.properties) return '—'
  return typeof n.default === 'string' && n.default !== '' ? n.default : JSON.stringify(n.default)
}

const MIB = 1024 * 1024

/** sizeHint: a byte count's size in MiB, beside the exact figure (`16777216` (16 MiB)). */
function sizeHint(key: string, n: Node): string {
  return key.endsWith('_bytes') && typeof n.default === 'number' && n.default >= MIB && n.default % MIB === 0
    ? ` (${n.default / MIB} MiB)`
    : ''
}

/** cell: text that stays inside one markdown table cell. */
function cell(text: string): string {
  return text.replace(/\|/g, '\\|').replace(/\n/g, ' ')
}

/**
 * rows: every key under `prefix`, depth first in the schema's own order. An object's own row comes
 * before its keys (its description says what the group is for); a list of objects is `key[]`.
 */
export function rows(schema: Node, prefix: string): ReferenceRow[] {
  const out: ReferenceRow[] = []
  for (const [k, sub] of Object.entries(schema.properties ?? {})) {
    const key = prefix ? `${prefix}.${k}` : k
    out.push({
      key,
      type: typeOf(sub),
      default: defaultOf(sub),
      hint: sizeHint(key, sub),
      description: sub.description ?? '',
    })
    out.push(...rows(sub, key))
    if (sub.type === 'array' && sub.items?.properties) out.push(...rows(sub.items, `${key}[]`))
    for (const alt of sub.anyOf ?? []) if (alt.properties) out.push(...rows(alt, key))
  }
  return out
}

/** enabledRow: `plugins.<id>.enabled`, which the loader reads before the plugin's own schema. */
function enabledRow(id: string): ReferenceRow {
  return {
    key: `plugins.${id}.enabled`,
    type: 'boolean',
    default: 'true',
    description: `false turns the ${id} plugin off while its section stays in the file (a plugin is on when its section is present)`,
  }
}

/** table: rows as a markdown table. */
function table(list: ReferenceRow[]): string {
  const lines = ['| key | type | default | meaning |', '|---|---|---|---|']
  for (const r of list)
    lines.push(
      `| \`${r.key}\` | ${cell(r.type)} | ${r.default === '—' ? '—' : `\`${cell(r.default)}\`${r.hint ?? ''}`} | ${cell(r.description)} |`,
    )
  return lines.join('\n')
}

/** referenceRows: every key of the host's schema and of each plugin's, as the reference lists them. */
export function referenceRows(): { section: string; rows: ReferenceRow[] }[] {
  const root = RootConfigSchema as unknown as Node
  const sections: { section: string; rows: ReferenceRow[] }[] = []
  const top = rows(root, '').filter((r) => r.key !== 'plugins' && !r.key.startsWith('plugins.'))
  const groups = new Map<string, ReferenceRow[]>()
  for (const r of top) {
    const head = r.key.split(/[.[]/)[0]!
    const group = groups.get(head) ?? []
    group.push(r)
    groups.set(head, group)
  }
  for (const [head, list] of groups) sections.push({ section: head, rows: list })
  for (const def of plugins)
    sections.push({
      section: `plugins.${def.id}`,
      rows: [enabledRow(def.id), ...rows(def.config as unknown as Node, `plugins.${def.id}`)],
    })
  return sections
}

/** configReference: the whole of config/REFERENCE.md. */
export function configReference(): string {
  const parts = [
    '# Configuration reference',
    '',
    "<!-- Generated by `npm run docs:config` (build/config-reference.ts) from the TypeBox schemas. Do not edit: change the schema's description or default and run it again. -->",
    '',
    "Every key of the YAML, from the schemas modelgate validates it with: the host's",
    "(`src/config/schema.ts`) and each plugin's (`plugins/<id>/config.ts`). How the file is read,",
    '`${VAR}` interpolation, `check-config` and the exit codes: [README.md](README.md#configuration).',
    '`config/modelgate.example.yaml` shows every key in place. A default of `—` means the key is unset',
    'unless given (its meaning says what then).',
    '',
  ]
  for (const s of referenceRows()) parts.push(`## \`${s.section}\``, '', table(s.rows), '')
  parts.push(
    '## Environment overrides',
    '',
    'These variables override the YAML key beside them (after `${VAR}` interpolation), as a container',
    'operator expects.',
    '',
    '| variable | key |',
    '|---|---|',
    ...Object.entries(ENV_OVERRIDES).map(([v, k]) => `| \`${v}\` | \`${k}\` |`),
    '',
  )
  return parts.join('\n')
}

if (import.meta.main) {
  writeFileSync(REFERENCE_PATH, configReference())
  console.log(`wrote ${REFERENCE_PATH}`)
}
