/**
 * probeConnect answers "can a TCP connection to this upstream be opened within `ms`?".
 *
 * fetch() does not report when its connection is established, so the connect deadline is
 * enforced out of band: when a request still has no response headers after the connect deadline,
 * the proxy probes the upstream's address. A probe that cannot connect in time means the host is
 * unreachable (blackholed SYNs), so the request is failed with 504 `upstream_connect_timeout`
 * instead of waiting for the long first-byte deadline. A probe that connects means the engine is
 * up and simply busy (prefill, queueing): the request keeps waiting. Probes are shared between
 * concurrent requests to the same origin and remembered for a second, so a busy engine sees at
 * most one extra connection per second.
 */
export type ProbeResult = 'connected' | 'refused' | 'timeout'

const RECENT_MS = 1000
const recent = new Map<string, { at: number; result: Promise<ProbeResult> }>()

export function probeConnect(upstreamUrl: string, ms: number): Promise<ProbeResult> {
  const origin = originOf(upstreamUrl)
  const now = performance.now()
  const hit = recent.get(origin)
  if (hit && now - hit.at < RECENT_MS) return hit.result
  const result = openOnce(origin, ms)
  recent.set(origin, { at: now, result })
  if (recent.size > 1024) for (const [k, v] of recent) if (now - v.at >= RECENT_MS) recent.delete(k)
  return result
}

function openOnce(origin: string, ms: number): Promise<ProbeResult> {
  const { hostname, port } = hostPort(origin)
  return new Promise<ProbeResult>((resolve) => {
    let settled = false
    const settle = (r: ProbeResult) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      resolve(r)
    }
    const timer = setTimeout(() => settle('timeout'), ms)
    Bun.connect({
      hostname,
      port,
      socket: {
        open(s) {
          s.end()
          settle('connected')
        },
        data() {},
        error() {},
        connectError() {
          settle('refused')
        },
      },
    }).then(
      (s) => {
        // A connect that completes after the deadline is closed at once.
        if (settled) s.end()
      },
      () => settle('refused'),
    )
  })
}

/** originOf: `http://h:p/path?q` → `http://h:p` without URL parsing. */
export function originOf(url: string): string {
  const start = url.indexOf('//') + 2
  const slash = url.indexOf('/', start)
  return slash < 0 ? url : url.slice(0, slash)
}

function hostPort(origin: string): { hostname: string; port: number } {
  const u = new URL(origin)
  const port = u.port ? Number(u.port) : u.protocol === 'https:' ? 443 : 80
  const hostname = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname
  return { hostname, port }
}
