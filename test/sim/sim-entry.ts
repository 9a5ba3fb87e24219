/**
 * sim-entry is the test-only executable for the simulators: `bun test/sim/sim-entry.ts engine …` or
 * `… smi …`, standing in for `modelgate sim …` so tests can spawn them as real child processes.
 */
import { runSim } from '../../src/sim/cli.ts'

process.exitCode = await runSim(process.argv.slice(2))
