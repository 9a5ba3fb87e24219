/**
 * splitUrl gives the path and `?query` of a request URL by slicing: the hot paths (raw routes,
 * proxies, error rendering) never pay for `new URL()`.
 */
export function splitUrl(url: string): { path: string; query: string } {
  const start = url.indexOf('/', url.indexOf('//') + 2)
  if (start < 0) return { path: '/', query: '' }
  const q = url.indexOf('?', start)
  return q < 0 ? { path: url.slice(start), query: '' } : { path: url.slice(start, q), query: url.slice(q) }
}

/** pathOf is splitUrl's path alone. */
export function pathOf(url: string): string {
  return splitUrl(url).path
}

/** httpUrl parses an http(s) URL from the configuration; null when it is missing or not one. */
export function httpUrl(v: string | undefined): URL | null {
  if (!v) return null
  try {
    const u = new URL(v)
    return u.protocol === 'http:' || u.protocol === 'https:' ? u : null
  } catch {
    return null
  }
}
