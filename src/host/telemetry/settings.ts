import type { Tracer } from '@opentelemetry/api'
import type { RootConfig } from '../../config/schema.ts'

/** TelemetryConfig: the `telemetry:` section of the YAML (src/config/schema.ts). */
export type TelemetryConfig = RootConfig['telemetry']

/** TracerHandle: what the SDK set-up (sdk.ts) gives back: a tracer and its provider's flush and shutdown. */
export interface TracerHandle {
  tracer: Tracer
  forceFlush(): Promise<void>
  shutdown(): Promise<void>
}

/** tracesUrl: OTLP/HTTP's trace path under a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is read. */
export function tracesUrl(endpoint: string): string {
  const base = endpoint.replace(/\/+$/, '')
  return base.endsWith('/v1/traces') ? base : `${base}/v1/traces`
}
