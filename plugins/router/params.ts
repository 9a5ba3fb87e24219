import type { DocumentDecoration } from 'elysia'
import { invalidParameter } from './errors.ts'

/**
 * Router route parameters: the query checks (positive integers, 400 invalid_parameter in the
 * router's error shape) and their OpenAPI declarations, written out by hand because Elysia's own
 * validator would answer in the controller shape.
 */
export type Parameter = NonNullable<DocumentDecoration['parameters']>[number]
export const modelParam: Parameter = {
  name: 'model_name',
  in: 'path',
  required: true,
  description: 'model name, URL-encoded (e.g. Qwen%2FQwen2.5-7B-Instruct)',
  schema: { type: 'string' },
}
export const intParam = (name: string, description: string, dflt?: number): Parameter => ({
  name,
  in: 'query',
  required: false,
  description,
  schema: { type: 'integer', minimum: 1, ...(dflt === undefined ? {} : { default: dflt }) },
})
export const thresholdParam = intParam('threshold', 'seconds', 300)
export const windowParam = intParam('window', 'seconds (default: all time)')

export type Query = Record<string, string | string[] | undefined>

/** RouteContext: the part of Elysia's handler context the routes use. */
export interface RouteContext {
  request: Request
  query: Query
  params: Record<string, string>
  set: { status?: number | string }
}

/** positiveInt reads an optional positive-integer query parameter (400 invalid_parameter otherwise). */
export function positiveInt(query: Query, name: string): number | null {
  const raw = query[name]
  if (raw === undefined) return null
  const text = Array.isArray(raw) ? raw[raw.length - 1] : raw
  if (text === undefined || !/^\d+$/.test(text) || Number(text) < 1 || !Number.isSafeInteger(Number(text)))
    throw invalidParameter(`'${name}' must be a positive integer (got '${text ?? ''}')`)
  return Number(text)
}
