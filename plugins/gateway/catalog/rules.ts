import type { EngineDriver } from '../../../src/engine/driver.ts'
import { engineDriver } from '../../../src/engine/kinds.ts'
import { AppError } from '../../../src/http/errors.ts'
import type { LoadRequest } from '../api.ts'
import { checkArgs } from '../launch.ts'
import {
  CATALOG_NAME_MAX,
  type CatalogConfigEntry,
  type CatalogEntry,
  type CatalogEntryFields,
  type CatalogSource,
  NAME_CHARS,
} from './schemas.ts'

/**
 * The catalogue's rules beyond the schemas, one copy for both sources: the YAML's (found by the
 * plugin's `validate`, so `check-config` reports them) and the API's (400 on save). A name is what
 * clients put in `model`, never a file path: it may hold `/` (`org/model:tag`) but not a leading
 * one, an empty segment, or a `.` / `..` segment, so nothing that ever joins it to a directory can
 * leave that directory.
 */

/** nameProblem: why `name` cannot name a catalogue entry, or null when it can. */
export function nameProblem(name: string): string | null {
  if (name.length === 0) return 'must not be empty'
  if (name.length > CATALOG_NAME_MAX) return `is ${name.length} characters long; at most ${CATALOG_NAME_MAX}`
  if (/[\u0000-\u001f\u007f]/.test(name)) return 'must not contain control characters'
  if (name.includes('\\')) return 'must not contain a backslash: a name is not a file path'
  if (!NAME_CHARS.test(name)) {
    const bad = [...name].find((c) => !NAME_CHARS.test(c)) ?? ''
    return `must use only A–Z a–z 0–9 . _ : / - (found ${JSON.stringify(bad)})`
  }
  if (name.startsWith('/')) return 'must not start with /: a name is not a file path'
  const segments = name.split('/')
  if (segments.includes('')) return 'must not contain an empty path segment (// or a trailing /)'
  if (segments.some((s) => s === '.' || s === '..'))
    return 'must not contain a . or .. segment: a name is not a file path'
  return null
}

/**
 * foldName: the spelling two names share when they differ only in case. Names are unique folded so:
 * clients and keys name models by them, and `Qwen/X` beside `qwen/x` would be two entries a person
 * cannot tell apart, each a different load. Lookups stay exact, as the engines' served names and
 * every listener's `model` match are: a client gets the model it spelled or none.
 */
export const foldName = (name: string): string => name.toLowerCase()

/** Fields: an entry's fields with the defaults applied (what is stored and compared). */
export type Fields = Omit<CatalogEntry, 'name' | 'source' | 'updated_at'>

/** withDefaults: the fields as stored; tensor_parallel_size defaults to the number of gpu_ids, else 1. */
export function withDefaults(f: CatalogEntryFields): Fields {
  return {
    engine_kind: f.engine_kind ?? null,
    model_path: f.model_path,
    max_tokens: f.max_tokens ?? null,
    tensor_parallel_size: f.tensor_parallel_size ?? f.gpu_ids?.length ?? 1,
    gpu_memory_utilization: f.gpu_memory_utilization ?? null,
    enable_sleep_mode: f.enable_sleep_mode ?? false,
    extra_args: f.extra_args ?? [],
    gpu_ids: f.gpu_ids ?? null,
    pin: f.pin ?? false,
    preload: f.preload ?? false,
  }
}

/**
 * catalogLoadRequest: the load an entry stands for, served under its name. Whoever loads it (the
 * residency manager) adds `evictable` as it decides.
 */
export function catalogLoadRequest(name: string, f: Fields): LoadRequest {
  return {
    model_path: f.model_path,
    served_model_name: name,
    ...(f.engine_kind !== null ? { engine_kind: f.engine_kind } : {}),
    ...(f.max_tokens !== null ? { max_tokens: f.max_tokens } : {}),
    tensor_parallel_size: f.tensor_parallel_size,
    ...(f.gpu_memory_utilization !== null ? { gpu_memory_utilization: f.gpu_memory_utilization } : {}),
    enable_sleep_mode: f.enable_sleep_mode,
    extra_args: f.extra_args,
    ...(f.gpu_ids ? { gpu_ids: f.gpu_ids } : {}),
  }
}

/**
 * fieldsProblem: why a load of these fields would be refused whatever the GPUs, by the load's own
 * check (launch.ts checkArgs: gpu_ids against tensor_parallel_size, flags the load sets itself in
 * extra_args, a bad --port), or null. Found when the entry is saved, not when a request needs it.
 * `driver` is the engine the entry's load runs: its engine_kind's, else the configured default's.
 */
export function fieldsProblem(name: string, f: Fields, driver: EngineDriver): string | null {
  try {
    checkArgs(catalogLoadRequest(name, f), driver)
    return null
  } catch (err) {
    if (err instanceof AppError) return err.message
    throw err
  }
}

/** entry: an entry as readers get it. */
export function entry(
  name: string,
  f: Fields,
  source: CatalogSource,
  updatedAt: string | null,
): CatalogEntry {
  return { name, ...f, source, updated_at: updatedAt }
}

/**
 * catalogProblems: the YAML catalogue's problems, each with its dotted path: a name that is a path,
 * a name given twice (or again in another case), fields a load would refuse. Run by the plugin's `validate` (check-config).
 */
export function catalogProblems(
  entries: readonly CatalogConfigEntry[],
  at: string,
  driver: EngineDriver,
): string[] {
  const problems: string[] = []
  const first = new Map<string, number>()
  entries.forEach((e, i) => {
    const where = `${at}[${i}]`
    const bad = nameProblem(e.name)
    if (bad) problems.push(`${where}.name: ${bad}`)
    const seen = first.get(foldName(e.name))
    if (seen === undefined) first.set(foldName(e.name), i)
    else if (entries[seen]?.name === e.name)
      problems.push(`${where}.name: '${e.name}' is already the name of ${at}[${seen}]`)
    else
      problems.push(
        `${where}.name: '${e.name}' differs only in case from '${entries[seen]?.name}', the name of ${at}[${seen}]: ` +
          'names are unique whatever their case',
      )
    const { name: _name, ...fields } = e
    const refused = fieldsProblem(
      e.name,
      withDefaults(fields),
      e.engine_kind ? engineDriver(e.engine_kind) : driver,
    )
    if (refused) problems.push(`${where}: ${refused}`)
  })
  return problems
}
