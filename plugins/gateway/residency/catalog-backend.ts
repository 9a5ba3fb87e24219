import type { Backend, BackendRequest, LeaseHandle, Readiness } from '../../../src/directory/backend.ts'
import type { BackendSource } from '../../../src/directory/directory.ts'
import type { SpanBase } from '../../../src/host/telemetry/spans.ts'
import { proxyError } from '../../../src/http/errors.ts'
import type { WireAction } from '../../../src/wire/route.ts'
import type { ResidencyManager } from './manager.ts'

/**
 * CatalogBackend: a catalogued model that has no instance on this pod, as the model directory
 * serves it: `absent`, but a request may load it (`wake` is the manager's bring-up: a load from the
 * catalogue, with room made for it), and requests wait for it in the model's bounded queue. Once an
 * instance of it exists, that instance is its backend instead; another pod that has it (even
 * asleep) goes first (order.ts).
 */
class CatalogBackend implements Backend {
  readonly kind = 'instance'
  readonly local = true
  readonly key: string

  constructor(
    readonly model: string,
    private readonly manager: ResidencyManager,
  ) {
    this.key = `catalog:${model}`
  }

  readiness(): Readiness {
    return 'absent'
  }

  inFlight(): number {
    return 0
  }

  acquire(): void {}

  release(): void {}

  /** wake: the model's bring-up (a load here); `trace`: the waiting request's span, the load's parent. */
  wake(trace?: SpanBase | null): Promise<void> {
    this.manager.queued(this.model)
    const q = this.manager.queue(this.model)
    return this.manager.bringUp(
      this.model,
      this.manager.clock.timeout(q?.timeoutMs ?? 300_000),
      true,
      trace ?? null,
    )
  }

  queue() {
    return this.manager.queue(this.model)
  }

  abandoned(): boolean {
    return this.manager.abandoned(this.model)
  }

  phase(): string {
    return 'not loaded yet'
  }

  retryAfterSeconds(): number {
    return Math.max(1, Math.ceil(this.manager.costs(this.model, null).load_s))
  }

  forward(_req: BackendRequest, lease: LeaseHandle): WireAction {
    // Never leased (it never serves): planned again once its instance exists.
    return lease.next(
      proxyError(503, 'service_unavailable', 'model_not_ready', `Model '${this.model}' is not loaded`),
    )
  }
}

/** catalogSource: the directory's source of catalogued models that have no instance here yet. */
export function catalogSource(manager: ResidencyManager): BackendSource {
  return {
    backends: (name) => {
      if (!manager.catalogued(name) || manager.hasInstance(name)) return []
      return [new CatalogBackend(name, manager)]
    },
  }
}
