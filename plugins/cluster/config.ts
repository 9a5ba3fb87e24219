import { hostname } from 'node:os'
import { type Static, Type as T } from '@sinclair/typebox'
import type { Env } from '../../src/config/load.ts'
import type { ValidateContext } from '../../src/host/plugin.ts'
import { httpUrl } from '../../src/http/url.ts'
import { clusterSecretProblems } from './signing.ts'

/**
 * ClusterConfig is `plugins.cluster` in the YAML. Leadership comes from `coordination` (etcd,
 * kubernetes or static); modelgate never runs an election of its own. The shared secret of the
 * signed internal API is `auth.cluster_secret` (CLUSTER_SECRET), with `auth.cluster_secret_previous`
 * accepted during a rotation.
 */
const Etcd = T.Object(
  {
    endpoints: T.Array(T.String({ minLength: 1 }), {
      minItems: 1,
      default: ['http://127.0.0.1:2379'],
      description: 'etcd client URLs (its v3 JSON gateway, e.g. http://etcd-0:2379); tried in order',
    }),
    prefix: T.String({
      default: '/modelgate',
      minLength: 1,
      description: 'key prefix; the cluster uses <prefix>/<cluster_id>/election/ and .../pods/',
    }),
    session_ttl_seconds: T.Integer({
      default: 10,
      minimum: 2,
      description: "TTL of the pod's session lease: a dead leader's key is gone this long after it died",
    }),
    request_timeout_ms: T.Integer({
      default: 3000,
      minimum: 100,
      description: 'deadline of one call to etcd',
    }),
    username: T.Optional(T.String({ description: 'etcd user, with password: turns on etcd auth' })),
    password: T.Optional(T.String({ description: "the etcd user's password" })),
  },
  {
    additionalProperties: false,
    default: {},
    description:
      "coordination.kind etcd: leadership from an election under a session lease (etcd's JSON gateway, etcd ≥ 3.4)",
  },
)

const Kubernetes = T.Object(
  {
    api_url: T.Optional(
      T.String({
        description:
          'K8S_API_URL; default the in-cluster https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT',
      }),
    ),
    namespace: T.Optional(T.String({ description: "default the service account's namespace" })),
    token_file: T.String({
      default: '/var/run/secrets/kubernetes.io/serviceaccount/token',
      description: "the service account's token, re-read as it rotates (K8S_TOKEN outside a pod)",
    }),
    ca_file: T.String({
      default: '/var/run/secrets/kubernetes.io/serviceaccount/ca.crt',
      description: "CA of the API server's certificate",
    }),
    lease_name: T.String({
      default: 'modelgate-leader',
      description: 'the coordination.k8s.io/v1 Lease the pods take turns holding',
    }),
    lease_duration_seconds: T.Integer({
      default: 15,
      minimum: 2,
      description: "a holder's lease counts as live this long after a pod last saw it change (its own clock)",
    }),
    renew_deadline_seconds: T.Integer({
      default: 10,
      minimum: 1,
      description:
        'a leader acts only while its last renewal is younger than this (less than the lease duration)',
    }),
    retry_period_seconds: T.Number({
      default: 2,
      exclusiveMinimum: 0,
      description: 'gap between attempts to take or renew the Lease, and between reads of the peers',
    }),
    discovery: T.Object(
      {
        label_selector: T.String({
          default: 'app.kubernetes.io/name=modelgate',
          description: 'pods of the cluster (their status.podIP and the container port below)',
        }),
        service: T.Optional(
          T.String({ description: 'a headless Service: discover peers from its Endpoints instead' }),
        ),
        port: T.Integer({ default: 3000, minimum: 1, maximum: 65535, description: "peers' gateway port" }),
      },
      { additionalProperties: false, default: {}, description: 'how a pod finds its peers' },
    ),
  },
  {
    additionalProperties: false,
    default: {},
    description: "coordination.kind kubernetes: leadership from a Lease, as client-go's leader election",
  },
)

const StaticPeer = T.Object(
  {
    pod_id: T.String({ minLength: 1, description: "the pod's id (its plugins.cluster.pod_id)" }),
    address: T.String({ minLength: 1, description: 'base URL, e.g. http://10.0.0.6:3000' }),
  },
  { additionalProperties: false },
)

const Static_ = T.Object(
  {
    leader: T.String({ minLength: 1, description: 'pod_id of the leader (term 1, no failover)' }),
    peers: T.Array(StaticPeer, { default: [], description: 'every pod, this one included' }),
  },
  {
    additionalProperties: false,
    description: 'coordination.kind static: the leader named here, no failover (required with that kind)',
  },
)

