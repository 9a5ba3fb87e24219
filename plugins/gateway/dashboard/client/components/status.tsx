/** StatusBadge: an instance's state (or an operation under way) as a coloured label. */
export function StatusBadge({ status, operation }: { status: string; operation?: string | undefined }) {
  const label = operation
    ? `${operation === 'move' ? 'moving' : `${operation.replace(/e$/, '')}ing`}…`
    : status
  return (
    <span class={`badge ${operation ? 'busy' : status}`} data-status={status}>
      {label}
    </span>
  )
}

/** Swatch: an instance's colour, as in the GPU view. */
export function Swatch({ color }: { color: string | undefined }) {
  return <span class="swatch" style={{ background: color ?? 'var(--muted)' }} />
}
