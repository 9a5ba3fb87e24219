import { afterEach, describe, expect, it } from 'bun:test'
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { type IStatefulSet, StatefulSet } from 'kubernetes-models/apps/v1'
import {
  type IRole,
  type IRoleBinding,
  Role,
  RoleBinding,
} from 'kubernetes-models/rbac.authorization.k8s.io/v1'
import {
  ConfigMap,
  type IConfigMap,
  type IService,
  type IServiceAccount,
  Namespace,
  Service,
  ServiceAccount,
} from 'kubernetes-models/v1'
import { parseAllDocuments } from 'yaml'
import { ClusterConfig } from '../../plugins/cluster/config.ts'
import { KubernetesCoordinator } from '../../plugins/cluster/coordination/kubernetes.ts'
import { plugins } from '../../plugins/index.ts'
import { knownPlugins } from '../../src/config/file.ts'
import { type ConfigError, loadConfig } from '../../src/config/load.ts'
import { Logger } from '../../src/host/logger.ts'
import { LeaseStandIn, type RbacRule } from '../support/lease-stand-in.ts'
import { waitFor } from '../support/wait.ts'

/**
 * config/kubernetes/: every document validated against the Kubernetes OpenAPI schemas by
 * kubernetes-models (offline), then checked against each other and against modelgate itself: the
 * StatefulSet's environment and mounts against the ConfigMap's YAML (validated by modelgate's own
 * loader), and the Role against what the Lease coordinator really calls, by running it against the
 * stand-in Kubernetes API (test/support/lease-stand-in.ts, not a real API server) enforcing that Role.
 */
const DIR = resolve(import.meta.dir, '../../config/kubernetes')
const MODELS = { Namespace, ServiceAccount, Role, RoleBinding, ConfigMap, Service, StatefulSet }
type Doc = { kind: string; metadata: { name: string; namespace?: string } }

/** The files `kubectl apply -f config/kubernetes/` reads: its extensions, not the folder's other files. */
const files = readdirSync(DIR).filter((f) => /\.(ya?ml|json)$/.test(f))
const docs: Doc[] = files.flatMap((f) =>
  parseAllDocuments(readFileSync(join(DIR, f), 'utf8')).map((d) => {
    if (d.errors.length) throw new Error(`${f}: ${d.errors[0]!.message}`)
    return d.toJS() as Doc
  }),
)
/** one: the only document of a kind, typed as kubernetes-models declares it (validated below). */
function one<T>(kind: string): T {
  const found = docs.filter((d) => d.kind === kind)
  if (found.length !== 1) throw new Error(`expected one ${kind}, found ${found.length}`)
  return found[0] as T
}
const sts = one<IStatefulSet>('StatefulSet')
const pod = sts.spec!.template.spec!
const container = pod.containers[0]!
const env = (name: string) => container.env?.find((e) => e.name === name)?.valueFrom
const configMap = one<IConfigMap>('ConfigMap')
const role = one<IRole>('Role')
const rules = role.rules as RbacRule[]
const configKey = Object.keys(configMap.data!)[0]!
const configYaml = configMap.data![configKey]!

/** modelgateConfig loads the ConfigMap's YAML as modelgate does, with the pod's environment. */
function modelgateConfig(env: Record<string, string>) {
  const known = knownPlugins(plugins)
  if (!known.has('cluster')) known.set('cluster', { schema: ClusterConfig, dependsOn: ['gateway'] })
  return loadConfig(configYaml, env, known)
}
/**
 * readmeKubernetesSteps: the commands of config/README.md's "A cluster on Kubernetes" block, one per
 * entry, continuation lines joined and comments dropped.
 */
