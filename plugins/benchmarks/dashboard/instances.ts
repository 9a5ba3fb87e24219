import { computed, signal } from '@preact/signals'
import { onLive } from '../../../src/dashboard/client/live.ts'
import type { InstanceRecord } from '../../gateway/api.ts'

/**
 * The gateway's instances as the live stream gives them (the gateway's `instances`, first on each
 * connection, then an `instance` on every change): what a run can measure, always current.
 */
const byId = signal<ReadonlyMap<string, InstanceRecord>>(new Map())

onLive<{ instances: InstanceRecord[] }>('instances', ({ instances }) => {
  byId.value = new Map(instances.map((i) => [i.id, i]))
})
onLive<{ instance: InstanceRecord; currentStatus: string }>('instance', (e) => {
  const next = new Map(byId.value)
  if (e.currentStatus === 'removed') next.delete(e.instance.id)
  else next.set(e.instance.id, e.instance)
  byId.value = next
})

/** activeInstances: the instances serving now, oldest first (as the gateway's pages order them). */
export const activeInstances = computed(() =>
  [...byId.value.values()]
    .filter((i) => i.status === 'active')
    .sort((a, b) => a.loaded_at.localeCompare(b.loaded_at) || a.id.localeCompare(b.id)),
)
