import type { RootConfig } from '../../config/schema.ts'

/** TelemetryConfig: the `telemetry:` section of the YAML (src/config/schema.ts). */
export type TelemetryConfig = RootConfig['telemetry']

/** tracesUrl: OTLP/HTTP's trace path under a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is read. */
export function tracesUrl(endpoint: string): string {
  const base = endpoint.replace(/\/+$/, '')
  return base.endsWith('/v1/traces') ? base : `${base}/v1/traces`
}
