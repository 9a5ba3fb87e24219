import { defineClient } from '../../../src/dashboard/client/page.ts'
import { BenchmarksPage, ComparePage, RunPage } from './pages.tsx'

/** The benchmarks' client module on the host's dashboard (their titles and paths: ../index.ts). */
export default defineClient({
  pages: { benchmarks: BenchmarksPage, benchmark: RunPage, 'benchmark-compare': ComparePage },
})
