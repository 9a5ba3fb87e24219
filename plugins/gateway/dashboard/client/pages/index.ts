import type { Page } from '../page.ts'
import { chatPage } from './chat.tsx'
import { gpusPage } from './gpus.tsx'
import { instancePage } from './instance.tsx'
import { modelsPage } from './models.tsx'

/**
 * pages: the registry the shell routes and builds its navigation from, in navigation order. Pages
 * still to come take their place here: benchmarks, presets and memory profiles, router, cluster.
 */
export const pages: readonly Page[] = [gpusPage, modelsPage, instancePage, chatPage]
