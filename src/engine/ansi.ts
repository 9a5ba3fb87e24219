/**
 * stripAnsi removes terminal escape sequences (SGR colours, cursor moves, OSC titles) from a line.
 * vLLM colours its log prefix when it thinks it writes to a terminal, and the log parser must match
 * the plain text whatever the engine's colour setting.
 */
const ANSI_PATTERN = /\u001b\[[0-?]*[ -/]*[@-~]|\u001b\][^\u0007\u001b]*(?:\u0007|\u001b\\)|\u001b[@-Z\\-_]/g

export function stripAnsi(s: string): string {
  return s.includes('\u001b') ? s.replace(ANSI_PATTERN, '') : s
}
