/**
 * sim/index is the simulator's public surface: the CLI entry plus the pieces tests and the demo may reuse.
 */
export { runSim } from './cli.ts'
export { parseGpuSpec, type SimGpu } from './gpus.ts'
export { KvcachedSegment } from './kvcached.ts'
export { lookupModel } from './models.ts'
export { runSmi } from './smi.ts'
export { type EngineRecord, readLiveEngines } from './state.ts'
export { FakeTokenizer } from './tokenizer.ts'
export { humanReadableInt, parseVllmArgs } from './vllm-args.ts'
