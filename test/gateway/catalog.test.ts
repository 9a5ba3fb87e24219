import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { join } from 'node:path'
import type { CatalogChange } from '../../plugins/gateway/api.ts'
import { plugins } from '../../plugins/index.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'

/**
 * The catalogue (plugins.gateway.catalog and /api/catalog) on a real host with auth on, over real
 * sockets, on simulated GPUs (2 × H100 80 GB): what each role may do, the YAML's entries read-only
 * through the API (the refusal names the file), the fit refused with its figures, saved entries kept
 * across a restart on the same data dir, and the change events.
 */
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-catalog', JWT_SECRET: 'k'.repeat(40) }
const H100 = 'NVIDIA H100 80GB HBM3'
const YAML_CATALOG = [
  '    catalog:',
  "      - { name: 'org/yaml-model:v1', model_path: facebook/opt-125m, pin: true, enable_sleep_mode: true }",
  '      - { name: second, model_path: facebook/opt-350m, gpu_ids: [1], extra_args: [--enforce-eager] }',
  '',
].join('\n')

type Json = Record<string, unknown> & { error?: { code: string; message: string } }

let gw: TestGateway
let admin = ''
let viewer = ''

const as =
  (token: string | null) =>
  (path: string, init: RequestInit = {}) =>
    gw.json<Json>(path, {
      ...init,
      headers: token ? { authorization: `Bearer ${token}`, ...init.headers } : { ...init.headers },
    })
const put = (token: string | null, name: string, body: unknown) =>
  as(token)(`/api/catalog/${encodeURIComponent(name)}`, { method: 'PUT', body: JSON.stringify(body) })
const del = (token: string | null, name: string) =>
  as(token)(`/api/catalog/${encodeURIComponent(name)}`, { method: 'DELETE' })
const list = async () => (await as(admin)('/api/catalog')).body as { entries: Json[]; total: number }

beforeAll(async () => {
  gw = await startGateway({
    ports: [27400, 27409],
    gpus: '2x80',
    hostEnv: AUTH,
    configFile: 'modelgate.yaml',
    extraYaml: YAML_CATALOG,
  })
  admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
  viewer = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
}, 30_000)
afterAll(async () => {
  await gw?.stop()
})

