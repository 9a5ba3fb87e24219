import type { DashboardContribution } from '../../../src/dashboard/contract.ts'

/**
 * gatewayDashboard: the gateway's pages on the host's dashboard (their components: client/index.ts)
 * in navigation order. Its live state comes from its own feed of the stream (events.ts), not from
 * relayed bus events.
 */
export const gatewayDashboard: DashboardContribution = {
  client: `${import.meta.dir}/client/index.ts`,
  pages: [
    { id: 'gpus', title: 'GPUs', nav: 'GPUs', path: '/' },
    { id: 'models', title: 'Models', nav: 'Models', path: '/models' },
    { id: 'instance', title: 'Instance', path: '/models/:id' },
    { id: 'catalog', title: 'Catalogue', nav: 'Catalogue', path: '/catalog' },
    { id: 'metrics', title: 'Metrics', nav: 'Metrics', path: '/metrics' },
    { id: 'chat', title: 'Chat', nav: 'Chat', path: '/chat' },
    { id: 'presets', title: 'Presets and memory profiles', nav: 'Presets', path: '/presets' },
  ],
}
