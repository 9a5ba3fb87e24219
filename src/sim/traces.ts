import { appendFileSync, existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'

/**
 * The simulator's record of the W3C `traceparent` headers its inference routes received, so a test
 * can see that a trace reached the engine (vLLM joins such a request to the caller's trace when it
 * runs with `--otlp-traces-endpoint`). One line per request carrying the header, `<traceparent>
 * <path>`, in `<sim dir>/traceparents-<port>.log`; nothing is written for requests without one.
 */
export function traceparentLog(simDir: string, port: number): string {
  return join(simDir, `traceparents-${port}.log`)
}

export function recordTraceparent(simDir: string, port: number, req: Request): void {
  const value = req.headers.get('traceparent')
  if (value === null) return
  appendFileSync(traceparentLog(simDir, port), `${value} ${new URL(req.url).pathname}\n`)
}

/** traceparentsSeen: what the engine on `port` received, in order. */
export function traceparentsSeen(simDir: string, port: number): { traceparent: string; path: string }[] {
  const file = traceparentLog(simDir, port)
  if (!existsSync(file)) return []
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const [traceparent = '', path = ''] = line.split(' ')
      return { traceparent, path }
    })
}
