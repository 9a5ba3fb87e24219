import { afterEach, beforeEach, describe, expect, it } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { ClusterConfig } from '../../plugins/cluster/config.ts'
import { KubernetesCoordinator } from '../../plugins/cluster/coordination/kubernetes.ts'
import type { CoordinatorChange } from '../../plugins/cluster/coordination/types.ts'
import { Logger } from '../../src/host/logger.ts'
import { LeaseStandIn } from '../support/lease-stand-in.ts'
import { waitFor } from '../support/wait.ts'

/**
 * How the `kubernetes` coordination backend reaches the API (in a pod: KUBERNETES_SERVICE_HOST over
 * TLS with the service account's CA, token and namespace files; the token re-read as it rotates)
 * and discovers its peers (pods by label, or a headless Service's Endpoints), against LeaseStandIn:
 * a STAND-IN for the Kubernetes API server, not a real one.
 */
type KubeConfig = ClusterConfig['coordination']['kubernetes']

let standIn: LeaseStandIn | undefined
let dir: string
let tokenFile: string
let running: KubernetesCoordinator[]

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'k8s-connection-'))
  tokenFile = join(dir, 'token')
  writeFileSync(tokenFile, 'token-1\n')
  running = []
})

afterEach(async () => {
  await Promise.all(running.map((c) => c.stop(AbortSignal.timeout(5000))))
  await standIn?.stop()
  standIn = undefined
  rmSync(dir, { recursive: true, force: true })
})

function coordinator(podId: string, over: Partial<KubeConfig> = {}, env: Record<string, string> = {}) {
  const cfg: KubeConfig = {
    api_url: standIn!.url,
    namespace: 'default',
    token_file: tokenFile,
    ca_file: join(dir, 'ca.crt'),
    lease_name: 'modelgate-leader',
    lease_duration_seconds: 15,
    renew_deadline_seconds: 10,
    retry_period_seconds: 0.02,
    discovery: { label_selector: 'app.kubernetes.io/name=modelgate', port: 3000 },
    ...over,
  }
  const log = new Logger('error', podId, 'text', () => {})
  const c = new KubernetesCoordinator(cfg, { podId, address: 'http://127.0.0.1:4000', log, env })
  running.push(c)
  return c
}

