import { rmSync } from 'node:fs'
import { addressedTo, CLUSTER_HEADERS, signRequest } from '../../plugins/cluster/signing.ts'
import { freePort } from '../sim/helpers.ts'
import type { TestEtcd } from './etcd.ts'
import { startGateway, type TestGateway } from './gateway.ts'
import { waitFor } from './wait.ts'

/**
 * Test support for clusters of in-process pods: several gateways (real listeners, real simulated
 * engines, their own data dirs and simulated GPUs) led through a real etcd, each logged in as admin;
 * and a correctly signed internal call, as a pod (or a deposed leader) would send it.
 */
export interface EtcdPodsOptions<Id extends string> {
  ids: readonly Id[]
  etcd: TestEtcd
  clusterId: string
  /** the first engine port; pod i gets [base + 10 i, base + 10 i + 9] */
  enginePortBase: number
  /** AUTH_MODE simple with ADMIN_PASSWORD, CLUSTER_SECRET, JWT_SECRET... */
  hostEnv: Record<string, string> & { ADMIN_PASSWORD: string }
  /** the simulated engine's environment */
  env?: Record<string, string>
  /** more of `plugins:` (indented by two spaces), e.g. `  benchmarks: {}\n` */
  extraYaml?: string
  sessionTtlSeconds?: number
  /** more of each pod's `server:` section (beside its port), e.g. `{ max_buffered_body_bytes: … }` */
  server?: Record<string, string | number>
}

export interface EtcdPods<Id extends string> {
  pods: Record<Id, TestGateway>
  tokens: Record<Id, string>
  /** leader: the pod all agree leads, and its term, once every pod sees all of them healthy */
  leader: Id
  term: number
  /** stopPod shuts one pod down, keeping its data dir (and simulated GPUs) for startPod. */
  stopPod(id: Id): Promise<void>
  /** startPod starts a stopped pod again on its data dir, port and address (its old token still holds). */
  startPod(id: Id): Promise<TestGateway>
  stop(): Promise<void>
}

export async function startEtcdPods<Id extends string>(o: EtcdPodsOptions<Id>): Promise<EtcdPods<Id>> {
  const pods = {} as Record<Id, TestGateway>
  const tokens = {} as Record<Id, string>
  const ports = {} as Record<Id, number>
  for (const id of o.ids) ports[id] = await freePort()
  const ttl = o.sessionTtlSeconds ? `, session_ttl_seconds: ${o.sessionTtlSeconds}` : ''
  /** Sim dirs of restarted pods: passed in, so their stop leaves them to us. */
  const simDirs: string[] = []
  const start = (id: Id, again?: TestGateway) => {
    const i = o.ids.indexOf(id)
    return startGateway({
      ports: [o.enginePortBase + i * 10, o.enginePortBase + i * 10 + 9],
      hostEnv: o.hostEnv,
      server: { ...o.server, port: ports[id] },
      ...(o.env ? { env: o.env } : {}),
      ...(again ? { dataDir: again.dataDir, simDir: again.simDir } : {}),
      extraYaml: [
        (o.extraYaml ?? '').replace(/\n$/, ''),
        '  cluster:',
        `    cluster_id: ${o.clusterId}`,
        `    pod_id: ${id}`,
        `    advertise_address: http://127.0.0.1:${ports[id]}`,
        `    expected_size: ${o.ids.length}`,
        '    coordination:',
        '      kind: etcd',
        `      etcd: { endpoints: ['${o.etcd.url}'], prefix: /modelgate-${o.clusterId}${ttl} }`,
        '',
      ]
        .filter((l, n) => n > 0 || l !== '')
        .join('\n'),
    })
  }
  await Promise.all(
    o.ids.map(async (id) => {
      pods[id] = await start(id)
      const login = await pods[id].json<{ token: string }>('/api/auth/login', {
        method: 'POST',
        body: JSON.stringify({ username: 'admin', password: o.hostEnv.ADMIN_PASSWORD }),
      })
      if (login.status !== 200) throw new Error(`login on pod ${id}: ${login.status}`)
      tokens[id] = login.body.token
    }),
  )
  const lead = await waitFor(
    `all ${o.ids.length} pods healthy and agreeing on a leader`,
    async () => {
      const v = await Promise.all(
        o.ids.map((id) =>
          pods[id].json<{ healthyPodCount: number; leaderId: string | null; term: number }>('/api/cluster', {
            headers: { authorization: `Bearer ${tokens[id]}` },
          }),
        ),
      )
      const first = v[0]!.body
      return v.every(
        (x) =>
          x.body.healthyPodCount === o.ids.length && x.body.leaderId && x.body.leaderId === first.leaderId,
      )
        ? first
        : undefined
    },
    { timeoutMs: 30_000, pollMs: 100 },
  )
  return {
    pods,
    tokens,
    leader: lead.leaderId as Id,
    term: lead.term,
    stopPod: (id) => pods[id].stopKeep(),
    async startPod(id) {
      if (!simDirs.includes(pods[id].simDir)) simDirs.push(pods[id].simDir)
      pods[id] = await start(id, pods[id])
      return pods[id]
    },
    async stop() {
      await Promise.all(o.ids.map((id) => pods[id]?.stop()))
      for (const dir of simDirs) rmSync(dir, { recursive: true, force: true })
    },
  }
}

/**
 * signedFetch: an internal call to pod `to` (at `baseUrl`) signed with `secret`, from pod `from`
 * carrying term `term`.
 */
export function signedFetch(
  baseUrl: string,
  secret: string,
  method: string,
  path: string,
  body: unknown,
  o: { from: string; to: string; term: number },
): Promise<Response> {
  const bytes = Buffer.from(body === undefined ? '' : typeof body === 'string' ? body : JSON.stringify(body))
  const ts = Date.now()
  const target = addressedTo(path, o.to)
  return fetch(`${baseUrl}${target}`, {
    method,
    headers: {
      'content-type': 'application/json',
      [CLUSTER_HEADERS.signature]: signRequest(secret, method, target, ts, bytes),
      [CLUSTER_HEADERS.timestamp]: String(ts),
      [CLUSTER_HEADERS.pod]: o.from,
      [CLUSTER_HEADERS.term]: String(o.term),
    },
    ...(method === 'GET' ? {} : { body: bytes }),
  })
}
