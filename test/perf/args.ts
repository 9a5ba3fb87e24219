/** stringArg: the word after `name` on the command line (`--policies cost,lru`), or `fallback`. */
export function stringArg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name)
  return i > 1 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback
}

/** numberArg: the number after `name` on the command line (`--rounds 5`), or `fallback`. */
export function numberArg(name: string, fallback: number): number {
  const i = process.argv.indexOf(name)
  return i > 1 ? Number(process.argv[i + 1]) : fallback
}
