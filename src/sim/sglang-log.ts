import { type LogLevel, type LogSink, processSink, type SimLog } from './vllm-log.ts'

/**
 * SglangLog prints lines as an SGLang server does: its own records as `[YYYY-MM-DD HH:MM:SS TP0]
 * message` on stdout, with no level (srt/utils configure_logger: `[%(asctime)s{prefix}]
 * %(message)s`; the prefix names a scheduler's rank, none for the main process); uvicorn's records
 * as `[date] INFO:     …` (set_uvicorn_logging_configs), its server lines on stderr and its access
 * log on stdout; tracebacks as they come. `tag` is the rank prefix (` TP0`) or ''; `where` (a vLLM
 * file and line) is not printed: SGLang's format has none.
 */
export function sglangTimestamp(date = new Date()): string {
  const two = (n: number) => String(n).padStart(2, '0')
  return (
    `${date.getFullYear()}-${two(date.getMonth() + 1)}-${two(date.getDate())} ` +
    `${two(date.getHours())}:${two(date.getMinutes())}:${two(date.getSeconds())}`
  )
}

export class SglangLog implements SimLog {
  constructor(private readonly sink: LogSink = processSink) {}

  format(tag: string, message: string): string {
    return `[${sglangTimestamp()}${tag}] ${message}\n`
  }

  write(_level: LogLevel, tag: string, _where: string, message: string): void {
    this.sink.stdout(this.format(tag, message))
  }

  info(tag: string, where: string, message: string): void {
    this.write('INFO', tag, where, message)
  }

  warning(tag: string, where: string, message: string): void {
    this.write('WARNING', tag, where, message)
  }

  error(tag: string, where: string, message: string): void {
    this.write('ERROR', tag, where, message)
  }

  /** uvicorn writes its server records to stderr: `[date] INFO:     message`. */
  uvicorn(message: string): void {
    this.sink.stderr(`[${sglangTimestamp()}] INFO:     ${message}\n`)
  }

  /** access is uvicorn's access log (stdout). */
  access(line: string): void {
    this.sink.stdout(`[${sglangTimestamp()}] INFO:     ${line}\n`)
  }

  stderr(...lines: string[]): void {
    this.sink.stderr(lines.map((l) => `${l}\n`).join(''))
  }

  stdout(...lines: string[]): void {
    this.sink.stdout(lines.map((l) => `${l}\n`).join(''))
  }
}
