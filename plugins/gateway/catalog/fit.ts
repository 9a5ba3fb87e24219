import type { GpuSnapshot } from '../../../src/gpu/smi.ts'
import type { GatewayProfiles } from '../api.ts'
import { gpuTotalGib } from '../profiles/service.ts'
import type { Fields } from './rules.ts'

/**
 * catalogFit answers "could this host ever serve this entry?" when it is saved: whether some set of
 * tensor_parallel_size GPUs of one kind (or the entry's own gpu_ids) could hold one engine of it,
 * whatever runs there now (making room is the residency manager's job, not the save's). The need
 * per GPU is the gateway's one estimate (GatewayProfiles.estimate: the newest matching memory
 * profile re-sized to the entry's utilization and the device, else utilization × device), asked
 * per GPU kind because profiles are. Without a GPU probe nothing can be compared: the entry is
 * saved with a warning saying so.
 */
export type FitVerdict = { fits: true } | { fits: false; message: string } | { fits: null; warning: string }

type Estimate = GatewayProfiles['estimate']

interface Kind {
  name: string
  /** totalGib: the smallest device of the kind (a set is as large as its smallest GPU). */
  totalGib: number
  indexes: number[]
}

const gib = (n: number) => `${n.toFixed(1)} GiB`
const gpus = (n: number) => `${n} GPU${n === 1 ? '' : 's'}`

function kindsOf(snapshot: GpuSnapshot & { available: true }): Map<string, Kind> {
  const kinds = new Map<string, Kind>()
  for (const g of snapshot.gpus) {
    const total = gpuTotalGib(g)
    if (total === null) continue
    const k = kinds.get(g.name)
    if (!k) kinds.set(g.name, { name: g.name, totalGib: total, indexes: [g.index] })
    else {
      k.totalGib = Math.min(k.totalGib, total)
      k.indexes.push(g.index)
    }
  }
  return kinds
}

export function catalogFit(name: string, f: Fields, snapshot: GpuSnapshot, estimate: Estimate): FitVerdict {
  if (!snapshot.available)
    return { fits: null, warning: `the fit could not be checked: no GPU probe (${snapshot.reason})` }
  const kinds = kindsOf(snapshot)
  if (kinds.size === 0)
    return {
      fits: null,
      warning: 'the fit could not be checked: nvidia-smi reports no GPU with a known memory total',
    }
  const tp = f.tensor_parallel_size
  const needOn = (k: Kind) => {
    const e = estimate({
      model_path: f.model_path,
      max_tokens: f.max_tokens ?? undefined,
      gpu_name: k.name,
      gpu_total_gib: k.totalGib,
      tensor_parallel_size: tp,
      gpu_memory_utilization: f.gpu_memory_utilization ?? undefined,
    })
    const how = e.profile ? `memory profile '${e.profile.name}'` : 'gpu_memory_utilization × the device'
    return { gib: e.gib, how }
  }
  const head = `Catalogue entry '${name}' (${f.model_path}, tensor_parallel_size ${tp})`
  if (f.gpu_ids) return onGpuIds(head, f.gpu_ids, snapshot, kinds, needOn)
  const lines: string[] = []
  for (const k of kinds.values()) {
    const need = needOn(k)
    const tooFew = k.indexes.length < tp
    const tooSmall = need.gib > k.totalGib
    if (!tooFew && !tooSmall) return { fits: true }
    lines.push(
      `${k.name}: ${gpus(k.indexes.length)} of ${gib(k.totalGib)} each${tooFew ? `, fewer than ${tp}` : ''}; ` +
        `it needs ${gib(need.gib)} per GPU (${need.how})${tooSmall ? ', more than one holds' : ''}`,
    )
  }
  return {
    fits: false,
    message: `${head} fits no set of ${gpus(tp)} of one kind on this host. ${lines.join('. ')}`,
  }
}

function onGpuIds(
  head: string,
  ids: number[],
  snapshot: GpuSnapshot & { available: true },
  kinds: Map<string, Kind>,
  needOn: (k: Kind) => { gib: number; how: string },
): FitVerdict {
  const problems: string[] = []
  for (const i of ids) {
    const g = snapshot.gpus.find((x) => x.index === i)
    if (!g) {
      problems.push(`GPU ${i} does not exist (GPUs: ${snapshot.gpus.map((x) => x.index).join(', ')})`)
      continue
    }
    const k = kinds.get(g.name)
    const total = gpuTotalGib(g)
    if (!k || total === null) continue
    const need = needOn(k)
    if (need.gib > total)
      problems.push(`GPU ${i} (${g.name}) has ${gib(total)}, it needs ${gib(need.gib)} per GPU (${need.how})`)
  }
  if (!problems.length) return { fits: true }
  return { fits: false, message: `${head} cannot run on gpu_ids ${ids.join(', ')}: ${problems.join('; ')}` }
}
