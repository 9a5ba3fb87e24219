import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { Type as T } from '@sinclair/typebox'
import { Elysia, t } from 'elysia'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Unknown body fields are refused, not dropped: a host with every plugin, auth on, read through its
 * own OpenAPI documents (the main listener's and the router's). Every admin or public operation that
 * takes a JSON body is sent its minimal valid body plus a field it does not declare, at the top and
 * inside the first nested object; every operation that takes no body is sent a body with a field.
 * Each must answer 400 VALIDATION_ERROR naming the field by its path. Inference bodies stay open.
 */

const KEY = 'sk-unknown-fields'
const PROBE = 'not_a_field_of_this_route'

interface Schema {
  type?: string
  const?: unknown
  enum?: unknown[]
  format?: string
  minimum?: number
  maximum?: number
  exclusiveMinimum?: number
  minLength?: number
  minItems?: number
  required?: string[]
  properties?: Record<string, Schema>
  items?: Schema
  anyOf?: Schema[]
}

interface Op {
  listener: string
  method: string
  path: string
  auth: string
  schema?: Schema
}

/** minimal: the smallest value the schema accepts (required members only; one item of an object array). */
function minimal(s: Schema): unknown {
  if (s.const !== undefined) return s.const
  if (s.enum) return s.enum[0]
  if (s.anyOf) {
    const pick =
      s.anyOf.find((b) => b.const !== undefined) ??
      s.anyOf.find((b) => b.type === 'integer' || b.type === 'number') ??
      s.anyOf.find((b) => b.type === 'object') ??
      s.anyOf.find((b) => b.type !== 'null') ??
      s.anyOf[0]!
    return minimal(pick)
  }
  switch (s.type) {
    case 'object':
      return Object.fromEntries((s.required ?? []).map((k) => [k, minimal(s.properties?.[k] ?? {})]))
    case 'array': {
      const items = s.items ?? {}
      const count = Math.max(s.minItems ?? 0, items.type === 'object' ? 1 : 0)
      return Array.from({ length: count }, () => minimal(items))
    }
    case 'string':
      return s.format === 'integer' ? '1' : 'x'.repeat(Math.max(s.minLength ?? 1, 1))
    case 'integer':
    case 'number':
      if (s.exclusiveMinimum !== undefined)
        return s.maximum !== undefined ? (s.exclusiveMinimum + s.maximum) / 2 : s.exclusiveMinimum + 1
      return s.minimum ?? Math.min(1, s.maximum ?? 1)
    case 'boolean':
      return false
    case 'null':
      return null
    default:
      return 'x'
  }
}

/** firstNested: the path and object of the first object below the top of a body (depth first). */
function firstNested(value: unknown, path = 'body'): { path: string; at: Record<string, unknown> } | null {
  const children: [string, unknown][] = Array.isArray(value)
    ? value.map((v, i) => [`${path}[${i}]`, v])
    : value && typeof value === 'object'
      ? Object.entries(value).map(([k, v]) => [`${path}.${k}`, v])
      : []
  for (const [p, v] of children) {
    if (v && typeof v === 'object' && !Array.isArray(v)) return { path: p, at: v as Record<string, unknown> }
    const deeper = firstNested(v, p)
    if (deeper) return deeper
  }
  return null
}

let gw: TestGateway
let ops: Op[]

beforeAll(async () => {
  gw = await startGateway({
    ports: [18620, 18639],
    hostEnv: {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: 'walk-password',
      JWT_SECRET: 'u'.repeat(40),
      INFERENCE_API_KEY: KEY,
      CLUSTER_SECRET: 'c'.repeat(32),
    },
    extraYaml:
      '  benchmarks: {}\n  router: { host: 127.0.0.1, port: 0, from_gateway: true }\n' +
      '  cluster: { pod_id: solo, coordination: { kind: static, static: { leader: solo, peers: [] } } }\n',
  })
  ops = []
  for (const [listener, url] of Object.entries(gw.host.urls)) {
    const doc = (await (await fetch(`${url}/docs/json`)).json()) as {
      paths: Record<string, Record<string, Record<string, unknown>>>
    }
    for (const [path, byMethod] of Object.entries(doc.paths))
      for (const [method, op] of Object.entries(byMethod)) {
        const body = op.requestBody as { content?: Record<string, { schema: Schema }> } | undefined
        ops.push({
          listener,
          method: method.toUpperCase(),
          path,
          // The router's listener declares no x-auth: its inference routes are its /v1 paths.
          auth: (op['x-auth'] as string) ?? (path.startsWith('/v1/') ? 'inference' : 'admin'),
          ...(body?.content?.['application/json'] ? { schema: body.content['application/json'].schema } : {}),
        })
      }
  }
})
afterAll(() => gw?.stop())

