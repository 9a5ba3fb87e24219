import { writeSync } from 'node:fs'

/**
 * VllmLog prints lines in vLLM's format, `LEVEL MM-DD HH:MM:SS [file.py:LINE] message`, optionally
 * behind a process tag like `(EngineCore_DP0 pid=441) ` and with ANSI colours, so the gateway's log
 * parsing is exercised against what real engines print. Logs go to stdout, uvicorn and tracebacks to
 * stderr, as in vLLM.
 */
export type LogLevel = 'DEBUG' | 'INFO' | 'WARNING' | 'ERROR'

/**
 * SimLog is how a simulated engine prints: each engine kind in its own format (vLLM's
 * `LEVEL date [file:line] message`, SGLang's `[date TP0] message`), `tag` being the process tag
 * and `where` the source location for formats that show one.
 */
export interface SimLog {
  write(level: LogLevel, tag: string, where: string, message: string): void
  info(tag: string, where: string, message: string): void
  warning(tag: string, where: string, message: string): void
  error(tag: string, where: string, message: string): void
  stderr(...lines: string[]): void
  stdout(...lines: string[]): void
}

const COLOURS: Record<LogLevel, string> = { DEBUG: '36', INFO: '32', WARNING: '33', ERROR: '31' }

export interface LogSink {
  stdout(text: string): void
  stderr(text: string): void
}

/** processSink writes to the real stdio; `sync` is used right before an abrupt exit. */
export const processSink: LogSink & { syncStderr(text: string): void } = {
  stdout: (text) => process.stdout.write(text),
  stderr: (text) => process.stderr.write(text),
  syncStderr: (text) => {
    try {
      writeSync(2, text)
    } catch {
      process.stderr.write(text)
    }
  },
}

export function logTimestamp(date = new Date()): string {
  const two = (n: number) => String(n).padStart(2, '0')
  return `${two(date.getMonth() + 1)}-${two(date.getDate())} ${two(date.getHours())}:${two(date.getMinutes())}:${two(date.getSeconds())}`
}

export class VllmLog implements SimLog {
  constructor(
    private readonly ansi: boolean,
    private readonly sink: LogSink = processSink,
  ) {}

  format(level: LogLevel, tag: string, where: string, message: string): string {
    const lvl = this.ansi ? `\x1b[${COLOURS[level]}m${level}\x1b[0m` : level
    return `${tag ? `${tag} ` : ''}${lvl} ${logTimestamp()} [${where}] ${message}\n`
  }

  /** write prints one record at `level` (vLLM's logger writes every level to stdout). */
  write(level: LogLevel, tag: string, where: string, message: string): void {
    this.sink.stdout(this.format(level, tag, where, message))
  }

  info(tag: string, where: string, message: string): void {
    this.write('INFO', tag, where, message)
  }

  warning(tag: string, where: string, message: string): void {
    this.sink.stdout(this.format('WARNING', tag, where, message))
  }

  error(tag: string, where: string, message: string): void {
    this.sink.stdout(this.format('ERROR', tag, where, message))
  }

  /** raw writes lines as they are (uvicorn's `INFO:     ...` lines go to stderr). */
  stderr(...lines: string[]): void {
    this.sink.stderr(lines.map((l) => `${l}\n`).join(''))
  }

  stdout(...lines: string[]): void {
    this.sink.stdout(lines.map((l) => `${l}\n`).join(''))
  }
}