export const ClusterConfig = T.Object(
  {
    cluster_id: T.String({
      default: 'modelgate',
      minLength: 1,
      pattern: '^[A-Za-z0-9._-]+$',
      description: "the cluster's name (in etcd keys)",
    }),
    pod_id: T.Optional(
      T.String({
        minLength: 1,
        pattern: '^[A-Za-z0-9._-]+$',
        description: 'default POD_NAME, else the host name',
      }),
    ),
    advertise_address: T.Optional(
      T.String({
        description: 'base URL peers use to reach this pod; default http://<server.host>:<server.port>',
      }),
    ),
    expected_size: T.Integer({
      default: 1,
      minimum: 1,
      description: 'pods the cluster should have (status)',
    }),
    heartbeat_interval_ms: T.Integer({
      default: 5000,
      minimum: 100,
      description: 'every pod sends its state to every peer this often (and at once on every change)',
    }),
    unhealthy_after_missed: T.Integer({
      default: 3,
      minimum: 1,
      description: 'a pod silent for this many heartbeat intervals is unhealthy',
    }),
    request_timeout_ms: T.Integer({
      default: 5000,
      minimum: 100,
      description: 'deadline of one internal call',
    }),
    internal_rate_limit: T.Integer({
      default: 100,
      minimum: 1,
      description: 'signed /internal requests per second per source address (429 beyond)',
    }),
    check_source_address: T.Boolean({
      default: true,
      description:
        "refuse an internal request from an address that is not its pod's advertised one (that IP, or what " +
        'its host name resolves to); turn off when pods reach each other through NAT or a proxy',
    }),
    coordination: T.Object(
      {
        kind: T.Union([T.Literal('etcd'), T.Literal('kubernetes'), T.Literal('static')], {
          default: 'etcd',
          description: 'where leadership is borrowed from (modelgate never elects a leader itself)',
        }),
        etcd: Etcd,
        kubernetes: Kubernetes,
        static: T.Optional(Static_),
      },
      {
        additionalProperties: false,
        default: {},
        description: 'the coordination service that names the leader',
      },
    ),
  },
  { additionalProperties: false },
)

export type ClusterConfig = Static<typeof ClusterConfig>

/** LEASE_JITTER: client-go's JitterFactor; a candidate waits retry × (1 + rand × 1.2) between attempts. */
export const LEASE_JITTER = 1.2

const K8S = 'plugins.cluster.coordination.kubernetes'

/**
 * kubernetesTimingProblems: client-go's rules for a Lease's timings. The renew deadline must end
 * before the lease does, or another pod may take over while this one still acts as leader; and a
 * retry (with its jitter) must fit in the renew deadline, or one missed renewal loses leadership.
 */
export function kubernetesTimingProblems(k: ClusterConfig['coordination']['kubernetes']): string[] {
  const problems: string[] = []
  if (k.lease_duration_seconds <= k.renew_deadline_seconds)
    problems.push(`${K8S}.renew_deadline_seconds: must be less than lease_duration_seconds`)
  if (k.renew_deadline_seconds <= LEASE_JITTER * k.retry_period_seconds)
    problems.push(`${K8S}.retry_period_seconds: must be less than renew_deadline_seconds / ${LEASE_JITTER}`)
  return problems
}

/** podIdOf: this pod's id: `pod_id`, else POD_NAME (a Kubernetes pod's name), else the host name. */
export function podIdOf(cfg: ClusterConfig, env: Env): string {
  return cfg.pod_id ?? env.POD_NAME ?? hostname()
}

/** staticLeaderProblems: the static leader must be a pod the cluster knows: a peer or this pod. */
export function staticLeaderProblems(s: NonNullable<ClusterConfig['coordination']['static']>, podId: string) {
  const known = new Set([...s.peers.map((p) => p.pod_id), podId])
  return known.has(s.leader)
    ? []
    : [
        `plugins.cluster.coordination.static.leader: '${s.leader}' is not among the peers (${[...known].join(', ')})`,
      ]
}

/**
 * clusterProblems is the cluster plugin's `validate`: what would stop it at start-up although each
 * key passed its schema. The coordination service itself (etcd answering, the service account's
 * mount) is the environment's, not the configuration's, and is found when the pod starts.
 */
export function clusterProblems(cfg: ClusterConfig, { root, env }: ValidateContext): string[] {
  const problems = clusterSecretProblems(root.auth, true)
  // Pod-to-pod calls and the inference hop are plain HTTP to each peer's advertise_address.
  if (root.server.tls)
    problems.push(
      'server.tls: the cluster plugin does not support TLS between pods yet; leave server.tls out and put TLS in front of modelgate with a reverse proxy (config/README.md)',
    )
  const url = (path: string, v: string | undefined): void => {
    if (v !== undefined && !httpUrl(v))
      problems.push(`${path}: must be an http(s) URL, e.g. http://10.0.0.11:3000`)
  }
  url('plugins.cluster.advertise_address', cfg.advertise_address)
  const c = cfg.coordination
  if (c.kind === 'etcd')
    for (const [i, e] of c.etcd.endpoints.entries())
      url(`plugins.cluster.coordination.etcd.endpoints[${i}]`, e)
  if (c.kind === 'kubernetes') {
    problems.push(...kubernetesTimingProblems(c.kubernetes))
    url(`${K8S}.api_url`, c.kubernetes.api_url)
  }
  if (c.kind === 'static') {
    if (!c.static) problems.push('plugins.cluster.coordination.static: required when kind is static')
    else {
      problems.push(...staticLeaderProblems(c.static, podIdOf(cfg, env)))
      for (const [i, p] of c.static.peers.entries())
        url(`plugins.cluster.coordination.static.peers[${i}].address`, p.address)
    }
  }
  return problems
}
