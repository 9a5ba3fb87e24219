/**
 * describeValidationError turns Elysia's ValidationError into one human line naming the field,
 * e.g. `body.max_tokens: must be an integer >= 1`, instead of Elysia's raw dump.
 */
interface SchemaLike {
  type?: string
  minimum?: number
  maximum?: number
  minLength?: number
  maxLength?: number
  enum?: unknown[]
  anyOf?: SchemaLike[]
  const?: unknown
  error?: unknown
}

interface ErrLike {
  type?: string
  customError?: unknown
  valueError?: { path?: string; message?: string; schema?: SchemaLike; value?: unknown }
  all?: { path?: string; message?: string; schema?: SchemaLike; value?: unknown }[]
}

function describeSchema(s: SchemaLike | undefined): string | null {
  if (!s) return null
  if (s.anyOf?.length) {
    const consts = s.anyOf.map((x) => x.const).filter((x) => x !== undefined)
    if (consts.length === s.anyOf.length)
      return `must be one of ${consts.map((c) => JSON.stringify(c)).join(', ')}`
    const inner = s.anyOf.find((x) => x.type === 'integer' || x.type === 'number') ?? s.anyOf[0]
    return describeSchema(inner)
  }
  const parts: string[] = []
  const article = s.type === 'integer' || s.type === 'array' || s.type === 'object' ? 'an' : 'a'
  if (s.type) parts.push(`must be ${article} ${s.type}`)
  if (s.minimum !== undefined) parts.push(`>= ${s.minimum}`)
  if (s.maximum !== undefined) parts.push(`<= ${s.maximum}`)
  if (s.minLength !== undefined && s.minLength > 0) parts.push(`of at least ${s.minLength} characters`)
  if (s.enum) parts.push(`(one of ${s.enum.join(', ')})`)
  return parts.length ? parts.join(' ') : null
}

export function describeValidationError(err: unknown): string {
  const e = err as ErrLike
  if (typeof e.customError === 'string') return e.customError
  const first = e.all?.[0] ?? e.valueError
  const where = e.type ?? 'request'
  const path = first?.path ? `${where}${first.path.replace(/\//g, '.')}` : where
  if (typeof first?.schema?.error === 'string') return first.schema.error
  let message = first?.message ?? 'invalid value'
  if (first && 'value' in first && first.value === undefined && first.path) message = 'is required'
  else if (/union|Expected kind/i.test(message)) message = describeSchema(first?.schema) ?? message
  else if (first?.message === 'Expected required property') message = 'is required'
  else message = message.charAt(0).toLowerCase() + message.slice(1)
  return `${path}: ${message}`
}

/** The parts of a JSON Schema (as TypeBox writes it) that say which members an object may have. */
interface ShapeSchema {
  type?: string | string[]
  properties?: Record<string, ShapeSchema>
  patternProperties?: Record<string, ShapeSchema>
  additionalProperties?: boolean | ShapeSchema
  items?: ShapeSchema | ShapeSchema[]
  anyOf?: ShapeSchema[]
  oneOf?: ShapeSchema[]
  allOf?: ShapeSchema[]
}

/** An unknown member: where it is, and the declared sibling it is probably a misspelling of. */
export interface UnknownField {
  path: string
  suggestion?: string
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v)

