import { type Static, Type as T } from '@sinclair/typebox'

/**
 * RootConfig is the host's part of the YAML: listener, data, logging, auth and shutdown. Each
 * plugin validates its own `plugins.<id>` section against the schema it declares.
 */
const Oauth = T.Object(
  {
    issuer_url: T.Optional(T.String({ description: 'OAuth issuer URL (OAUTH_ISSUER_URL)' })),
    client_id: T.Optional(T.String({ description: 'OAUTH_CLIENT_ID' })),
    client_secret: T.Optional(T.String({ description: 'OAUTH_CLIENT_SECRET' })),
    k8s_api_url: T.Optional(
      T.String({ description: 'the platform API the user and their groups are read from (K8S_API_URL)' }),
    ),
    api_base_url: T.Optional(
      T.String({
        description:
          "this service's public address; the OAuth callback is <api_base_url>/api/auth/callback (API_BASE_URL)",
      }),
    ),
    // The keys below are optional with their defaults applied by src/http/oauth.ts (oauthSettings).
    frontend_url: T.Optional(
      T.String({
        description:
          'where the browser lands with #token=<JWT>&token_type=Bearer&expires_in=<s> (default API_BASE_URL + "/")',
      }),
    ),
    scope: T.Optional(T.String({ description: 'scope asked of the provider (default "user:info")' })),
    admin_groups: T.Optional(
      T.Array(T.String({ minLength: 1 }), {
        description: 'groups granting admin (default [service-admins])',
      }),
    ),
    readonly_groups: T.Optional(
      T.Array(T.String({ minLength: 1 }), {
        description: 'groups granting admin-readonly (default [service-admins-readonly])',
      }),
    ),
    request_timeout_ms: T.Optional(
      T.Integer({
        minimum: 100,
        description: 'deadline of each call to the provider and the platform API (default 10000)',
      }),
    ),
  },
  {
    additionalProperties: false,
    default: {},
    description: "auth.mode oauth: the platform's identity provider and the groups that grant each role",
  },
)

