import { defineClient } from '../../../src/dashboard/client/page.ts'
import { RouterPage } from './page.tsx'

/** The router's client module on the host's dashboard (its page's title and path: ../index.ts). */
export default defineClient({ pages: { router: RouterPage } })