const admin = async () => ({
  authorization: `Bearer ${(await gw.host.auth.issueToken('walker', ['admin'])).token}`,
})

const concrete = (path: string) => path.replace(/\{[^}]+\}/g, 'walk-0')

/**
 * send: one call with a fresh admin token (the walk calls logout, which revokes the token it carries),
 * or on the router's listener the inference key its actions take.
 */
async function send(op: Op, body: unknown) {
  const res = await fetch(`${gw.host.urls[op.listener]}${concrete(op.path)}`, {
    method: op.method,
    headers: {
      ...(op.listener === 'router' ? { authorization: `Bearer ${KEY}` } : await admin()),
      'content-type': 'application/json',
    },
    body: JSON.stringify(body),
  })
  const text = await res.text()
  let error: { code?: string; message?: string } = {}
  try {
    error = (JSON.parse(text) as { error?: typeof error }).error ?? {}
  } catch {}
  return { status: res.status, error, text }
}

/** checked: the operations whose bodies are closed (everything but inference and the signed internal API). */
const checked = (op: Op) => op.auth !== 'inference' && op.auth !== 'internal' && op.method !== 'GET'

describe('a body field the route does not declare', () => {
  it('is refused on every admin and public operation that takes a JSON body, at the top and nested', async () => {
    const withBody = ops.filter((op) => checked(op) && op.schema)
    // Every plugin's bodies are in the walk (gateway, profiles, presets, settings, benchmarks, cluster, auth).
    for (const p of ['/api/v1/models/load', '/api/memory/profiles', '/api/configurations', '/api/settings'])
      expect(withBody.map((o) => o.path)).toContain(p)
    for (const p of ['/api/benchmarks', '/api/cluster/models/load', '/api/auth/login'])
      expect(withBody.map((o) => o.path)).toContain(p)
    const bad: string[] = []
    let nested = 0
    for (const op of withBody) {
      const body = minimal(op.schema!) as Record<string, unknown>
      const top = await send(op, { ...body, [PROBE]: true })
      if (
        top.status !== 400 ||
        top.error.code !== 'VALIDATION_ERROR' ||
        !top.error.message?.includes(`body.${PROBE}`)
      )
        bad.push(`${op.method} ${op.path} (top): ${top.status} ${top.text}`)
      const inner = firstNested(body)
      if (!inner) continue
      nested++
      inner.at[PROBE] = 1
      const deep = await send(op, body)
      const want = `${inner.path}.${PROBE}`
      if (
        deep.status !== 400 ||
        deep.error.code !== 'VALIDATION_ERROR' ||
        !deep.error.message?.includes(want)
      )
        bad.push(`${op.method} ${op.path} (${want}): ${deep.status} ${deep.text}`)
    }
    expect(bad).toEqual([])
    // The benchmarks' scenarios and the import bundles' items at least.
    expect(nested).toBeGreaterThanOrEqual(3)
  })

  it('is refused on every admin and public operation that takes no body (orphans, router actions, unload…)', async () => {
    const withoutBody = ops.filter((op) => checked(op) && !op.schema)
    expect(withoutBody.map((o) => `${o.listener} ${o.path}`)).toContain('router /action/sleep/{model_name}')
    expect(withoutBody.map((o) => o.path)).toContain('/api/orphans/{pid}')
    const bad: string[] = []
    for (const op of withoutBody) {
      const r = await send(op, { [PROBE]: 1 })
      const code = op.listener === 'router' ? 'invalid_request' : 'VALIDATION_ERROR'
      if (r.status !== 400 || r.error.code !== code || !r.error.message?.includes(`body.${PROBE}`))
        bad.push(`${op.listener} ${op.method} ${op.path}: ${r.status} ${r.text}`)
      // An empty object is no field at all: never refused for its fields.
      const empty = await send(op, {})
      if (empty.status === 400 && empty.error.message?.includes('unknown field'))
        bad.push(`${op.listener} ${op.method} ${op.path} refused {}: ${empty.text}`)
    }
    expect(bad).toEqual([])
  })

  it('names each of them, with the field it probably meant, and nothing loads (the reported load)', async () => {
    const load = ops.find((o) => o.path === '/api/v1/models/load')!
    const r = await send(load, {
      model_path: 'Qwen/Qwen2.5-7B-Instruct',
      enable_sleep_mod: true,
      gpu_id: [1],
    })
    expect(r.status).toBe(400)
    expect(r.error.code).toBe('VALIDATION_ERROR')
    expect(r.error.message).toContain(
      'body.enable_sleep_mod: unknown field (did you mean enable_sleep_mode?)',
    )
    expect(r.error.message).toContain('body.gpu_id: unknown field (did you mean gpu_ids?)')
    const listed = await gw.json<{ models: unknown[] }>('/api/v1/models', { headers: await admin() })
    expect(listed.body.models).toEqual([])
  })

  it('requires a token before it looks at the body (401, not 400)', async () => {
    const res = await fetch(`${gw.url}/api/v1/models/load`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model_path: 'm', [PROBE]: 1 }),
    })
    expect(res.status).toBe(401)
  })
})