const member = (path: string, key: string) =>
  /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`

/** editDistance: Levenshtein distance, for "did you mean"; short names only (declared fields are). */
function editDistance(a: string, b: string): number {
  if (Math.abs(a.length - b.length) > 2 || a.length > 64 || b.length > 64) return Number.POSITIVE_INFINITY
  let prev = Array.from({ length: b.length + 1 }, (_, i) => i)
  for (let i = 1; i <= a.length; i++) {
    const cur = [i]
    for (let j = 1; j <= b.length; j++)
      cur[j] = Math.min(prev[j]! + 1, cur[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1))
    prev = cur
  }
  return prev[b.length]!
}

function closest(key: string, declared: string[]): string | undefined {
  let best: string | undefined
  let bestDistance = 3
  for (const name of declared) {
    const d = editDistance(key.toLowerCase(), name.toLowerCase())
    if (d < bestDistance) [best, bestDistance] = [name, d]
  }
  return best
}

/**
 * unknownFields lists the members of a request body that its schema does not declare, each by its
 * path (`body.scenarios[0].concurency`). Elysia's normalisation drops such members before it
 * validates, so a misspelt or misplaced option (`enable_sleep_mod`, `gpu_id`) would otherwise be
 * accepted and ignored; this is asked first, so they are refused instead. An object is closed unless
 * its schema opens it (`additionalProperties` true or a schema, `patternProperties` as in a record);
 * of a union, the branch the value fits best is used; an intersection knows every member's fields.
 * A value of the wrong type is left to validation.
 */
export function unknownFields(schema: unknown, value: unknown, path = 'body'): UnknownField[] {
  const s = schema as ShapeSchema | undefined
  if (!s || typeof s !== 'object') return []
  const branches = s.anyOf ?? s.oneOf
  if (branches) {
    let best: UnknownField[] | null = null
    for (const b of branches) {
      if (!fits(b, value)) continue
      const found = unknownFields(b, value, path)
      if (!best || found.length < best.length) best = found
      if (found.length === 0) break
    }
    return best ?? []
  }
  if (s.allOf) return unknownFields(mergeObjects(s.allOf), value, path)
  if (Array.isArray(value)) {
    if (!isType(s, 'array') || !s.items) return []
    const items = s.items
    return value.flatMap((v, i) => unknownFields(Array.isArray(items) ? items[i] : items, v, `${path}[${i}]`))
  }
  if (!isObject(value) || !isType(s, 'object')) return []
  const declared = s.properties ?? {}
  const patterns = Object.entries(s.patternProperties ?? {}).map(([p, v]) => [new RegExp(p), v] as const)
  const found: UnknownField[] = []
  for (const [key, v] of Object.entries(value)) {
    const at = member(path, key)
    if (Object.hasOwn(declared, key)) {
      found.push(...unknownFields(declared[key], v, at))
      continue
    }
    const pattern = patterns.find(([re]) => re.test(key))
    if (pattern) found.push(...unknownFields(pattern[1], v, at))
    else if (typeof s.additionalProperties === 'object')
      found.push(...unknownFields(s.additionalProperties, v, at))
    else if (s.additionalProperties !== true && patterns.length === 0) {
      const suggestion = closest(key, Object.keys(declared))
      found.push(suggestion ? { path: at, suggestion } : { path: at })
    }
  }
  return found
}

function isType(s: ShapeSchema, type: string): boolean {
  return s.type === type || (Array.isArray(s.type) && s.type.includes(type))
}

/** fits: whether a union branch is about this kind of value at all (object, array, or anything). */
function fits(s: ShapeSchema, value: unknown): boolean {
  if (s.anyOf || s.oneOf || s.allOf || s.type === undefined) return true
  if (Array.isArray(value)) return isType(s, 'array')
  if (isObject(value)) return isType(s, 'object')
  return false
}

/** mergeObjects: one object schema that declares what every member of an intersection declares. */
function mergeObjects(members: ShapeSchema[]): ShapeSchema {
  const merged: ShapeSchema = { type: 'object', properties: {}, additionalProperties: false }
  for (const m of members) {
    Object.assign(merged.properties!, m.properties)
    if (m.patternProperties)
      merged.patternProperties = { ...merged.patternProperties, ...m.patternProperties }
    if (m.additionalProperties === true || typeof m.additionalProperties === 'object' || m.type === undefined)
      merged.additionalProperties = true
  }
  return merged
}

/** The most fields one refusal names; a body with more says how many it left out. */
const NAMED_AT_MOST = 20

/** describeUnknownFields: the refusal's message, every unknown field by path (up to NAMED_AT_MOST). */
export function describeUnknownFields(fields: UnknownField[]): string {
  const named = fields
    .slice(0, NAMED_AT_MOST)
    .map((f) => `${f.path}: unknown field${f.suggestion ? ` (did you mean ${f.suggestion}?)` : ''}`)
  const more = fields.length > NAMED_AT_MOST ? `; and ${fields.length - NAMED_AT_MOST} more` : ''
  return `${named.join('; ')}${more}`
}
