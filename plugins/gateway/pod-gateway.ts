import type {
  GatewayInferenceApi,
  GatewayPodApi,
  GatewayProfiles,
  InstanceRouting,
  PodRecords,
} from './api.ts'
import type { PresetService } from './presets/service.ts'
import type { createInference } from './proxy/routes.ts'
import { podRecords } from './records.ts'
import type { ResidencyManager } from './residency/manager.ts'
import { type GatewayDeps, GatewayService } from './service.ts'

/** Inference: the inference proxy (createInference): its routes and its handlers. */
export type Inference = ReturnType<typeof createInference>

/**
 * PodParts: the parts of the gateway built on the gateway itself, each from the gateway the
 * constructor hands it, in the order listed (the presets, the residency manager, then the proxy,
 * which serves the models the residency manager adds to the directory).
 */
export interface PodParts {
  profiles: GatewayProfiles
  presets: (gateway: GatewayService) => PresetService
  residency: (gateway: GatewayService) => ResidencyManager
  inference: (gateway: GatewayService) => Inference
}

/**
 * PodGateway: the gateway plugin's API (GatewayPodApi), constructed complete: the service, then
 * the parts built on it; the records its routes answer, and what a cluster's move reads of an
 * instance.
 */
export class PodGateway extends GatewayService implements GatewayPodApi {
  readonly records: PodRecords = podRecords(this)
  readonly profiles: GatewayProfiles
  readonly presets: PresetService
  readonly residency: ResidencyManager
  /** proxy: the inference proxy's routes, and its handlers (`inference`, a cluster's extension point). */
  readonly proxy: Inference
  readonly inference: GatewayInferenceApi

  constructor(deps: GatewayDeps, parts: PodParts) {
    super(deps)
    this.profiles = parts.profiles
    this.presets = parts.presets(this)
    this.residency = parts.residency(this)
    this.proxy = parts.inference(this)
    this.inference = this.proxy.handlers
  }

  routingOf(id: string): InstanceRouting {
    const l = this.require(id).lifecycle
    return { state: l.state, operation: l.operation, routing: l.routing, inFlight: l.inFlight }
  }
}
