/**
 * colors gives each model instance in a memory view its label and colour: display names unique per
 * instance (`qwen`, `qwen (2)`, …) and `#rrggbb` colours derived from a hash of instance_id, kept
 * apart from each other so a chart never shows two instances in the same or a near-identical hue.
 * Both depend only on the instances and their order (oldest first), so they are stable across calls
 * and an instance keeps its label and colour while instances loaded after it come and go.
 */

/** shortModelName is the last path segment of a model path (`Qwen/Qwen2.5-7B` → `Qwen2.5-7B`). */
export function shortModelName(modelPath: string): string {
  const trimmed = modelPath.replace(/\/+$/, '')
  return trimmed.split('/').at(-1) || modelPath
}

/** displayNames gives the first instance of a name the name, the next ones ' (2)', ' (3)', … */
export function displayNames(items: readonly { instance_id: string; name: string }[]): Map<string, string> {
  const out = new Map<string, string>()
  const taken = new Set<string>()
  const counts = new Map<string, number>()
  for (const { instance_id, name } of items) {
    let n = counts.get(name) ?? 0
    let label: string
    do {
      n++
      label = n === 1 ? name : `${name} (${n})`
    } while (taken.has(label))
    counts.set(name, n)
    taken.add(label)
    out.set(instance_id, label)
  }
  return out
}

/** fnv1a is a small, stable 32-bit string hash. */
export function fnv1a(s: string): number {
  let h = 0x811c9dc5
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i)
    h = Math.imul(h, 0x01000193) >>> 0
  }
  return h
}

/** hslToHex renders a colour given hue in degrees and saturation/lightness in 0–1. */
export function hslToHex(h: number, s: number, l: number): string {
  const a = s * Math.min(l, 1 - l)
  const channel = (n: number): string => {
    const k = (n + h / 30) % 12
    const v = l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1))
    return Math.round(v * 255)
      .toString(16)
      .padStart(2, '0')
  }
  return `#${channel(0)}${channel(8)}${channel(4)}`
}

const SATURATION = 0.65
const BASE_LIGHTNESS = 0.5
const OTHER_LIGHTNESS = [0.38, 0.62, 0.3, 0.7]
/** HUE_STEP is coprime with 360, so probing from any hue visits every integer hue once. */
const HUE_STEP = 37
const MIN_HUE_GAPS = [24, 12, 6, 1]

const hueDistance = (a: number, b: number): number => {
  const d = Math.abs(a - b) % 360
  return Math.min(d, 360 - d)
}

/**
 * instanceColors assigns colours in the order given (oldest instance first). Each starts at the hue
 * its instance_id hashes to; on a clash it probes in HUE_STEP strides for a hue at least 24° from
 * every colour already taken, relaxing the gap to 12°, 6° and 1°, then darker and lighter shades.
 */
export function instanceColors(instanceIds: readonly string[]): Map<string, string> {
  const out = new Map<string, string>()
  const palette = new Palette()
  for (const id of instanceIds) {
    if (!out.has(id)) out.set(id, palette.pick(fnv1a(id) % 360))
  }
  return out
}

/** Palette tracks the colours handed out: the distance from each hue to the nearest taken one. */
class Palette {
  private readonly nearest = new Array<number>(360).fill(360)
  private readonly takenShades = OTHER_LIGHTNESS.map(() => new Array<boolean>(360).fill(false))
  private readonly used = new Set<string>()

  pick(base: number): string {
    const hueAt = (k: number): number => (base + k * HUE_STEP) % 360
    for (const gap of MIN_HUE_GAPS) {
      for (let k = 0; k < 360; k++) {
        const hue = hueAt(k)
        if ((this.nearest[hue] ?? 0) < gap) continue
        const color = hslToHex(hue, SATURATION, BASE_LIGHTNESS)
        if (this.used.has(color)) continue
        for (let h = 0; h < 360; h++) this.nearest[h] = Math.min(this.nearest[h] ?? 0, hueDistance(h, hue))
        return this.take(color)
      }
    }
    for (const [i, lightness] of OTHER_LIGHTNESS.entries()) {
      const taken = this.takenShades[i] ?? []
      for (let k = 0; k < 360; k++) {
        const hue = hueAt(k)
        if (taken[hue]) continue
        taken[hue] = true
        const color = hslToHex(hue, SATURATION, lightness)
        if (!this.used.has(color)) return this.take(color)
      }
    }
    for (let k = 0; ; k++) {
      const color = `#${((base * 46_349 + k) & 0xffffff).toString(16).padStart(6, '0')}`
      if (!this.used.has(color)) return this.take(color)
    }
  }

  private take(color: string): string {
    this.used.add(color)
    return color
  }
}
