/** numberArg: the number after `name` on the command line (`--rounds 5`), or `fallback`. */
export function numberArg(name: string, fallback: number): number {
  const i = process.argv.indexOf(name)
  return i > 1 ? Number(process.argv[i + 1]) : fallback
}
