import { defineClient } from '../page.ts'
import { KeysPage } from './keys.tsx'

/** hostClient: the host's own pages (their titles and paths: src/dashboard/pages.ts). */
export const hostClient = defineClient({ pages: { keys: KeysPage } })