export const RootConfigSchema = T.Object(
  {
    server: T.Object(
      {
        host: T.String({
          default: '127.0.0.1',
          minLength: 1,
          description: 'address of the main listener (admin API, /docs, /metrics, the gateway /v1)',
        }),
        port: T.Integer({ default: 3000, minimum: 0, maximum: 65535, description: '0 picks a free port' }),
        idle_timeout_seconds: T.Integer({
          default: 120,
          minimum: 1,
          maximum: 255,
          description: 'keep-alive idle timeout; proxied streams disable it per request',
        }),
        request_head_timeout_seconds: T.Integer({
          default: 60,
          minimum: 1,
          description: 'a request head must arrive whole within this (408 after it)',
        }),
        min_body_bytes_per_second: T.Integer({
          default: 1024,
          minimum: 0,
          description: 'after the head timeout, a body still arriving must average this rate (408 below it)',
        }),
        max_connections: T.Integer({
          default: 0,
          minimum: 0,
          description:
            'open client connections per listener; 0 derives it from the open-file limit. Connections with no complete request head yet hold at most half of it (past that a new one cuts the one open longest); a full listener cuts the connection waiting longest for a head',
        }),
        max_connections_per_address: T.Integer({
          default: 1024,
          minimum: 0,
          description:
            'open client connections from one address per listener (0: no cap); past it a new one is closed at once',
        }),
        max_admin_body_bytes: T.Integer({
          default: 16 * 1024 * 1024,
          minimum: 1024,
          description:
            'largest body of a non-inference request (admin API, imports) and of an inference request that has shown no key yet; 413 above it',
        }),
        max_buffered_body_bytes: T.Integer({
          default: 512 * 1024 * 1024,
          minimum: 1024 * 1024,
          description:
            'request bodies a listener holds at once, from head to the end of the response; past it 503 with Retry-After before the body is read',
        }),
        max_json_depth: T.Integer({
          default: 64,
          minimum: 8,
          maximum: 1000,
          description:
            'deepest JSON nesting of any body; 400 where the nesting starts, before anything parses it',
        }),
        login_attempts_per_minute: T.Integer({
          default: 10,
          minimum: 1,
          description: 'password logins per client address and minute; 429 beyond',
        }),
        tls: T.Optional(
          T.Object(
            {
              cert_file: T.String({
                minLength: 1,
                description:
                  'PEM certificate, its chain after it (e.g. /etc/letsencrypt/live/<name>/fullchain.pem)',
              }),
              key_file: T.String({
                minLength: 1,
                description: 'PEM private key of the certificate, unencrypted (e.g. privkey.pem)',
              }),
            },
            {
              additionalProperties: false,
              description:
                "HTTPS on every listener (the main one and each plugin's, the router's too), TLS 1.2 and 1.3; absent: plain HTTP. Both files are read at start (one missing or invalid stops it) and looked at every 2 s: a changed pair is taken without a restart for new connections, a bad one is logged and the old certificate stays",
            },
          ),
        ),
      },
      {
        additionalProperties: false,
        default: {},
        description:
          'the main listener and the limits every listener (the router too) applies to its clients',
      },
    ),
    data_dir: T.String({
      default: './data',
      minLength: 1,
      description:
        'modelgate.db (SQLite, WAL), engines/<id>/ (each engine log), settings.json (mode 0600: the model-hub token)',
    }),
    log: T.Object(
      {
        level: T.Union([T.Literal('debug'), T.Literal('info'), T.Literal('warn'), T.Literal('error')], {
          default: 'info',
          description: 'least severity logged',
        }),
        format: T.Union([T.Literal('text'), T.Literal('json')], {
          default: 'text',
          description: 'one line per event on stderr, as text or as JSON',
        }),
      },
      { additionalProperties: false, default: {}, description: "modelgate's own log lines (stderr)" },
    ),
    auth: T.Object(
      {
        mode: T.Union([T.Literal('none'), T.Literal('simple'), T.Literal('oauth')], {
          default: 'none',
          description:
            "none: everyone is admin; simple: a password login issues a JWT; oauth: the platform's identity " +
            'provider, roles from groups (AUTH_MODE)',
        }),
        admin_username: T.String({
          default: 'admin',
          minLength: 1,
          description: 'simple mode: the login name (ADMIN_USERNAME)',
        }),
        admin_password: T.Optional(T.String({ description: 'simple mode: the password (ADMIN_PASSWORD)' })),
        jwt_secret: T.Optional(
          T.String({
            description: 'HS256 secret of the admin JWTs, at least 32 bytes when auth is on (JWT_SECRET)',
          }),
        ),
        jwt_ttl_seconds: T.Integer({
          default: 43200,
          minimum: 60,
          description: 'JWT lifetime (12 h); a token claiming a longer one (exp − iat) is refused',
        }),
        inference_api_key: T.Optional(
          T.String({
            description:
              'when set, inference routes need Authorization: Bearer <key>; an unlimited key beside the ones ' +
              'made through /api/keys (INFERENCE_API_KEY)',
          }),
        ),
        cluster_secret: T.Optional(
          T.String({
            description:
              'HMAC secret of the signed internal cluster API, at least 16 characters (CLUSTER_SECRET)',
          }),
        ),
        cluster_secret_previous: T.Optional(
          T.String({ description: 'second secret accepted during rotation' }),
        ),
        oauth: Oauth,
      },
      {
        additionalProperties: false,
        default: {},
        description: 'who may call the admin API, and the keys of inference and of the cluster',
      },
    ),
    shutdown: T.Object(
      {
        timeout_ms: T.Integer({
          default: 30000,
          minimum: 100,
          description: 'one deadline for the whole shutdown: drain, then stopping every plugin',
        }),
        drain_ms: T.Integer({
          default: 25000,
          minimum: 0,
          description:
            'running inference requests may finish for this long (within timeout_ms, never its last 5 s) before engines stop',
        }),
      },
      {
        additionalProperties: false,
        default: {},
        description: 'what SIGTERM and SIGINT do, and how long it may take',
      },
    ),
    telemetry: T.Object(
      {
        otlp_endpoint: T.String({
          default: '',
          pattern: '^(https?://\\S+)?$',
          description:
            'OTLP/HTTP collector base URL (e.g. http://127.0.0.1:4318; spans go to <url>/v1/traces as OTLP/JSON). Empty: tracing off, no span is made',
        }),
        headers: T.Record(T.String(), T.String(), {
          default: {},
          description: 'HTTP headers sent with every export (e.g. authorization of a hosted collector)',
        }),
        service_name: T.String({
          default: 'modelgate',
          minLength: 1,
          description: 'the service.name of every span',
        }),
        sample_ratio: T.Number({
          default: 1,
          minimum: 0,
          maximum: 1,
          description:
            'share of inference requests traced when the caller sent no traceparent (one with a traceparent follows its sampled flag); admin operations are always traced',
        }),
        export_timeout_ms: T.Integer({
          default: 10000,
          minimum: 100,
          description: 'deadline of one export to the collector',
        }),
        engine_otlp_traces_endpoint: T.String({
          default: '',
          description:
            "given to vLLM engines as --otlp-traces-endpoint (vLLM's own spans; it speaks OTLP/gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL in engine.env says otherwise). Empty: not passed",
        }),
      },
      { additionalProperties: false, default: {}, description: 'traces over OTLP (off by default)' },
    ),
    plugins: T.Record(T.String(), T.Unknown(), { default: {} }),
  },
  { additionalProperties: false },
)

export type RootConfig = Static<typeof RootConfigSchema>

/** ENV_OVERRIDES maps the environment variables operators and containers set onto dotted config paths. */
export const ENV_OVERRIDES: Record<string, string> = {
  AUTH_MODE: 'auth.mode',
  ADMIN_USERNAME: 'auth.admin_username',
  ADMIN_PASSWORD: 'auth.admin_password',
  JWT_SECRET: 'auth.jwt_secret',
  INFERENCE_API_KEY: 'auth.inference_api_key',
  CLUSTER_SECRET: 'auth.cluster_secret',
  OAUTH_ISSUER_URL: 'auth.oauth.issuer_url',
  OAUTH_CLIENT_ID: 'auth.oauth.client_id',
  OAUTH_CLIENT_SECRET: 'auth.oauth.client_secret',
  K8S_API_URL: 'auth.oauth.k8s_api_url',
  API_BASE_URL: 'auth.oauth.api_base_url',
}
