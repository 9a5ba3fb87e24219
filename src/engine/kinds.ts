import type { EngineDriver } from './driver.ts'
import { sglangDriver } from './sglang-driver.ts'
import { vllmDriver } from './vllm-driver.ts'

/**
 * ENGINE_DRIVERS is the one list of engine kinds: the values of `engine.kind` in the YAML, of a load
 * body's `engine_kind` and of the router's endpoints, each with its driver (src/engine/driver.ts).
 * Adding an engine is adding its driver here; the configuration schemas and the API's enums are
 * built from this list.
 */
export const ENGINE_DRIVERS = {
  vllm: vllmDriver,
  sglang: sglangDriver,
} as const satisfies Record<string, EngineDriver>

export type EngineKind = keyof typeof ENGINE_DRIVERS

export const ENGINE_KINDS = Object.keys(ENGINE_DRIVERS) as [EngineKind, ...EngineKind[]]

export const DEFAULT_ENGINE_KIND: EngineKind = 'vllm'

export function isEngineKind(kind: string): kind is EngineKind {
  return Object.hasOwn(ENGINE_DRIVERS, kind)
}

/**
 * engineDriver: the driver of a kind. An unknown kind (a row written by a newer modelgate, read by
 * an older one) is an error naming the kinds this build knows.
 */
export function engineDriver(kind: string): EngineDriver {
  if (!isEngineKind(kind))
    throw new Error(`unknown engine kind '${kind}' (this modelgate knows ${ENGINE_KINDS.join(', ')})`)
  return ENGINE_DRIVERS[kind]
}

/** WAKE_PHASES: every phase name a wake of any kind may report, once each. */
export const WAKE_PHASES: readonly string[] = [
  ...new Set(Object.values(ENGINE_DRIVERS).flatMap((d: EngineDriver) => [...d.allWakePhases])),
]

/** WAKE_PHASES_DOC: what each kind's wake phases mean, for the API's description. */
export const WAKE_PHASES_DOC = Object.values(ENGINE_DRIVERS)
  .map((d: EngineDriver) => `${d.label}: ${d.wakePhasesDoc}`)
  .join('; ')
