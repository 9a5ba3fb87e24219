/**
 * Logger writes one line per event to stderr, as text (`2026-11-21T18:00:00.000Z INFO [gateway] msg k=v`)
 * or JSON lines, filtered by level. Plugins get a child tagged with their id. It exists so every
 * component logs the same way and tests can capture output through a sink.
 */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error'
export type LogFormat = 'text' | 'json'

const RANK: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 }

export type LogSink = (line: string) => void

const stderrSink: LogSink = (line) => {
  process.stderr.write(`${line}\n`)
}

export class Logger {
  constructor(
    private readonly level: LogLevel = 'info',
    private readonly scope = 'modelgate',
    private readonly format: LogFormat = 'text',
    private readonly sink: LogSink = stderrSink,
  ) {}

  child(scope: string): Logger {
    return new Logger(this.level, scope, this.format, this.sink)
  }

  enabled(level: LogLevel): boolean {
    return RANK[level] >= RANK[this.level]
  }

  debug(msg: string, fields?: Record<string, unknown>): void {
    this.write('debug', msg, fields)
  }
  info(msg: string, fields?: Record<string, unknown>): void {
    this.write('info', msg, fields)
  }
  warn(msg: string, fields?: Record<string, unknown>): void {
    this.write('warn', msg, fields)
  }
  error(msg: string, fields?: Record<string, unknown>): void {
    this.write('error', msg, fields)
  }

  write(level: LogLevel, msg: string, fields?: Record<string, unknown>): void {
    if (!this.enabled(level)) return
    const time = new Date().toISOString()
    if (this.format === 'json') {
      this.sink(JSON.stringify({ time, level, scope: this.scope, msg, ...fields }))
      return
    }
    let line = `${time} ${level.toUpperCase()} [${this.scope}] ${msg}`
    if (fields) {
      for (const [k, v] of Object.entries(fields)) {
        if (v === undefined) continue
        line += ` ${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`
      }
    }
    this.sink(line)
  }
}
