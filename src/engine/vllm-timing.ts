/**
 * How long vLLM takes to bring a model back, by the size of its weights, fitted to vLLM's published
 * figures for an A100 (sleep-mode blog post, October 2025: a level-1 wake 0.26–0.82 s, a level-2
 * wake 0.85–2.6 s, a cold load 37–58 s, for models of about 1 to 16 GiB of weights):
 *
 *   level-1 wake ≈ 0.2 s + 0.04 s/GiB   (16 GiB: 0.84 s)
 *   level-2 wake ≈ 0.5 s + 0.13 s/GiB   (16 GiB: 2.6 s)
 *   cold load    ≈ 30 s  + 1.75 s/GiB   (16 GiB: 58 s)
 *
 * The residency manager uses it before a model's own wakes and loads were measured on this host;
 * the simulator uses it (SIM_TIME_SCALE) so that its loads and wakes take time in proportion to the
 * model's size, as real ones do.
 */
export type BringBackKind = 'wake1' | 'wake2' | 'load'

export function publishedSeconds(kind: BringBackKind, weightsGib: number): number {
  if (kind === 'wake1') return 0.2 + 0.04 * weightsGib
  if (kind === 'wake2') return 0.5 + 0.13 * weightsGib
  return 30 + 1.75 * weightsGib
}
