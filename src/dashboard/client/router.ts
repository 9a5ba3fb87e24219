import { signal } from '@preact/signals'

/**
 * The dashboard's routes live in the URL fragment (`#/models/<id>`): the gateway serves one page at
 * `/` and needs no fallback route for client paths, and a reload or a shared link opens the same
 * view. (An OAuth fragment, `#token=…`, is taken and replaced before routing starts: session.ts.)
 */
const current = () => {
  const hash = location.hash.slice(1)
  return hash.startsWith('/') ? hash : '/'
}

export const path = signal(current())

addEventListener('hashchange', () => {
  path.value = current()
})

export function href(to: string): string {
  return `#${to}`
}

export function navigate(to: string): void {
  location.hash = to
}

/** match: a pattern such as `/models/:id` against a path; the named parts, or null. */
export function match(pattern: string, p: string): Record<string, string> | null {
  const want = pattern.split('/')
  const got = p.split('/')
  if (want.length !== got.length) return null
  const params: Record<string, string> = {}
  for (const [i, part] of want.entries()) {
    const value = got[i] ?? ''
    if (part.startsWith(':')) {
      if (!value) return null
      params[part.slice(1)] = decodeURIComponent(value)
    } else if (part !== value) return null
  }
  return params
}
