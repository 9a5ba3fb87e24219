/**
 * visibleDevices resolves CUDA_VISIBLE_DEVICES to physical GPU indices with CUDA's rules: unset means
 * every GPU, the list stops at the first index that does not exist, and a UUID makes vLLM crash
 * (ENGINE-NOTES: integer indices only).
 */
export type VisibleDevices = { ok: true; gpus: number[] } | { ok: false; error: string }

export function visibleDevices(spec: string | undefined, gpuCount: number): VisibleDevices {
  if (spec === undefined) return { ok: true, gpus: Array.from({ length: gpuCount }, (_, i) => i) }
  const gpus: number[] = []
  for (const raw of spec.split(',')) {
    const entry = raw.trim()
    if (entry === '') break
    if (!/^\d+$/.test(entry))
      return { ok: false, error: `ValueError: invalid literal for int() with base 10: '${entry}'` }
    const index = Number(entry)
    if (index >= gpuCount || gpus.includes(index)) break
    gpus.push(index)
  }
  if (gpus.length === 0) return { ok: false, error: 'RuntimeError: No CUDA GPUs are available' }
  return { ok: true, gpus }
}
