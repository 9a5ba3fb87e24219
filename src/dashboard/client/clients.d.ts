// The client modules of every compiled-in plugin, in the plugin list's order: generated at bundle
// time from the plugins' definitions (build/dashboard.ts), so the shell names no plugin.
declare module 'modelgate:dashboard-clients' {
  const clients: readonly import('./page.ts').DashboardClient[]
  export default clients
}
