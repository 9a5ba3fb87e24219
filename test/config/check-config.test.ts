import { afterAll, describe, expect, it, setDefaultTimeout } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'

/**
 * `check-config` and `serve` through the real command line: every configuration that stops
 * start-up is found by check-config, and serve refuses it with exit 2 (systemd's
 * RestartPreventExitStatus=2 then does not retry it), before it opens anything.
 */
const ROOT = resolve(import.meta.dir, '../..')
const dir = mkdtempSync(join(tmpdir(), 'modelgate-check-config-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

let files = 0
/** modelgate runs `bun src/main.ts <args>` on a YAML file, with only PATH and `env` in its environment. */
function modelgate(cmd: 'check-config' | 'serve', yaml: string, env: Record<string, string> = {}) {
  const file = join(dir, `config-${++files}.yaml`)
  writeFileSync(file, yaml)
  const r = Bun.spawnSync([process.execPath, join(ROOT, 'src/main.ts'), cmd, '--config', file], {
    cwd: dir,
    env: { PATH: process.env.PATH ?? '', ...env },
    timeout: 30_000,
  })
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() }
}

/** A gateway that needs nothing on the host (no GPU probe) and a data dir of its own. */
const gateway = (extra = '') => `server: { host: 127.0.0.1, port: 0 }
data_dir: ${join(dir, 'data')}
plugins:
  gateway:
    gpu: { smi_command: null }
${extra}`

const clusterSecret = { CLUSTER_SECRET: 'a-cluster-secret-of-32-characters' }
const cluster = (coordination: string) =>
  gateway(`  cluster:
    pod_id: pod-a
    coordination:
${coordination}`)

/** refusedByBoth: check-config and serve both exit 2 and name every problem given. */
function refusedByBoth(yaml: string, env: Record<string, string>, ...problems: string[]) {
  for (const cmd of ['check-config', 'serve'] as const) {
    const r = modelgate(cmd, yaml, env)
    const named = problems.filter((p) => r.err.includes(p))
    expect({ cmd, code: r.code, named }).toEqual({ cmd, code: 2, named: problems })
    expect(r.err).not.toContain('listening')
  }
}

// Each case spawns modelgate twice or more: a slow shared machine needs more than bun's 5 s.
setDefaultTimeout(60_000)

describe('check-config and serve refuse the same configurations, with exit 2', () => {
  it('accepts a valid configuration', () => {
    const r = modelgate('check-config', cluster('      kind: etcd'), clusterSecret)
    expect(r).toMatchObject({ code: 0 })
    expect(r.out).toContain(': ok')
  })

  it('a cluster without auth.cluster_secret', () => {
    refusedByBoth(
      cluster('      kind: etcd'),
      {},
      'auth.cluster_secret: required when the cluster plugin is on',
    )
  })

  it('server.tls with the cluster (pod-to-pod calls are plain HTTP)', () => {
    refusedByBoth(
      cluster('      kind: etcd').replace(
        'server: { host: 127.0.0.1, port: 0 }',
        `server: { host: 127.0.0.1, port: 0, tls: { cert_file: ${join(dir, 'c.pem')}, key_file: ${join(dir, 'k.pem')} } }`,
      ),
      clusterSecret,
      'server.tls: the cluster plugin does not support TLS between pods yet',
    )
  })

  it('a static cluster without its static section, or whose leader is not a pod of it', () => {
    refusedByBoth(
      cluster('      kind: static'),
      clusterSecret,
      'plugins.cluster.coordination.static: required when kind is static',
    )
    refusedByBoth(
      cluster(`      kind: static
      static: { leader: pod-z, peers: [{ pod_id: pod-b, address: 'http://10.0.0.2:3000' }] }`),
      clusterSecret,
      "plugins.cluster.coordination.static.leader: 'pod-z' is not among the peers (pod-b, pod-a)",
    )
  })

  it('Kubernetes lease timings that could let two pods lead at once', () => {
    refusedByBoth(
      cluster(`      kind: kubernetes
      kubernetes: { api_url: 'https://10.0.0.1:6443', namespace: ns, lease_duration_seconds: 10, renew_deadline_seconds: 10 }`),
      clusterSecret,
      'plugins.cluster.coordination.kubernetes.renew_deadline_seconds: must be less than lease_duration_seconds',
    )
    refusedByBoth(
      cluster(`      kind: kubernetes
      kubernetes: { api_url: 'https://10.0.0.1:6443', namespace: ns, retry_period_seconds: 9 }`),
      clusterSecret,
      'plugins.cluster.coordination.kubernetes.retry_period_seconds: must be less than renew_deadline_seconds / 1.2',
    )
  })

  it('addresses of the cluster that are not http(s) URLs', () => {
    refusedByBoth(
      cluster(`      kind: etcd
      etcd: { endpoints: ['10.0.0.5:2379'] }`),
      clusterSecret,
      'plugins.cluster.coordination.etcd.endpoints[0]: must be an http(s) URL',
    )
  })

  it('a reversed engine port range', () => {
    refusedByBoth(
      gateway('').replace(
        'gpu: { smi_command: null }',
        'gpu: { smi_command: null }\n    engine: { port_range: { start: 8199, end: 8100 } }',
      ),
      {},
      'plugins.gateway.engine.port_range: start (8199) must not be above end (8100)',
    )
  })

  it("a router on the main listener's port, or naming a model twice", () => {
    const yaml = `server: { host: 127.0.0.1, port: 3999 }
data_dir: ${join(dir, 'data')}
plugins:
  router:
    host: localhost
    port: 3999
    models:
      - { name: m, endpoint: { port: 8000 } }
      - { name: m, endpoint: { port: 8001 } }
`
    refusedByBoth(
      yaml,
      {},
      'plugins.router.port: 3999 is server.port too',
      "plugins.router.models[1].name: duplicate model name 'm'",
    )
  })

  it("a catalogue entry whose extra_args abbreviate a flag its load sets itself, or set vLLM's --sleep-idle-ttl", () => {
    refusedByBoth(
      gateway(`    catalog:
      - { name: a, model_path: x/y, extra_args: ['--ho=0.0.0.0'] }
      - { name: b, model_path: x/y, engine_kind: sglang, extra_args: [--context, '4096'] }
      - { name: c, model_path: x/y, extra_args: [--sleep-idle-ttl, '60'] }`),
      {},
      "plugins.gateway.catalog[0]: extra_args --ho abbreviates --host (argparse accepts a unique prefix): extra_args must not set --host; use the load request's own field instead",
      'plugins.gateway.catalog[1]: extra_args --context abbreviates --context-length',
      'plugins.gateway.catalog[2]: extra_args must not set --sleep-idle-ttl: an engine that puts itself to sleep',
    )
  })

  it('a gpu_memory_utilization below 0.05, as the default or in a catalogue entry', () => {
    refusedByBoth(
      gateway(`    engine: { gpu_memory_utilization: 1e-300 }
    catalog:
      - { name: a, model_path: x/y, gpu_memory_utilization: 0.01 }`),
      {},
      'plugins.gateway.engine.gpu_memory_utilization:',
      'plugins.gateway.catalog[0].gpu_memory_utilization:',
    )
  })

  it('catalogue names that differ only in case', () => {
    refusedByBoth(
      gateway(`    catalog:
      - { name: Qwen/X, model_path: x/y }
      - { name: other, model_path: x/y }
      - { name: qwen/x, model_path: x/z }`),
      {},
      "plugins.gateway.catalog[2].name: 'qwen/x' differs only in case from 'Qwen/X', the name of plugins.gateway.catalog[0]: names are unique whatever their case",
    )
  })

  it('a YAML syntax error, with its line, column and the text of the line', () => {
    refusedByBoth(
      'server:\n  port: 3000\nplugins:\n\tgateway: {}\n',
      {},
      '(yaml) line 4, column 1: Tabs are not allowed as indentation: "\\tgateway: {}"',
    )
  })
})
