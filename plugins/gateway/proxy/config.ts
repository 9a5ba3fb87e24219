import { type Static, Type as T } from '@sinclair/typebox'
import { WakeOnRequestKeys } from '../../../src/directory/wake.ts'

/**
 * ProxyConfig is `plugins.gateway.proxy` in the YAML: the inference proxy's upstream deadlines
 * (once the first byte has arrived there is no deadline, so a long generation is never cut) and
 * what a request for a sleeping model does (`wake_on_request`, `hold_timeout`: the router's keys,
 * one shape in src/directory/wake.ts).
 */
export const ProxyConfig = T.Object(
  {
    first_byte_timeout_ms: T.Integer({
      default: 600_000,
      minimum: 1,
      description:
        'deadline for the first byte from the engine (response of a non-streamed request, first chunk ' +
        'of a stream); prefill of a long prompt in a busy engine can take minutes → 504 upstream_timeout',
    }),
    connect_timeout_ms: T.Integer({
      default: 5_000,
      minimum: 0,
      description:
        'deadline for reaching the engine: with no response headers by then, the engine address is ' +
        'probed and an unreachable one fails with 504 upstream_connect_timeout; 0 disables the probe',
    }),
    ...WakeOnRequestKeys,
  },
  {
    additionalProperties: false,
    default: {},
    description: "the gateway's inference proxy: upstream deadlines and requests for a sleeping model",
  },
)

export type ProxyConfig = Static<typeof ProxyConfig>
