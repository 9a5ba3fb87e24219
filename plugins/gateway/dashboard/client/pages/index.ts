import type { Page } from '../page.ts'
import { benchmarkPage, benchmarksPage, comparePage } from './benchmarks.tsx'
import { catalogPage } from './catalog.tsx'
import { chatPage } from './chat.tsx'
import { clusterPage } from './cluster.tsx'
import { gpusPage } from './gpus.tsx'
import { instancePage } from './instance.tsx'
import { keysPage } from './keys.tsx'
import { metricsPage } from './metrics.tsx'
import { modelsPage } from './models.tsx'
import { presetsPage } from './presets.tsx'
import { routerPage } from './router.tsx'

/**
 * pages: the registry the shell routes and builds its navigation from, in navigation order. A page
 * that `requires` an optional plugin is shown only when that plugin is on.
 */
export const pages: readonly Page[] = [
  gpusPage,
  modelsPage,
  instancePage,
  catalogPage,
  metricsPage,
  chatPage,
  benchmarksPage,
  comparePage,
  benchmarkPage,
  presetsPage,
  keysPage,
  routerPage,
  clusterPage,
]
