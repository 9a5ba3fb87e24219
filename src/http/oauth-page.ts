import { createHash } from 'node:crypto'
import { pageHeaders } from './page-headers.ts'

/**
 * The pages a browser sees when an OAuth login does not end at the frontend: the access-denied page
 * (the required groups, a retry link) and the failure page (what went wrong, a retry link). Small,
 * self-contained HTML with no script; every value is escaped (the provider's error text comes from
 * the query string). API clients that do not ask for HTML get the controller JSON shape instead.
 */

export function escapeHtml(s: string): string {
  return s.replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!,
  )
}

/** STYLE: the pages' one style block, allowed by its hash (no 'unsafe-inline'). */
const STYLE = `
body { font-family: system-ui, sans-serif; max-width: 40rem; margin: 4rem auto; padding: 0 1rem; color: #222; }
h1 { font-size: 1.4rem; } code { background: #f2f2f2; padding: 0 .3em; border-radius: 3px; }
a.button { display: inline-block; margin-top: 1rem; padding: .5rem 1rem; background: #2457c5; color: #fff;
  text-decoration: none; border-radius: 4px; }
`
const STYLE_HASH = `'sha256-${createHash('sha256').update(STYLE).digest('base64')}'`

/**
 * Headers of every auth page and redirect: not cached, no referrer (the callback URL holds the code),
 * never framed; the page runs no script and loads nothing but its own style block.
 */
export const PAGE_HEADERS = {
  ...pageHeaders(
    `default-src 'none'; style-src ${STYLE_HASH}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`,
  ),
  'cache-control': 'no-store',
}

/** wantsHtml: a browser navigation (Accept names text/html) gets a page, anything else JSON. */
export function wantsHtml(req: Request): boolean {
  return (req.headers.get('accept') ?? '').includes('text/html')
}

function page(title: string, body: string): string {
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1" />
<title>${escapeHtml(title)} · modelgate</title>
<style>${STYLE}</style>
</head>
<body>
<h1>${escapeHtml(title)}</h1>
${body}
</body>
</html>`
}

export interface DeniedPage {
  username: string
  groups: Record<'admin' | 'admin-readonly', string[]>
  retryUrl: string
}

/** accessDeniedPage: the user is in none of the groups; names them and offers a retry. No token. */
export function accessDeniedPage(d: DeniedPage): string {
  const list = (gs: string[]) => gs.map((g) => `<code>${escapeHtml(g)}</code>`).join(' or ')
  const rows: string[] = []
  if (d.groups.admin.length) rows.push(`<li>${list(d.groups.admin)} for the <b>admin</b> role</li>`)
  if (d.groups['admin-readonly'].length)
    rows.push(`<li>${list(d.groups['admin-readonly'])} for the <b>admin-readonly</b> role</li>`)
  return page(
    'Access denied',
    `<p>You are logged in to the platform as <b>${escapeHtml(d.username)}</b>, but modelgate needs you to be a member of one of these groups:</p>
<ul>${rows.join('')}</ul>
<p>Ask a cluster administrator to add you to one, then try again.</p>
<a class="button" href="${escapeHtml(d.retryUrl)}">Try again</a>`,
  )
}

/** failurePage: any other way a login can fail; the message says what happened. */
export function failurePage(title: string, message: string, code: string, retryUrl: string): string {
  return page(
    title,
    `<p>${escapeHtml(message)}</p>
<p>Error code: <code>${escapeHtml(code)}</code></p>
<a class="button" href="${escapeHtml(retryUrl)}">Try again</a>`,
  )
}
