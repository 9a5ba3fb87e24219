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
