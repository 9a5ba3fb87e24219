import { swagger } from '@elysiajs/swagger'
import { Elysia } from 'elysia'
import cssPath from 'swagger-ui-dist/swagger-ui.css' with { type: 'file' }
// The Swagger UI assets are imported as files so `bun build --compile` embeds them: /docs works
// on a host with no internet access.
import bundlePath from 'swagger-ui-dist/swagger-ui-bundle.js' with { type: 'file' }
import type { RouteAccess } from './auth.ts'
import { pageHeaders } from './page-headers.ts'

/**
 * docsPlugin serves the OpenAPI document at `/docs/json` and an offline Swagger UI at `/docs`.
 * Security requirements and the role each admin operation needs (`x-required-role`) are read from
 * the same route declarations the auth guard enforces, so the document cannot drift from what is
 * actually required.
 */
export interface DocsOptions {
  title: string
  description: string
  version: string
  tags: { name: string; description: string }[]
  /** access: what a route requires (the guard's table); absent on a listener without the admin guard. */
  access?: (method: string, pattern: string) => RouteAccess
}

/**
 * DOCS_CSP: Swagger UI runs from this origin only and no other site may frame it. Its bundle, its
 * stylesheet and the script that starts it are files under `/docs/assets/` (no inline script or
 * style at all, so neither needs 'unsafe-inline', a hash or a nonce); the OpenAPI document and
 * "Try it out" requests go to this origin; its icons are data: images in its stylesheet.
 */
export const DOCS_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "font-src 'self'",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ')

/** The headers of `/docs`, its assets and `/docs/json`. */
const DOCS_HEADERS = pageHeaders(DOCS_CSP)

const assetHeaders = (type: string) => ({
  ...DOCS_HEADERS,
  'content-type': type,
  'cache-control': 'public, max-age=86400',
})

/**
 * INIT: the script that starts Swagger UI. The authorization typed into "Authorize" stays in the
 * page's memory (persistAuthorization off): a JWT is never written to localStorage, where it would
 * outlive the tab with no expiry. No validator badge (it would load an image from another host).
 */
const INIT = `window.ui = SwaggerUIBundle({
  url: '/docs/json',
  dom_id: '#swagger-ui',
  persistAuthorization: false,
  validatorUrl: null,
  deepLinking: true,
  displayRequestDuration: true,
  tryItOutEnabled: true,
  showExtensions: true,
});
`

/**
 * page: the Swagger UI page. It declares an empty icon (`data:`, which its policy's img-src allows),
 * as the dashboard does, so a browser does not ask for `/favicon.ico` on every visit (a 404 and a
 * warning in the log each time).
 */
function page(title: string): string {
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1" />
<title>${title}</title>
<link rel="icon" href="data:," />
<link rel="stylesheet" href="/docs/assets/swagger-ui.css" />
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/assets/init.js"></script>
</body>
</html>`
}

type OpenApiDoc = {
  paths?: Record<string, Record<string, { security?: unknown[]; tags?: string[]; [x: string]: unknown }>>
  components?: Record<string, unknown>
}

function addSecurity(doc: OpenApiDoc, access: DocsOptions['access']): OpenApiDoc {
  if (!access) return doc
  doc.components = {
    ...doc.components,
    securitySchemes: {
      adminJwt: {
        type: 'http',
        scheme: 'bearer',
        bearerFormat: 'JWT',
        description: 'Admin JWT from POST /api/auth/login (required when AUTH_MODE is not none).',
      },
      inferenceKey: {
        type: 'http',
        scheme: 'bearer',
        description: 'Inference API key (required when INFERENCE_API_KEY is set).',
      },
    },
  }
  for (const [path, ops] of Object.entries(doc.paths ?? {})) {
    // OpenAPI writes `{id}` where the route registered `:id`.
    const pattern = path.replace(/\{([^}]+)\}/g, ':$1')
    for (const [method, op] of Object.entries(ops)) {
      if (!op || typeof op !== 'object') continue
      const a = access(method.toUpperCase(), pattern)
      op['x-auth'] = a.category
      if (a.category === 'admin') {
        op['x-required-role'] = a.readOnly ? 'admin-readonly' : 'admin'
        op.security ??= [{ adminJwt: [] }]
      } else if (a.category === 'inference') op.security ??= [{ inferenceKey: [] }]
    }
  }
  return doc
}

export function docsPlugin(opts: DocsOptions) {
  const html = page(opts.title)
  return new Elysia({ name: `docs:${opts.title}` })
    .onAfterHandle({ as: 'global' }, ({ path, response, set }) => {
      if (path !== '/docs/json') return
      Object.assign(set.headers, DOCS_HEADERS)
      if (response && typeof response === 'object' && !(response instanceof Response))
        return addSecurity(response as OpenApiDoc, opts.access)
    })
    .use(
      swagger({
        path: '/docs',
        specPath: '/docs/json',
        provider: 'swagger-ui',
        exclude: [/^\/docs/],
        documentation: {
          info: { title: opts.title, description: opts.description, version: opts.version },
          tags: opts.tags,
        },
      }),
    )
    .get(
      '/docs',
      () =>
        new Response(html, {
          headers: {
            ...DOCS_HEADERS,
            'content-type': 'text/html; charset=utf-8',
            'cache-control': 'no-cache',
          },
        }),
      { detail: { hide: true } },
    )
    .get('/docs/assets/init.js', () => new Response(INIT, { headers: assetHeaders('text/javascript') }), {
      detail: { hide: true },
    })
    .get(
      '/docs/assets/swagger-ui-bundle.js',
      () => new Response(Bun.file(bundlePath), { headers: assetHeaders('text/javascript') }),
      {
        detail: { hide: true },
      },
    )
    .get(
      '/docs/assets/swagger-ui.css',
      () => new Response(Bun.file(cssPath), { headers: assetHeaders('text/css') }),
      {
        detail: { hide: true },
      },
    )
}
