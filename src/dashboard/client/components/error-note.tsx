import type { ApiError } from '../api.ts'

/** ErrorNote shows an API error where it happened: the server's message, then its code. */
export function ErrorNote({ error }: { error: ApiError | Error | null | undefined }) {
  if (!error) return null
  const code = 'code' in error && typeof error.code === 'string' ? error.code : ''
  return (
    <p class="error" role="alert">
      {error.message}
      {code && <span class="code">{code}</span>}
    </p>
  )
}
