/**
 * listenError says why a listener could not open, naming the listener, its address and port. The
 * runtime's own message ("Failed to listen at 127.0.0.1") names neither the port nor the cause. It
 * is a plain Error, not a ConfigError: a port in use may be free on the next try (an old process
 * still exiting), so `serve` exits 1 and systemd's Restart= may retry it.
 */
export function listenError(name: string, host: string, port: number, err: unknown): Error {
  const where = `${host.includes(':') ? `[${host}]` : host}:${port}`
  const code = (err as { code?: unknown } | null)?.code
  const why =
    code === 'EADDRINUSE'
      ? `${where} is already in use (another process listens there)`
      : code === 'EADDRNOTAVAIL'
        ? `cannot listen on ${where}: ${host} is not an address of this host`
        : code === 'EACCES'
          ? `cannot listen on ${where}: permission denied (ports below 1024 need privileges)`
          : `cannot listen on ${where}: ${err instanceof Error ? err.message : String(err)}`
  return new Error(`${name} listener: ${why}`, { cause: err })
}
