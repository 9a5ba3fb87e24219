import type { WakeResult } from '../api.ts'
import type { ManagedInstance } from '../instance.ts'

/**
 * ResidencyHooks: what the gateway's service asks of the residency manager (manager.ts), so that
 * the service does not depend on the manager itself: a wake with room made first, and how requests
 * for a catalogued model wait for it.
 */
export interface ResidencyHooks {
  /** active: the manager runs (the catalogue has entries). */
  readonly active: boolean
  wake(inst: ManagedInstance): Promise<WakeResult>
  queue(name: string): { max: number; timeoutMs: number } | null
  abandoned(name: string): void
}