function readmeKubernetesSteps(): string[] {
  const readme = readFileSync(resolve(import.meta.dir, '../../config/README.md'), 'utf8')
  const section = readme.slice(readme.indexOf('### A cluster on Kubernetes'))
  const block = /```sh\n([\s\S]*?)```/.exec(section)![1]!
  return block
    .replace(/\\\n\s*/g, ' ')
    .split('\n')
    .map((l) => l.replace(/\s+#.*$/, '').trim())
    .filter((l) => l && !l.startsWith('#'))
}

const goodSecrets = {
  ADMIN_PASSWORD: 'an-admin-password',
  JWT_SECRET: 'a'.repeat(64),
  CLUSTER_SECRET: 'c'.repeat(64),
  INFERENCE_API_KEY: 'an-inference-key',
}
const podEnv = { POD_NAME: 'modelgate-1', POD_IP: '10.1.2.3', ...goodSecrets }
const clusterCfg = () => modelgateConfig(podEnv).plugins.get('cluster') as ClusterConfig

describe('config/kubernetes manifests', () => {
  it('are all valid Kubernetes objects by the Kubernetes schemas, one of each kind needed', () => {
    expect(docs.map((d) => d.kind).sort()).toEqual(Object.keys(MODELS).sort())
    for (const doc of docs) {
      const Model = MODELS[doc.kind as keyof typeof MODELS]
      expect(() => new Model(doc as never).validate()).not.toThrow()
      expect(doc.metadata.namespace ?? doc.metadata.name).toBe('modelgate')
    }
  })

  it('the schema check is live: a broken StatefulSet is refused', () => {
    const broken = structuredClone(sts)
    Object.assign(broken.spec!.template.spec!.containers[0]!.ports![0]!, { containerPort: 'http' })
    expect(() => new StatefulSet(broken as never).validate()).toThrow(/containerPort must be integer/)
  })

  it('the ConfigMap is a modelgate config on the Kubernetes backend, with the pod environment the StatefulSet sets', () => {
    const { root, plugins: cfg } = modelgateConfig(podEnv)
    expect([...cfg.keys()].sort()).toEqual(['cluster', 'gateway'])
    const cluster = cfg.get('cluster') as ClusterConfig
    expect(cluster.coordination.kind).toBe('kubernetes')
    expect(cluster.pod_id).toBe('modelgate-1')
    expect(cluster.advertise_address).toBe(`http://10.1.2.3:${root.server.port}`)
    expect(cluster.expected_size).toBe(sts.spec!.replicas!)
    expect(root.auth.cluster_secret).toBe(goodSecrets.CLUSTER_SECRET)
    // Every ${VAR} of the YAML is in the container's environment.
    const vars = [...configYaml.matchAll(/\$\{([A-Z_]+)/g)].map((m) => m[1])
    const envNames = container.env!.map((e) => e.name)
    for (const v of vars) expect(envNames).toContain(v!)
    expect(env('POD_NAME')?.fieldRef?.fieldPath).toBe('metadata.name')
    expect(env('POD_IP')?.fieldRef?.fieldPath).toBe('status.podIP')
  })

  it('ships no Secret, so applying the folder again never overwrites the one the operator created', () => {
    expect(docs.filter((d) => d.kind === 'Secret')).toEqual([])
  })

  it('has config/README.md create the Secret after the namespace and before the folder, with every key the pods read', () => {
    const steps = readmeKubernetesSteps()
    const at = (re: RegExp) => steps.findIndex((l) => re.test(l))
    const namespace = at(/^kubectl apply -f config\/kubernetes\/00-namespace\.yaml$/)
    const create = at(/^kubectl -n modelgate create secret generic /)
    const folder = at(/^kubectl apply -f config\/kubernetes\/(\s|$)/)
    expect({ namespace: namespace >= 0, create: create >= 0, folder: folder >= 0 }).toEqual({
      namespace: true,
      create: true,
      folder: true,
    })
    expect(namespace).toBeLessThan(create)
    expect(create).toBeLessThan(folder)
    const command = steps[create]!
    const name = /create secret generic (\S+)/.exec(command)![1]
    const literals = [...command.matchAll(/--from-literal=([A-Z_]+)=/g)].map((m) => m[1]!)
    const refs = container.env!.filter((e) => e.valueFrom?.secretKeyRef)
    for (const e of refs)
      expect({ env: e.name, secret: e.valueFrom!.secretKeyRef!.name }).toEqual({ env: e.name, secret: name! })
    // Every key the command sets is read by the pods; every key they need without `optional` is set.
    const read = refs.map((e) => e.valueFrom!.secretKeyRef!.key)
    expect(literals.filter((k) => !read.includes(k))).toEqual([])
    const required = refs
      .filter((e) => !e.valueFrom!.secretKeyRef!.optional)
      .map((e) => e.valueFrom!.secretKeyRef!.key)
    expect(required.filter((k) => !literals.includes(k))).toEqual([])
    expect(required.sort()).toEqual(['ADMIN_PASSWORD', 'CLUSTER_SECRET', 'JWT_SECRET'])
  })

  it('a pod without the Secret refuses to start, naming the keys (check-config finds the same)', () => {
    let problems: string[] = []
    try {
      modelgateConfig({ POD_NAME: 'modelgate-0', POD_IP: '10.1.2.3' })
    } catch (err) {
      problems = (err as ConfigError).problems
    }
    expect(problems.some((p) => p.startsWith('auth.jwt_secret:'))).toBe(true)
    expect(problems.some((p) => p.startsWith('auth.admin_password:'))).toBe(true)
    expect(problems.some((p) => p.startsWith('auth.cluster_secret: required'))).toBe(true)
  })

  it('mounts the ConfigMap where the command reads it, the data dir on a claim template, and asks for a GPU', () => {
    const { root } = modelgateConfig(podEnv)
    const mount = (vol: string) => container.volumeMounts!.find((m) => m.name === vol)?.mountPath
    const configVolume = pod.volumes!.find((v) => v.configMap?.name === configMap.metadata!.name)!
    expect(container.args!.slice(-2)).toEqual(['--config', `${mount(configVolume.name)}/${configKey}`])
    const claims = sts.spec!.volumeClaimTemplates!.map((c) => c.metadata!.name)
    const dataVolume = container.volumeMounts!.find((m) => m.mountPath === root.data_dir)?.name
    expect(claims).toContain(dataVolume)
    expect(Number(container.resources!.limits!['nvidia.com/gpu'])).toBeGreaterThanOrEqual(1)
    expect(pod.terminationGracePeriodSeconds! * 1000).toBeGreaterThan(root.shutdown.timeout_ms)
  })

  it('serves, probes and discovers peers on the one port the config names, behind the headless Service', () => {
    const { root } = modelgateConfig(podEnv)
    const k8s = clusterCfg().coordination.kubernetes
    const svc = one<IService>('Service')
    const http = container.ports!.find((p) => p.name === 'http')!
    expect(http.containerPort).toBe(root.server.port)
    expect(k8s.discovery.port).toBe(root.server.port)
    expect(container.readinessProbe!.httpGet).toEqual({ path: '/api/health/ready', port: 'http' })
    expect(svc.spec!.clusterIP).toBe('None')
    expect(svc.metadata!.name!).toBe(sts.spec!.serviceName!)
    expect(k8s.discovery.service).toBe(svc.metadata!.name!)
    expect(svc.spec!.selector!).toEqual(sts.spec!.template.metadata!.labels!)
    expect(svc.spec!.ports![0]!.targetPort!).toBe('http')
  })

  it('binds the Role to the service account the pods run as', () => {
    const binding = one<IRoleBinding>('RoleBinding')
    expect(binding.roleRef).toEqual({
      apiGroup: 'rbac.authorization.k8s.io',
      kind: 'Role',
      name: role.metadata!.name!,
    })
    expect(binding.subjects!).toEqual([
      { kind: 'ServiceAccount', name: pod.serviceAccountName!, namespace: 'modelgate' },
    ])
    expect(one<IServiceAccount>('ServiceAccount').metadata!.name!).toBe(pod.serviceAccountName!)
  })
})

describe('the Role against the coordinator, on a stand-in Kubernetes API (not a real API server)', () => {
  let standIn: LeaseStandIn | undefined
  let dir: string | undefined
  afterEach(async () => {
    await standIn?.stop()
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  function setUp(discovery: Partial<ClusterConfig['coordination']['kubernetes']['discovery']> = {}) {
    const k8s = clusterCfg().coordination.kubernetes
    standIn = new LeaseStandIn('sa-token')
    standIn.rules = rules
    standIn.setEndpoints(k8s.discovery.service!, [{ ip: '10.1.2.4', pod: 'modelgate-2' }], 'modelgate')
    dir = mkdtempSync(join(tmpdir(), 'k8s-role-'))
    writeFileSync(join(dir, 'token'), 'sa-token')
    writeFileSync(join(dir, 'namespace'), 'modelgate')
    // The ConfigMap's coordination settings; only the API address, the mount and the pace are the test's.
    const cfg = {
      ...k8s,
      api_url: standIn.url,
      token_file: join(dir, 'token'),
      ca_file: join(dir, 'ca.crt'),
      retry_period_seconds: 0.02,
      discovery: { ...k8s.discovery, ...discovery },
    }
    const log = new Logger('error', 'cluster', 'text', () => {})
    return new KubernetesCoordinator(cfg, {
      podId: 'modelgate-1',
      address: 'http://10.1.2.3:3000',
      log,
      env: {},
    })
  }

  it('allows each call the coordinator makes (create, get and renew the Lease, read the Endpoints, release), and nothing it does not use', async () => {
    const c = setUp()
    await c.start()
    await waitFor('a renewal', () => standIn!.calls.some((x) => x.verb === 'update' && x.status === 200))
    await c.stop(AbortSignal.timeout(5000))
    expect(
      standIn!.lease(clusterCfg().coordination.kubernetes.lease_name, 'modelgate')!.spec.holderIdentity,
    ).toBe('')
    expect(standIn!.calls.filter((x) => x.status === 403)).toEqual([])
    const used = new Set(standIn!.calls.map((x) => `${x.group}/${x.resource}/${x.verb}/${x.name ?? '*'}`))
    const granted = rules.flatMap((r) =>
      r.apiGroups.flatMap((g) =>
        r.resources.flatMap((res) =>
          r.verbs.flatMap((v) => (r.resourceNames ?? ['*']).map((n) => `${g}/${res}/${v}/${n}`)),
        ),
      ),
    )
    const k8s = clusterCfg().coordination.kubernetes
    expect(granted.sort()).toEqual(
      [
        'coordination.k8s.io/leases/create/*',
        `coordination.k8s.io/leases/get/${k8s.lease_name}`,
        `coordination.k8s.io/leases/update/${k8s.lease_name}`,
        `/endpoints/get/${k8s.discovery.service}`,
      ].sort(),
    )
    for (const g of granted)
      expect({
        g,
        used: [...used].some((u) => (g.endsWith('/*') ? u.startsWith(g.slice(0, -1)) : u === g)),
      }).toEqual({
        g,
        used: true,
      })
  })

  it('does not allow listing pods: the label-selector discovery fails to start, naming the Role', async () => {
    const c = setUp({ service: undefined })
    await expect(c.start()).rejects.toThrow(/list pods: Kubernetes API answered 403 Forbidden.*Role/)
    // The Lease it acquired meanwhile is released by the failed start.
    const lease = standIn!.lease(clusterCfg().coordination.kubernetes.lease_name, 'modelgate')!
    expect(lease.spec).toMatchObject({ holderIdentity: '', leaseTransitions: 0 })
    await c.stop(AbortSignal.timeout(5000))
  })
})
