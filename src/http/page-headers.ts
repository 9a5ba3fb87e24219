/**
 * pageHeaders: the headers of every page a browser renders from modelgate (the dashboard, `/docs`,
 * the login pages). One set, so no page is left weaker than another: the page's own
 * Content-Security-Policy (what it may load and run, each ending in `frame-ancestors 'none'`),
 * `X-Frame-Options: DENY` for browsers without frame-ancestors (no other site may frame a page to
 * trick a click on it), `nosniff` (a response is only ever what its content-type says),
 * `no-referrer` (URLs, which may hold a login code, never leave in a Referer) and a browsing-context
 * group of its own (`Cross-Origin-Opener-Policy: same-origin`: a page that opened this one keeps no
 * handle on it).
 */
export function pageHeaders(csp: string): Record<string, string> {
  return {
    'content-security-policy': csp,
    'x-frame-options': 'DENY',
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'cross-origin-opener-policy': 'same-origin',
  }
}
