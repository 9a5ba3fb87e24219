import { createHash } from 'node:crypto'

/**
 * SimGpu describes one simulated device. parseGpuSpec turns `--sim-gpus` / `MODELGATE_SIM_GPUS` into a
 * list of them, so the engine and smi simulators agree on what hardware exists.
 */
export interface SimGpu {
  index: number
  name: string
  totalMib: number
  uuid: string
  busId: string
}

export const DEFAULT_GPU_SPEC = '2x80'

const SHORTHANDS: Record<string, { name: string; totalMib: number }> = {
  '80': { name: 'NVIDIA H100 80GB HBM3', totalMib: 81559 },
  '40': { name: 'NVIDIA A100-SXM4-40GB', totalMib: 40960 },
  '24': { name: 'NVIDIA L4', totalMib: 23034 },
}

/** GpuSpecError reports a malformed GPU spec with the offending entry. */
export class GpuSpecError extends Error {}

/** parseGpuSpec accepts a comma list of `NAME:MIB` entries and `Nx80` / `Nx40` / `Nx24` shorthands. */
export function parseGpuSpec(spec: string, simDir: string): SimGpu[] {
  const kinds: { name: string; totalMib: number }[] = []
  for (const raw of spec.split(',')) {
    const entry = raw.trim()
    if (entry === '') continue
    const short = /^(\d+)x(\d+)$/.exec(entry)
    if (short) {
      const kind = SHORTHANDS[short[2] ?? '']
      if (!kind) throw new GpuSpecError(`unknown GPU shorthand "${entry}" (use Nx80, Nx40 or Nx24)`)
      for (let i = 0; i < Number(short[1]); i++) kinds.push(kind)
      continue
    }
    const colon = entry.lastIndexOf(':')
    const mib = Number(entry.slice(colon + 1))
    if (colon <= 0 || !Number.isInteger(mib) || mib <= 0) {
      throw new GpuSpecError(`bad GPU entry "${entry}" (expected NAME:MIB)`)
    }
    kinds.push({ name: entry.slice(0, colon).trim(), totalMib: mib })
  }
  return kinds.map((kind, index) => ({
    index,
    name: kind.name,
    totalMib: kind.totalMib,
    uuid: fakeUuid(simDir, index),
    busId: fakeBusId(index),
  }))
}

function fakeUuid(simDir: string, index: number): string {
  const hex = createHash('sha1').update(`${simDir}#${index}`).digest('hex')
  return `GPU-${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`
}

function fakeBusId(index: number): string {
  const bus = (0x18 + index * 0x1a) & 0xff
  return `00000000:${bus.toString(16).toUpperCase().padStart(2, '0')}:00.0`
}
