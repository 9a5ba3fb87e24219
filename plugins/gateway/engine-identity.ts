import { type PortListener, portOwners } from '../../src/engine/socket-owner.ts'
import type { ManagedInstance } from './instance.ts'

/**
 * confirmEngine runs when a starting engine's port first answers /health 200, before the instance
 * becomes active and anything is routed to it: the answer must come from the engine started for it.
 * Two facts must hold: every socket listening on the port (for the engine's address) belongs to the
 * engine's process group (socket-owner.ts), and its `GET /v1/models` lists the instance's served
 * name. A port two processes share (SO_REUSEPORT: vLLM sets it on its socket up to mid-2026 builds)
 * or one taken by another process between the port claim and the engine's bind fails one of them.
 * Returns null when both hold, else what answers on the port instead, for the failure message.
 */
export async function confirmEngine(inst: ManagedInstance, engineHost: string): Promise<string | null> {
  const { port, pgid, served_model_name: name } = inst.row
  const [owners, models] = await Promise.all([
    pgid ? portOwners(port, engineHost, pgid) : null,
    inst.client.servedModels({ timeoutMs: 5000 }).then(
      (ids) => ({ ids, said: `/v1/models there lists ${ids.length ? ids.join(', ') : 'no model'}` }),
      (err: Error) => ({ ids: [] as string[], said: `/v1/models there failed (${err.message})` }),
    ),
  ])
  if (owners && owners.others.length > 0) {
    const engine = owners.ours.length
      ? `shared with this engine (process group ${pgid})`
      : `while this engine (process group ${pgid}) does not listen there`
    return `port ${port} is answered by ${owners.others.map(describe).join(' and ')}, ${engine}; ${models.said}`
  }
  if (owners && owners.ours.length === 0)
    return `port ${port} answers but no socket of this engine (process group ${pgid}) listens there; ${models.said}`
  if (!models.ids.includes(name)) return `the engine on port ${port} does not serve ${name}: ${models.said}`
  return null
}

function describe(l: PortListener): string {
  if (l.pid === null) return `a process modelgate may not inspect (listening on ${l.address})`
  return `pid ${l.pid}${l.command ? ` (${l.command})` : ''} listening on ${l.address}`
}
