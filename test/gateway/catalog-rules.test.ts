import { describe, expect, it } from 'bun:test'
import type { NeedQuery } from '../../plugins/gateway/api.ts'
import { catalogFit } from '../../plugins/gateway/catalog/fit.ts'
import { nameProblem, withDefaults } from '../../plugins/gateway/catalog/rules.ts'
import type { CatalogEntryFields } from '../../plugins/gateway/catalog/schemas.ts'
import { plugins } from '../../plugins/index.ts'
import { knownPlugins } from '../../src/config/file.ts'
import { type ConfigError, loadConfig } from '../../src/config/load.ts'
import type { GpuInfo, GpuSnapshot } from '../../src/gpu/smi.ts'

/**
 * The catalogue's rules without a server: which names are refused and why, what check-config says
 * of a YAML catalogue, and the fit on a host with two kinds of GPU (the figures per kind).
 */
describe('catalogue names', () => {
  it('accepts served names, with / and : among them', () => {
    for (const name of [
      'qwen-7b',
      'org/model:tag',
      'Qwen/Qwen2.5-7B-Instruct',
      'a.b_c',
      'x'.repeat(128),
      'a/b/c',
    ])
      expect(nameProblem(name)).toBeNull()
  })

  it('refuses what is a path, or could become one, saying why', () => {
    expect(nameProblem('')).toBe('must not be empty')
    expect(nameProblem('x'.repeat(129))).toBe('is 129 characters long; at most 128')
    expect(nameProblem('/abs')).toBe('must not start with /: a name is not a file path')
    expect(nameProblem('../x')).toBe('must not contain a . or .. segment: a name is not a file path')
    expect(nameProblem('a/./b')).toBe('must not contain a . or .. segment: a name is not a file path')
    expect(nameProblem('a/..')).toBe('must not contain a . or .. segment: a name is not a file path')
    expect(nameProblem('a//b')).toBe('must not contain an empty path segment (// or a trailing /)')
    expect(nameProblem('a/')).toBe('must not contain an empty path segment (// or a trailing /)')
    expect(nameProblem('a\\b')).toBe('must not contain a backslash: a name is not a file path')
    expect(nameProblem('a\u0000b')).toBe('must not contain control characters')
    expect(nameProblem('a\nb')).toBe('must not contain control characters')
    expect(nameProblem('a b')).toBe('must use only A–Z a–z 0–9 . _ : / - (found " ")')
    expect(nameProblem('modèle')).toBe('must use only A–Z a–z 0–9 . _ : / - (found "è")')
    // A name of dots alone is a dot segment; dots inside a segment are not.
    expect(nameProblem('..')).not.toBeNull()
    expect(nameProblem('v1..2')).toBeNull()
  })
})

function problems(catalog: string): string[] {
  try {
    loadConfig(`plugins:\n  gateway:\n    catalog:\n${catalog}`, {}, knownPlugins(plugins))
    return []
  } catch (err) {
    return (err as ConfigError).problems
  }
}

describe('plugins.gateway.catalog in check-config', () => {
  it('accepts a catalogue, and an empty one', () => {
    expect(problems('      - { name: org/m:1, model_path: a/b, gpu_ids: [0, 1], pin: true }\n')).toEqual([])
    expect(problems('      []\n')).toEqual([])
  })

  it('names each problem by its dotted path: a duplicate, a path, an unknown key, what a load refuses', () => {
    expect(
      problems(
        [
          '      - { name: a, model_path: x/y }',
          '      - { name: b, model_path: x/y, gpu_ids: [0], tensor_parallel_size: 2 }',
          '      - { name: a, model_path: x/z }',
          "      - { name: '../etc', model_path: x/y }",
          '      - { name: c, model_path: x/y, extra_args: [--served-model-name, other] }',
          '',
        ].join('\n'),
      ),
    ).toEqual([
      'plugins.gateway.catalog[1]: tensor_parallel_size (2) must equal the number of gpu_ids (1)',
      "plugins.gateway.catalog[2].name: 'a' is already the name of plugins.gateway.catalog[0]",
      'plugins.gateway.catalog[3].name: must not contain a . or .. segment: a name is not a file path',
      "plugins.gateway.catalog[4]: extra_args must not set --served-model-name; use the load request's own field instead",
    ])
    expect(problems('      - { name: a, model_path: x/y, gpu_id: [1] }\n')).toEqual([
      'plugins.gateway.catalog[0].gpu_id: unknown key',
    ])
    expect(problems("      - { name: 'a b', model_path: x/y }\n")).toEqual([
      'plugins.gateway.catalog[0].name: must be 1–128 characters of A–Z a–z 0–9 . _ : / - (a served model name such as org/model:tag)',
    ])
    expect(problems('      - { name: a }\n')).toContain('plugins.gateway.catalog[0].model_path: is required')
  })
})