describe('the catalogue through its API', () => {
  it('lists the YAML entries to both roles, defaults applied, source config, and nothing without a token', async () => {
    expect((await as(null)('/api/catalog')).status).toBe(401)
    const r = await as(viewer)('/api/catalog')
    expect(r.status).toBe(200)
    expect(r.body).toEqual({
      total: 2,
      entries: [
        {
          name: 'org/yaml-model:v1',
          engine_kind: null,
          model_path: 'facebook/opt-125m',
          max_tokens: null,
          tensor_parallel_size: 1,
          gpu_memory_utilization: null,
          enable_sleep_mode: true,
          extra_args: [],
          gpu_ids: null,
          pin: true,
          preload: false,
          source: 'config',
          updated_at: null,
        },
        {
          name: 'second',
          engine_kind: null,
          model_path: 'facebook/opt-350m',
          max_tokens: null,
          tensor_parallel_size: 1,
          gpu_memory_utilization: null,
          enable_sleep_mode: false,
          extra_args: ['--enforce-eager'],
          gpu_ids: [1],
          pin: false,
          preload: false,
          source: 'config',
          updated_at: null,
        },
      ],
    })
    expect(gw.host.api<{ catalogEntry(n: string): unknown }>('gateway').catalogEntry('second')).toEqual(
      (r.body.entries as Json[])[1],
    )
  })

  it('creates (201), replaces (200), reads and removes an entry as admin; refuses writes to admin-readonly', async () => {
    const changes: CatalogChange[] = []
    const off = gw.host.bus.on('gateway.catalog.changed', (c) => changes.push(c))
    const name = 'org/qwen:7b'
    const body = { model_path: 'Qwen/Qwen2.5-7B-Instruct', max_tokens: 8192, gpu_memory_utilization: 0.45 }
    expect((await put(null, name, body)).status).toBe(401)
    const refused = await put(viewer, name, body)
    expect([refused.status, refused.body.error?.code]).toEqual([403, 'FORBIDDEN'])
    expect(await list()).toMatchObject({ total: 2 })

    const created = await put(admin, name, body)
    expect(created.status).toBe(201)
    expect(created.body).toMatchObject({
      name,
      ...body,
      tensor_parallel_size: 1,
      enable_sleep_mode: false,
      extra_args: [],
      gpu_ids: null,
      pin: false,
      preload: false,
      source: 'api',
    })
    expect(created.body.warning).toBeUndefined()
    const first = created.body.updated_at as string
    expect(Date.parse(first)).toBeGreaterThan(Date.now() - 60_000)

    const replaced = await put(admin, name, { ...body, pin: true, enable_sleep_mode: true, gpu_ids: [0, 1] })
    expect(replaced.status).toBe(200)
    expect(replaced.body).toMatchObject({
      pin: true,
      enable_sleep_mode: true,
      gpu_ids: [0, 1],
      tensor_parallel_size: 2,
    })
    expect((replaced.body.updated_at as string) >= first).toBe(true)

    // One entry, found by its name encoded in one segment or spelled with its slash.
    const all = await list()
    expect(all.entries.map((e) => [e.name, e.source])).toEqual([
      ['org/qwen:7b', 'api'],
      ['org/yaml-model:v1', 'config'],
      ['second', 'config'],
    ])
    const encoded = await as(viewer)(`/api/catalog/${encodeURIComponent(name)}`)
    const plain = await as(viewer)(`/api/catalog/${name}`)
    expect([encoded.status, plain.status]).toEqual([200, 200])
    expect(encoded.body).toEqual(all.entries[0]!)
    expect(plain.body).toEqual(encoded.body)

    expect((await del(viewer, name)).status).toBe(403)
    const removed = await as(admin)(`/api/catalog/${name}`, { method: 'DELETE' })
    expect([removed.status, removed.body]).toEqual([200, { deleted: true, name }])
    const gone = await as(viewer)(`/api/catalog/${encodeURIComponent(name)}`)
    expect([gone.status, gone.body.error?.code]).toEqual([404, 'CATALOG_ENTRY_NOT_FOUND'])
    expect((await del(admin, name)).status).toBe(404)
    off()
    expect(
      changes.map((c) => (c.change === 'saved' ? `saved ${c.entry.name} ${c.created}` : `removed ${c.name}`)),
    ).toEqual(['saved org/qwen:7b true', 'saved org/qwen:7b false', 'removed org/qwen:7b'])
    expect(changes[1]).toMatchObject({ entry: replaced.body })
  })

  it('keeps a YAML entry read-only: PUT and DELETE are 409 naming the file and the entry', async () => {
    const file = join(gw.dataDir, 'modelgate.yaml')
    for (const r of [
      await put(admin, 'second', { model_path: 'other/model' }),
      await del(admin, 'second'),
      await del(admin, 'org/yaml-model:v1'),
    ]) {
      expect([r.status, r.body.error?.code]).toEqual([409, 'CATALOG_ENTRY_FROM_CONFIG'])
      expect(r.body.error?.message).toContain(file)
    }
    const r = await put(admin, 'second', { model_path: 'other/model' })
    expect(r.body.error?.message).toContain('plugins.gateway.catalog[1]')
    expect((await list()).entries.find((e) => e.name === 'second')).toMatchObject({
      model_path: 'facebook/opt-350m',
      source: 'config',
    })
  })

  it('refuses an entry no set of its GPUs could hold, with the need per GPU, each GPU kind and the TP', async () => {
    const tp4 = await put(admin, 'four-way', { model_path: 'big/model', tensor_parallel_size: 4 })
    expect([tp4.status, tp4.body.error?.code]).toEqual([400, 'CATALOG_ENTRY_TOO_LARGE'])
    // 81559 MiB = 79.6 GiB; without a profile the need is 0.9 (the default utilization) × the device.
    for (const figure of [
      'tensor_parallel_size 4',
      `${H100}: 2 GPUs of 79.6 GiB`,
      'needs 71.7 GiB per GPU',
      'fewer than 4',
    ])
      expect(tp4.body.error?.message).toContain(figure)

    const missing = await put(admin, 'pinned-gpus', { model_path: 'big/model', gpu_ids: [0, 5] })
    expect([missing.status, missing.body.error?.code]).toEqual([400, 'CATALOG_ENTRY_TOO_LARGE'])
    expect(missing.body.error?.message).toContain('GPU 5 does not exist (GPUs: 0, 1)')

    // A memory profile says the model needs more than one of these GPUs holds, whatever its utilization.
    const profile = await as(admin)('/api/memory/profiles', {
      method: 'POST',
      body: JSON.stringify({
        profileName: 'huge on a larger H100',
        modelPath: 'org/huge',
        maxTokens: 4096,
        totalGpuMemoryGib: 120,
        weightsMemoryGib: 100,
        cudaGraphsGib: 2,
        gpuName: H100,
        gpuTotalMemoryGib: 141,
        gpuMemoryUtilization: 0.9,
      }),
    })
    expect(profile.status).toBe(201)
    const huge = await put(admin, 'huge', { model_path: 'org/huge', max_tokens: 4096 })
    expect([huge.status, huge.body.error?.code]).toEqual([400, 'CATALOG_ENTRY_TOO_LARGE'])
    expect(huge.body.error?.message).toContain(
      "2 GPUs of 79.6 GiB each; it needs 102.0 GiB per GPU (memory profile 'huge on a larger H100'), more than one holds",
    )
    const onOne = await put(admin, 'huge', { model_path: 'org/huge', max_tokens: 4096, gpu_ids: [1] })
    expect(onOne.body.error?.message).toContain(`GPU 1 (${H100}) has 79.6 GiB, it needs 102.0 GiB per GPU`)

    // Nothing refused was stored; what fits is.
    expect((await list()).entries.map((e) => e.name)).toEqual(['org/yaml-model:v1', 'second'])
    const fits = await put(admin, 'two-way', { model_path: 'big/model', tensor_parallel_size: 2 })
    expect(fits.status).toBe(201)
    expect((await del(admin, 'two-way')).status).toBe(200)
  }, 30_000)

  it('refuses what a load would refuse, when it is saved: gpu_ids against the TP, flags the load sets itself, abbreviated or not, a utilization below the floor', async () => {
    const mismatch = await put(admin, 'm', { model_path: 'a/b', gpu_ids: [0], tensor_parallel_size: 2 })
    expect([mismatch.status, mismatch.body.error?.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(mismatch.body.error?.message).toBe('tensor_parallel_size (2) must equal the number of gpu_ids (1)')
    const flag = await put(admin, 'm', { model_path: 'a/b', extra_args: ['--max-model-len', '4096'] })
    expect(flag.body.error?.message).toContain('extra_args must not set --max-model-len')
    const abbreviated = await put(admin, 'm', { model_path: 'a/b', extra_args: ['--max-model', '4096'] })
    expect([abbreviated.status, abbreviated.body.error?.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(abbreviated.body.error?.message).toBe(
      'extra_args --max-model abbreviates --max-model-len (argparse accepts a unique prefix): ' +
        "extra_args must not set --max-model-len; use the load request's own field instead",
    )
    const tiny = await put(admin, 'm', { model_path: 'a/b', gpu_memory_utilization: 1e-300 })
    expect([tiny.status, tiny.body.error?.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(tiny.body.error?.message).toContain('gpu_memory_utilization')
    const repeat = await put(admin, 'm', { model_path: 'a/b', gpu_ids: [1, 1] })
    expect(repeat.body.error?.message).toBe('gpu_ids must not repeat a GPU')
    // An engine this modelgate does not know; a flag the entry's own engine's load sets (SGLang's).
    const unknown = await put(admin, 'm', { model_path: 'a/b', engine_kind: 'llama.cpp' })
    expect([unknown.status, unknown.body.error?.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(unknown.body.error?.message).toContain('engine_kind')
    const sglangFlag = await put(admin, 'm', {
      model_path: 'a/b',
      engine_kind: 'sglang',
      extra_args: ['--mem-fraction-static', '0.5'],
    })
    expect([sglangFlag.status, sglangFlag.body.error?.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(sglangFlag.body.error?.message).toContain('--mem-fraction-static')
    expect((await list()).total).toBe(2)
  })

  it('refuses a name that differs only in case from an entry, from either source; lookups stay exact', async () => {
    const yamlTwin = await put(admin, 'ORG/yaml-model:V1', { model_path: 'a/b' })
    expect([yamlTwin.status, yamlTwin.body.error?.code, yamlTwin.body.error?.message]).toEqual([
      409,
      'CATALOG_NAME_TAKEN',
      "'ORG/yaml-model:V1' differs only in case from the catalogue entry 'org/yaml-model:v1' " +
        `(defined in ${join(gw.dataDir, 'modelgate.yaml')}, plugins.gateway.catalog[0]): names are unique whatever their case`,
    ])
    expect((await put(admin, 'Qwen/X', { model_path: 'Qwen/Qwen2.5-7B-Instruct' })).status).toBe(201)
    const twin = await put(admin, 'qwen/x', { model_path: 'a/b' })
    expect([twin.status, twin.body.error?.code]).toEqual([409, 'CATALOG_NAME_TAKEN'])
    expect(twin.body.error?.message).toBe(
      "'qwen/x' differs only in case from the catalogue entry 'Qwen/X': names are unique whatever their case",
    )
    // The entry itself is replaced as before; another spelling does not find it, and the 404 says which.
    expect((await put(admin, 'Qwen/X', { model_path: 'Qwen/Qwen2.5-7B-Instruct', pin: true })).status).toBe(
      200,
    )
    const other = await as(viewer)(`/api/catalog/${encodeURIComponent('qwen/x')}`)
    expect([other.status, other.body.error?.code, other.body.error?.message]).toEqual([
      404,
      'CATALOG_ENTRY_NOT_FOUND',
      "No catalogue entry named 'qwen/x' (names match exactly: there is 'Qwen/X')",
    ])
    expect((await del(admin, 'qwen/x')).status).toBe(404)
    expect((await del(admin, 'Qwen/X')).status).toBe(200)
    expect((await list()).total).toBe(2)
  })
})

describe('the catalogue across a restart', () => {
  it('keeps the entries saved through the API on the same data dir; the YAML entries come from the file', async () => {
    const saved = await put(admin, 'kept/model:1', {
      model_path: 'facebook/opt-125m',
      preload: false,
      pin: true,
    })
    expect(saved.status).toBe(201)
    const before = await list()
    await gw.stopKeep()
    gw = await startGateway({
      ports: [27400, 27409],
      gpus: '2x80',
      hostEnv: AUTH,
      dataDir: gw.dataDir,
      configFile: 'modelgate.yaml',
      extraYaml: YAML_CATALOG,
    })
    admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    expect(await list()).toEqual(before)
    expect((await del(admin, 'kept/model:1')).status).toBe(200)
  }, 60_000)
})

describe('the catalogue without a GPU probe', () => {
  let th: TestHost
  beforeAll(async () => {
    th = await startHost('plugins:\n  gateway:\n    gpu: { smi_command: null }\n', plugins, AUTH)
  }, 30_000)
  afterAll(() => th?.stop())

  it('saves the entry unchecked and says so in a warning', async () => {
    const token = (await th.host.auth.issueToken('ops', ['admin'])).token
    const r = await fetch(`${th.url}/api/catalog/anywhere`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model_path: 'big/model', tensor_parallel_size: 8 }),
    })
    expect(r.status).toBe(201)
    const body = (await r.json()) as Json
    expect(body).toMatchObject({ name: 'anywhere', tensor_parallel_size: 8, source: 'api' })
    expect(body.warning).toMatch(/^the fit could not be checked: no GPU probe/)
    const listed = (await (
      await fetch(`${th.url}/api/catalog`, { headers: { authorization: `Bearer ${token}` } })
    ).json()) as { entries: Json[] }
    expect(listed.entries.map((e) => [e.name, 'warning' in e])).toEqual([['anywhere', false]])
  })
})

describe('the YAML catalogue at start', () => {
  it('logs an entry this host could never hold, with its figures (check-config cannot see the GPUs)', async () => {
    const g = await startGateway({
      ports: [27430, 27439],
      gpus: '2x80',
      extraYaml: '    catalog:\n      - { name: too-wide, model_path: x/y, tensor_parallel_size: 4 }\n',
    })
    try {
      const line = g.logs.find((l) => l.includes('plugins.gateway.catalog[0]'))
      expect(line).toContain("Catalogue entry 'too-wide' (x/y, tensor_parallel_size 4) fits no set of 4 GPUs")
      expect(line).toContain(`${H100}: 2 GPUs of 79.6 GiB each, fewer than 4`)
      // Still listed: the operator decides, and a host with more GPUs may take the same file.
      const r = await g.json<{ entries: Json[] }>('/api/catalog')
      expect(r.body.entries.map((e) => e.name)).toEqual(['too-wide'])
    } finally {
      await g.stop()
    }
  }, 30_000)
})