/** openssl: a CA and an API server certificate for 127.0.0.1 signed by it (as a cluster's own CA). */
function certificates(): { ca: string; cert: string; key: string } {
  const run = (...args: string[]) => {
    const p = Bun.spawnSync(['openssl', ...args], { cwd: dir, stderr: 'pipe' })
    if (p.exitCode !== 0) throw new Error(`openssl ${args[0]}: ${p.stderr.toString()}`)
  }
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
  run('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '1', '-subj', '/CN=stand-in-ca')
  run('req', ...ec, '-keyout', 'api.key', '-out', 'api.csr', '-subj', '/CN=kube-apiserver')
  writeFileSync(join(dir, 'san.ext'), 'subjectAltName=IP:127.0.0.1\n')
  run(
    'x509',
    '-req',
    '-in',
    'api.csr',
    '-CA',
    'ca.crt',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'api.crt',
    '-days',
    '1',
    '-extfile',
    'san.ext',
  )
  const read = (f: string) => readFileSync(join(dir, f), 'utf8')
  return { ca: read('ca.crt'), cert: read('api.crt'), key: read('api.key') }
}

describe('kubernetes coordination: reaching the API (stand-in API server, not a real one)', () => {
  it("in a pod: KUBERNETES_SERVICE_HOST/PORT over TLS checked against the service account's CA, namespace from its file", async () => {
    const { cert, key } = certificates()
    standIn = new LeaseStandIn('token-1', { cert, key })
    writeFileSync(join(dir, 'namespace'), 'team-a\n')
    const env = { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: String(standIn.port) }
    const c = coordinator('pod-a', { api_url: undefined, namespace: undefined }, env)
    await c.start()
    await waitFor('pod-a leading', () => c.leadership().isLeader)
    expect(standIn.lease('modelgate-leader', 'team-a')!.spec.holderIdentity).toBe('pod-a')
  })

  it('refuses an API server whose certificate the CA file does not vouch for', async () => {
    const { cert, key } = certificates()
    standIn = new LeaseStandIn('token-1', { cert, key })
    const other = mkdtempSync(join(tmpdir(), 'k8s-other-ca-'))
    try {
      const p = Bun.spawnSync(
        [
          'openssl',
          'req',
          '-x509',
          '-newkey',
          'ec',
          '-pkeyopt',
          'ec_paramgen_curve:prime256v1',
          '-nodes',
          '-keyout',
          'ca.key',
          '-out',
          'ca.crt',
          '-days',
          '1',
          '-subj',
          '/CN=another-ca',
        ],
        { cwd: other, stderr: 'pipe' },
      )
      expect(p.exitCode).toBe(0)
      const c = coordinator('pod-a', { ca_file: join(other, 'ca.crt') })
      await expect(c.start()).rejects.toThrow(
        /could not start: .*Kubernetes API https:\/\/127\.0\.0\.1:\d+ unreachable/,
      )
      expect(standIn.calls).toEqual([])
    } finally {
      rmSync(other, { recursive: true, force: true })
    }
  })

  it('outside a pod without api_url or K8S_API_URL: start says what to set', async () => {
    standIn = new LeaseStandIn('token-1')
    const c = coordinator('pod-a', { api_url: undefined })
    await expect(c.start()).rejects.toThrow(/not in a pod .*K8S_API_URL/)
  })

  it('outside a pod: K8S_API_URL and K8S_TOKEN', async () => {
    standIn = new LeaseStandIn('a-token-from-the-environment')
    const env = { K8S_API_URL: standIn.url, K8S_TOKEN: 'a-token-from-the-environment' }
    const c = coordinator('pod-a', { api_url: undefined, token_file: join(dir, 'absent') }, env)
    await c.start()
    await waitFor('pod-a leading', () => c.leadership().isLeader)
  })

  it('reads the token file again on every call, so a rotated service-account token keeps working', async () => {
    standIn = new LeaseStandIn('token-1')
    const c = coordinator('pod-a')
    await c.start()
    await waitFor('pod-a leading', () => c.leadership().isLeader)
    standIn!.token = 'token-2'
    writeFileSync(tokenFile, 'token-2\n')
    const after = standIn!.calls.length
    await waitFor('five calls accepted with the new token', () =>
      standIn!.calls.slice(after).filter((call) => call.status === 200).length >= 5 ? true : undefined,
    )
    expect(standIn!.calls.slice(after).filter((call) => call.status === 401).length).toBeLessThanOrEqual(2)
  })
})

describe('kubernetes peer discovery against the stand-in API (not a real API server)', () => {
  beforeEach(() => {
    standIn = new LeaseStandIn('token-1')
  })

  it('lists Running, Ready pods with an IP by label; itself always; the leader address from its pod', async () => {
    const labels = { 'app.kubernetes.io/name': 'modelgate' }
    standIn!.pods = [
      { name: 'pod-a', ip: '10.0.0.1', labels },
      { name: 'pod-b', ip: '10.0.0.2', labels },
      { name: 'pod-c', ip: '10.0.0.3', labels, ready: false },
      { name: 'pod-d', ip: '10.0.0.4', labels, phase: 'Pending' },
      { name: 'pod-e', ip: '10.0.0.5', labels, deleting: true },
      { name: 'pod-f', labels },
      { name: 'other', ip: '10.0.0.9', labels: { 'app.kubernetes.io/name': 'other' } },
    ]
    const at = '2026-01-01T00:00:00.000000Z'
    standIn!.seedLease('modelgate-leader', {
      holderIdentity: 'pod-b',
      leaseDurationSeconds: 15,
      acquireTime: at,
      renewTime: at,
      leaseTransitions: 2,
    })
    const c = coordinator('pod-a')
    const changes: CoordinatorChange[] = []
    c.subscribe((ch) => changes.push(ch))
    await c.start()
    expect(c.peers()).toEqual([
      { podId: 'pod-a', address: 'http://127.0.0.1:4000' },
      { podId: 'pod-b', address: 'http://10.0.0.2:3000' },
    ])
    expect(c.leadership()).toEqual({
      leaderId: 'pod-b',
      leaderAddress: 'http://10.0.0.2:3000',
      term: 2,
      isLeader: false,
    })

    standIn!.pods[2]!.ready = true
    const change = await waitFor('a peers change with pod-c', () =>
      changes.find((ch) => ch.type === 'peers' && ch.peers.some((p) => p.podId === 'pod-c')),
    )
    expect(change).toEqual({
      type: 'peers',
      peers: [
        { podId: 'pod-a', address: 'http://127.0.0.1:4000' },
        { podId: 'pod-b', address: 'http://10.0.0.2:3000' },
        { podId: 'pod-c', address: 'http://10.0.0.3:3000' },
      ],
    })
  })

  it("lists the ready addresses of a headless Service's Endpoints when discovery.service is set", async () => {
    const c = coordinator('modelgate-0', {
      discovery: { label_selector: 'app.kubernetes.io/name=modelgate', service: 'modelgate', port: 3000 },
    })
    await c.start()
    // No Endpoints object yet (the controller has not written it): only itself, and no failure.
    expect(c.peers()).toEqual([{ podId: 'modelgate-0', address: 'http://127.0.0.1:4000' }])
    expect(standIn!.calls.some((call) => call.resource === 'endpoints' && call.status === 404)).toBe(true)
    standIn!.setEndpoints('modelgate', [
      { ip: '10.0.1.1', pod: 'modelgate-0' },
      { ip: '10.0.1.2', pod: 'modelgate-1' },
    ])
    await waitFor('modelgate-1 among the peers', () => c.peers().length === 2)
    expect(c.peers()).toEqual([
      { podId: 'modelgate-0', address: 'http://127.0.0.1:4000' },
      { podId: 'modelgate-1', address: 'http://10.0.1.2:3000' },
    ])
    standIn!.setEndpoints('modelgate', [{ ip: '10.0.1.1', pod: 'modelgate-0' }])
    await waitFor('modelgate-1 gone from the peers', () => c.peers().length === 1)
    expect(standIn!.calls.some((call) => call.resource === 'pods')).toBe(false)
  })
})
