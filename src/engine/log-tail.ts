import { closeSync, type FSWatcher, fstatSync, openSync, readSync, watch } from 'node:fs'

/**
 * FileTail follows a log file an engine writes to. Engines log to files, not pipes, so they keep
 * running (and keep their logs) when modelgate restarts: a pipe would break and kill them with
 * SIGPIPE. Lines are delivered in order; a partial last line waits for its newline (or for stop).
 * The file is watched (inotify through fs.watch) so a line is read as soon as it is written (the
 * gateway's readiness hint, `Application startup complete.`, depends on it); polling stays as the
 * fallback where no watch can be set.
 */
export class FileTail {
  private fd: number | null = null
  private pos: number
  private partial = ''
  private timer: ReturnType<typeof setInterval> | null = null
  private watcher: FSWatcher | null = null
  private readonly buf = Buffer.allocUnsafe(64 * 1024)
  private readonly decoder = new TextDecoder()

  constructor(
    path: string,
    private readonly onLine: (line: string) => void,
    opts: { fromEnd?: boolean; intervalMs?: number } = {},
  ) {
    this.fd = openSync(path, 'r')
    this.pos = opts.fromEnd ? fstatSync(this.fd).size : 0
    this.timer = setInterval(() => this.poll(), opts.intervalMs ?? 100)
    try {
      const w = watch(path, { persistent: false }, () => this.poll())
      w.on('error', () => this.unwatch())
      this.watcher = w
    } catch {
      // no watch (no inotify, or the file went away): polling reads the file
    }
  }

  private unwatch(): void {
    this.watcher?.close()
    this.watcher = null
  }

  /** poll reads whatever was appended since the last call. */
  poll(): void {
    if (this.fd === null) return
    for (;;) {
      let n: number
      try {
        n = readSync(this.fd, this.buf, 0, this.buf.length, this.pos)
      } catch {
        return
      }
      if (n <= 0) return
      this.pos += n
      const text = this.partial + this.decoder.decode(this.buf.subarray(0, n), { stream: true })
      const lines = text.split(/\r?\n|\r/)
      this.partial = lines.pop() ?? ''
      for (const line of lines) if (line.length > 0) this.onLine(line)
    }
  }

  /** stop reads the rest, flushes a partial last line and closes the file. */
  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = null
    this.unwatch()
    this.poll()
    if (this.partial) this.onLine(this.partial)
    this.partial = ''
    if (this.fd !== null) closeSync(this.fd)
    this.fd = null
  }
}

/** readLastLines returns up to `max` last lines of a file (for replaying an adopted engine's log). */
export function readLastLines(path: string, max: number, maxBytes = 256 * 1024): string[] {
  let fd: number
  try {
    fd = openSync(path, 'r')
  } catch {
    return []
  }
  try {
    const size = fstatSync(fd).size
    const len = Math.min(size, maxBytes)
    const buf = Buffer.allocUnsafe(len)
    readSync(fd, buf, 0, len, size - len)
    const lines = buf
      .toString('utf8')
      .split(/\r?\n|\r/)
      .filter((l) => l.length > 0)
    if (len < size) lines.shift()
    return lines.slice(-max)
  } finally {
    closeSync(fd)
  }
}
