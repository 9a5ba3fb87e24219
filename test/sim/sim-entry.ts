/**
 * sim-entry is the test-only executable for the simulators: `bun test/sim/sim-entry.ts engine …` or
 * `… smi …`, standing in for `modelgate sim …` so tests can spawn them as real child processes. It
 * is also the test hosts' `@self` (test/support/host.ts), so it takes `sim engine …` too: it loads
 * the simulators alone, not the whole app as `src/main.ts` does (a spawn in 0.05 s instead of 0.3 s).
 */
import { runSim } from '../../src/sim/cli.ts'

const args = process.argv.slice(2)
if (args[0] === 'sim') args.shift()
process.exitCode = await runSim(args)
