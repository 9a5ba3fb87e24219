import { defineClient } from '../../../src/dashboard/client/page.ts'
import { ClusterPage } from './page.tsx'

/** The cluster's client module on the host's dashboard (its page's title and path: ../index.ts). */
export default defineClient({ pages: { cluster: ClusterPage } })
