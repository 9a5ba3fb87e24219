import type { ClusterConfig } from '../config.ts'
import { EtcdCoordinator } from './etcd.ts'
import { KubernetesCoordinator } from './kubernetes.ts'
import { StaticCoordinator } from './static.ts'
import type { Coordinator, CoordinatorOptions } from './types.ts'

/** createCoordinator: the coordination backend `plugins.cluster.coordination.kind` names. */
export function createCoordinator(cfg: ClusterConfig, opts: CoordinatorOptions): Coordinator {
  const c = cfg.coordination
  switch (c.kind) {
    case 'etcd':
      return new EtcdCoordinator(c.etcd, cfg.cluster_id, opts)
    case 'kubernetes':
      return new KubernetesCoordinator(c.kubernetes, opts)
    case 'static':
      if (!c.static) throw new Error('plugins.cluster.coordination.static: required when kind is static')
      return new StaticCoordinator(c.static, opts)
  }
}
