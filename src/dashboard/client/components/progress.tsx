/** ProgressBar: a determinate bar with its label (a load's phase, a move's spawning). */
export function ProgressBar({ percent, label }: { percent: number; label?: string | undefined }) {
  const value = Math.max(0, Math.min(100, Math.round(percent)))
  return (
    <div class="progress" role="progressbar" aria-valuemin={0} aria-valuemax={100} aria-valuenow={value}>
      <div class="progress-fill" style={{ width: `${value}%` }} />
      <span class="progress-label">
        {label ? `${label} · ` : ''}
        {value}%
      </span>
    </div>
  )
}
