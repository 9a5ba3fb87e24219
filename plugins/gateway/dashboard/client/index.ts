import { defineClient } from '../../../../src/dashboard/client/page.ts'
import './live.ts'
import { CatalogPage } from './pages/catalog.tsx'
import { ChatPage } from './pages/chat.tsx'
import { GpusPage } from './pages/gpus.tsx'
import { InstancePage } from './pages/instance.tsx'
import { MetricsPage } from './pages/metrics.tsx'
import { ModelsPage } from './pages/models.tsx'
import { PresetsPage } from './pages/presets.tsx'

/**
 * The gateway's client module on the host's dashboard: its pages' components (their titles and
 * paths: ../pages.ts), and its live state (live.ts), which follows the stream from the first page.
 */
export default defineClient({
  pages: {
    gpus: GpusPage,
    models: ModelsPage,
    instance: InstancePage,
    catalog: CatalogPage,
    metrics: MetricsPage,
    chat: ChatPage,
    presets: PresetsPage,
  },
})
