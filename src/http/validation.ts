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