const gpu = (index: number, name: string, mib: number): GpuInfo => ({
  index,
  uuid: `GPU-${index}`,
  name,
  memoryTotalMib: mib,
  memoryUsedMib: 0,
  memoryFreeMib: mib,
  utilizationPercent: 0,
  temperatureC: 30,
})
const H100 = 'NVIDIA H100 80GB HBM3'
const L4 = 'NVIDIA L4'
/** One H100 (80 GiB) and two L4 (22.5 GiB). */
const HOST: GpuSnapshot = {
  available: true,
  takenAt: 0,
  apps: [],
  gpus: [gpu(0, H100, 81920), gpu(1, L4, 23040), gpu(2, L4, 23040)],
}
/** A profile on the L4 only: the model needs 30 GiB per L4 at any TP; elsewhere utilization × device. */
const estimate = (q: NeedQuery) =>
  q.gpu_name === L4
    ? { gib: 30, profile: { id: 'p1', name: 'measured on L4' } }
    : { gib: (q.gpu_memory_utilization ?? 0.9) * q.gpu_total_gib, profile: null }
const fit = (f: CatalogEntryFields, snapshot: GpuSnapshot = HOST) =>
  catalogFit('m', withDefaults(f), snapshot, estimate)

describe('the fit of a catalogue entry on a host of two GPU kinds', () => {
  it('fits where one kind has enough GPUs that each hold the need', () => {
    expect(fit({ model_path: 'a/b' })).toEqual({ fits: true })
  })

  it('refuses when no kind has both, with each kind’s figures', () => {
    const v = fit({ model_path: 'a/b', tensor_parallel_size: 2 })
    expect(v).toEqual({
      fits: false,
      message:
        "Catalogue entry 'm' (a/b, tensor_parallel_size 2) fits no set of 2 GPUs of one kind on this host. " +
        `${H100}: 1 GPU of 80.0 GiB each, fewer than 2; it needs 72.0 GiB per GPU (gpu_memory_utilization × the device). ` +
        `${L4}: 2 GPUs of 22.5 GiB each; it needs 30.0 GiB per GPU (memory profile 'measured on L4'), more than one holds`,
    })
  })

  it('checks the GPUs an entry names, each with the need of its kind', () => {
    expect(fit({ model_path: 'a/b', gpu_ids: [0] })).toEqual({ fits: true })
    expect(fit({ model_path: 'a/b', gpu_ids: [1, 2] })).toEqual({
      fits: false,
      message:
        "Catalogue entry 'm' (a/b, tensor_parallel_size 2) cannot run on gpu_ids 1, 2: " +
        `GPU 1 (${L4}) has 22.5 GiB, it needs 30.0 GiB per GPU (memory profile 'measured on L4'); ` +
        `GPU 2 (${L4}) has 22.5 GiB, it needs 30.0 GiB per GPU (memory profile 'measured on L4')`,
    })
    expect(fit({ model_path: 'a/b', gpu_ids: [9] })).toMatchObject({
      fits: false,
      message: expect.stringContaining('GPU 9 does not exist (GPUs: 0, 1, 2)'),
    })
  })

  it('cannot tell without a GPU probe, and says so', () => {
    expect(
      fit(
        { model_path: 'a/b', tensor_parallel_size: 8 },
        { available: false, reason: 'nvidia-smi not found' },
      ),
    ).toEqual({
      fits: null,
      warning: 'the fit could not be checked: no GPU probe (nvidia-smi not found)',
    })
  })
})
