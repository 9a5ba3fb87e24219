import { type Static, Type as T } from '@sinclair/typebox'

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
    request_timeout_ms: T.Integer({ default: 3000, minimum: 100 }),
    username: T.Optional(T.String()),
    password: T.Optional(T.String()),
  },
  { additionalProperties: false, default: {} },
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
    token_file: T.String({ default: '/var/run/secrets/kubernetes.io/serviceaccount/token' }),
    ca_file: T.String({ default: '/var/run/secrets/kubernetes.io/serviceaccount/ca.crt' }),
    lease_name: T.String({ default: 'modelgate-leader' }),
    lease_duration_seconds: T.Integer({ default: 15, minimum: 2 }),
    renew_deadline_seconds: T.Integer({ default: 10, minimum: 1 }),
    retry_period_seconds: T.Number({ default: 2, exclusiveMinimum: 0 }),
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
      { additionalProperties: false, default: {} },
    ),
  },
  { additionalProperties: false, default: {} },
)

const StaticPeer = T.Object(
  {
    pod_id: T.String({ minLength: 1 }),
    address: T.String({ minLength: 1, description: 'base URL, e.g. http://10.0.0.6:3000' }),
  },
  { additionalProperties: false },
)

const Static_ = T.Object(
  {
    leader: T.String({ minLength: 1, description: 'pod_id of the leader (term 1, no failover)' }),
    peers: T.Array(StaticPeer, { default: [], description: 'every pod, this one included' }),
  },
  { additionalProperties: false },
)

export const ClusterConfig = T.Object(
  {
    cluster_id: T.String({ default: 'modelgate', minLength: 1, pattern: '^[A-Za-z0-9._-]+$' }),
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
    heartbeat_interval_ms: T.Integer({ default: 5000, minimum: 100 }),
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
    coordination: T.Object(
      {
        kind: T.Union([T.Literal('etcd'), T.Literal('kubernetes'), T.Literal('static')], { default: 'etcd' }),
        etcd: Etcd,
        kubernetes: Kubernetes,
        static: T.Optional(Static_),
      },
      { additionalProperties: false, default: {} },
    ),
  },
  { additionalProperties: false },
)

export type ClusterConfig = Static<typeof ClusterConfig>