describe('a body of the right shape', () => {
  it('loads where it says, and inference bodies keep the fields the engine knows', async () => {
    const auth = await admin()
    const ok = await gw.json<{ instance_id: string }>('/api/v1/models/load', {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({ model_path: 'facebook/opt-125m', enable_sleep_mode: true, gpu_ids: [1] }),
    })
    expect(ok.status).toBe(202)
    const id = ok.body.instance_id
    const model = await waitFor(
      `instance ${id} to be active`,
      async () => {
        const r = await gw.json<{ model: { status: string; gpu_ids: number[]; enable_sleep_mode: boolean } }>(
          `/api/v1/models/${id}`,
          { headers: auth },
        )
        return r.body.model.status === 'active' ? r.body.model : undefined
      },
      { timeoutMs: 20_000, wake: (notify) => gw.host.bus.on('gateway.instance.status', notify) },
    )
    expect(model.gpu_ids).toEqual([1])
    expect(model.enable_sleep_mode).toBe(true)
    // An extra sampling parameter (top_k) and a field nobody knows reach the engine: 200.
    const chat = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'facebook/opt-125m',
        messages: [{ role: 'user', content: 'hi', name: 'walker' }],
        max_tokens: 2,
        top_k: 5,
        [PROBE]: 1,
      }),
    })
    expect(chat.status).toBe(200)
    await chat.text()
  })
})

/** A probe plugin for the shapes the walk's routes may not all have: unions, records, open objects, replies. */
const probe = definePlugin({
  id: 'probe',
  description: 'test routes',
  config: T.Object({}, { additionalProperties: false }),
  setup: () => ({
    routes: new Elysia()
      .post('/api/probe/shapes', ({ body }) => body, {
        body: t.Object({
          target: t.Union([
            t.Object({ kind: t.Literal('gpu'), gpu_ids: t.Array(t.Integer()) }),
            t.Object({ kind: t.Literal('pod'), pod: t.String() }),
          ]),
          env: t.Optional(t.Record(t.String(), t.String())),
          labels: t.Optional(t.Object({}, { additionalProperties: true })),
          tags: t.Optional(t.Array(t.Object({ name: t.String() }))),
        }),
      })
      .get('/api/probe/reply', () => ({ name: 'shown', secret: 'left out' }), {
        response: t.Object({ name: t.String() }),
      }),
  }),
}) as unknown as PluginDefinition

describe('unknown fields in the shapes a schema can take', () => {
  let th: TestHost
  beforeAll(async () => {
    th = await startHost('plugins:\n  probe: {}\n', [probe])
  })
  afterAll(() => th.stop())

  const post = async (body: unknown) => {
    const res = await fetch(`${th.url}/api/probe/shapes`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    })
    return {
      status: res.status,
      body: (await res.json()) as { error?: { code: string; message: string } } & object,
    }
  }

  it("accepts a record's keys, an open object's members and the union branch a value fits", async () => {
    const body = {
      target: { kind: 'pod', pod: 'b' },
      env: { HF_HOME: '/srv/hf', ANY_NAME: 'x' },
      labels: { team: 'a', cost_centre: 7 },
      tags: [{ name: 'x' }],
    }
    expect(await post(body)).toEqual({ status: 200, body })
  })

  it('names an unknown member inside a union branch, a record value is free, an array item is by index', async () => {
    const r = await post({
      target: { kind: 'gpu', gpu_ids: [0], gpu_id: 1 },
      tags: [{ name: 'a' }, { nmae: 'b' }],
    })
    expect(r.status).toBe(400)
    expect(r.body.error?.code).toBe('VALIDATION_ERROR')
    expect(r.body.error?.message).toBe(
      'body.target.gpu_id: unknown field (did you mean gpu_ids?); body.tags[1].nmae: unknown field (did you mean name?)',
    )
  })

  it('names a key that is not an identifier in brackets, and stops naming after twenty', async () => {
    const many = Object.fromEntries(Array.from({ length: 25 }, (_, i) => [`extra-${i}`, i]))
    const r = await post({ target: { kind: 'pod', pod: 'b' }, ...many })
    expect(r.status).toBe(400)
    expect(r.body.error?.message).toContain('body["extra-0"]: unknown field')
    expect(r.body.error?.message).toContain('body["extra-19"]: unknown field; and 5 more')
    expect(r.body.error?.message).not.toContain('extra-20')
  })

  it('leaves an undeclared member out of a reply, never an error', async () => {
    const res = await fetch(`${th.url}/api/probe/reply`)
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual({ name: 'shown' })
  })
})
