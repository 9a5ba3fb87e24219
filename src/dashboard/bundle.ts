import type { DashboardFile } from '../../build/dashboard.ts'

/**
 * loadBundle returns the dashboard's files: the host's shell with `clients`, the plugins' client
 * modules. Running from source (`npm run demo`, the tests) it bundles them with Bun.build on first
 * use, so a fresh clone needs no build step; the compiled binary never runs this: build/compile.ts
 * replaces this module with one that reads the files it built (with every compiled-in plugin's
 * client) and embedded (`with { type: 'file' }`), and keeps this signature.
 */
export type { DashboardFile }

export async function loadBundle(clients: readonly string[]): Promise<DashboardFile[]> {
  const { buildDashboard } = await import('../../build/dashboard.ts')
  return buildDashboard(clients)
}
