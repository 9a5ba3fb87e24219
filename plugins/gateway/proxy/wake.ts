import type { EventBus } from '../../../src/host/bus.ts'
import { AppError, proxyError } from '../../../src/http/errors.ts'
import { type SleepingModel, type WakeAnswers, WakeRecord } from '../../../src/wire/wake-on-request.ts'
import type { GatewayApi, InstanceLifecycleEvent, InstanceRecord } from '../api.ts'
import type { Operation } from '../lifecycle.ts'

/**
 * GatewayWakes is the gateway's side of wake on request (src/wire/wake-on-request.ts decides reject
 * or hold): which instances a request for a sleeping model wakes, the one wake of each, and a
 * record per served model name of how long its wakes took, for Retry-After.
 *
 * - A request wakes every sleeping instance its `model` names (as `acquire` matches: id, served
 *   name or model path) and goes on as soon as one of them is awake. Each instance has one wake
 *   however many requests wait on it, started through the gateway's own `wake` (the instance's
 *   one operation), never around it.
 * - Instances are followed through their lifecycle events (`gateway.instance.lifecycle`), so a wait
 *   ends on the change itself: the instance turning `active` (before the wake's memory measurement,
 *   which the request need not wait for). An instance going to sleep is woken once it sleeps; one
 *   whose wake or move someone else runs is waited for; one that fails, stops or goes away ends the
 *   wait too, and the request is planned again (a move's target may serve it).
 * - Every wake is measured, whoever started it (a request, the API, the router): from its operation
 *   beginning to the instance becoming active. A failed wake that a request started is remembered
 *   for WAKE_RETRY_MS, so requests do not each start another.
 */
export const GATEWAY_WAKE_ANSWERS: WakeAnswers = {
  waking: (model, seconds, message) =>
    proxyError(
      503,
      'service_unavailable',
      'model_sleeping',
      message ?? `Model '${model}' is sleeping and is being woken up; retry in ${seconds} s`,
      undefined,
      { 'retry-after': String(seconds) },
    ),
  failed: (model, reason) =>
    proxyError(502, 'bad_gateway', 'wake_failed', `Model '${model}' could not be woken up: ${reason}`),
}

/** Used when neither a measured wake nor the refusal says how long a wake takes. */
const DEFAULT_RETRY_AFTER_SECONDS = 5

export class GatewayWakes {
  /** The control operation running on each instance. */
  private readonly operations = new Map<string, Operation>()
  /** Per served model name: its wakes' durations and last failure. */
  private readonly records = new Map<string, WakeRecord>()
  /** The one wake of each instance that requests wait on. */
  private readonly wakes = new Map<string, Promise<void>>()

  constructor(
    private readonly api: GatewayApi,
    private readonly bus: EventBus,
  ) {
    bus.on('gateway.instance.lifecycle', (e) => this.follow(e))
  }

  /**
   * sleeping: the model a request found asleep (acquire refused it with `refusal`), or null when
   * no instance it names is asleep any more (the request is then answered with the refusal).
   */
  sleeping(model: string, refusal: AppError): SleepingModel | null {
    const asleep = this.api.list().filter((i) => names(i, model) && this.isAsleep(i))
    const first = asleep[0]
    if (!first) return null
    const name = first.served_model_name
    const record = this.record(name)
    const fallback = retryAfterOf(refusal) ?? DEFAULT_RETRY_AFTER_SECONDS
    return {
      name,
      recentFailure: () => record.recentFailure(performance.now()),
      retryAfterSeconds: () => record.retryAfterSeconds(performance.now()) ?? fallback,
      wake: () => {
        const wakes = asleep.map((i) => this.wakeInstance(i.id, record))
        if (wakes.length === 1) return wakes[0]!
        return Promise.any(wakes).then(
          () => {},
          (err: AggregateError) => Promise.reject(err.errors[0]),
        )
      },
    }
  }

  /** isAsleep: sleeping, or going to sleep (still active while its sleep runs). */
  private isAsleep(i: InstanceRecord): boolean {
    return i.status === 'sleeping' || (i.status === 'active' && this.operations.get(i.id) === 'sleep')
  }

  private record(name: string): WakeRecord {
    let r = this.records.get(name)
    if (!r) {
      r = new WakeRecord()
      this.records.set(name, r)
    }
    return r
  }

  /** follow keeps the operations and the wake records from an instance's lifecycle changes. */
  private follow(e: InstanceLifecycleEvent): void {
    const { instance_id: id, change } = e
    if (change.kind === 'operation') {
      if (change.running) this.operations.set(id, change.operation)
      else this.operations.delete(id)
      if (change.operation !== 'wake') return
      const record = this.record(e.served_model_name)
      if (change.running) record.started(e.at)
      else record.ended()
    } else if (change.kind === 'state') {
      if (change.previous === 'sleeping' && change.current === 'active')
        this.record(e.served_model_name).succeeded(e.at)
      if (change.current === 'removed') this.operations.delete(id)
    }
  }

  /** wakeInstance: the instance's one wake; a failure is remembered for the model. */
  private wakeInstance(id: string, record: WakeRecord): Promise<void> {
    let wake = this.wakes.get(id)
    if (!wake) {
      wake = this.untilAwake(id)
        .catch((err: Error) => {
          record.failed(performance.now(), err.message)
          throw err
        })
        .finally(() => this.wakes.delete(id))
      this.wakes.set(id, wake)
    }
    return wake
  }

  /**
   * untilAwake wakes an instance and resolves once it is no longer asleep: active, or failed,
   * stopping or gone (the request is planned again and gets what the instance is now). It rejects
   * when the engine did not wake (the gateway's wake failed).
   */
  private untilAwake(id: string): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let settled = false
      let calling = false
      let woken = false
      /** A wake call was refused (409): the next try waits for the instance's next change. */
      let refused = false
      const finish = (err?: unknown) => {
        if (settled) return
        settled = true
        off()
        if (err === undefined) resolve()
        else reject(err)
      }
      const step = () => {
        if (settled) return
        const rec = this.api.get(id)
        if (!rec || !this.isAsleep(rec)) return finish()
        // Going to sleep, or a wake or move someone else runs: its end is the next step.
        if (calling || refused || rec.status !== 'sleeping' || this.operations.has(id)) return
        if (woken) return finish(new Error('the engine still reports sleeping after waking up'))
        calling = true
        let call: Promise<unknown>
        try {
          call = this.api.wake(id)
        } catch (err) {
          call = Promise.reject(err)
        }
        call.then(
          () => {
            calling = false
            woken = true
            step()
          },
          (err: unknown) => {
            calling = false
            if (!(err instanceof AppError) || err.status >= 500) return finish(err)
            // A conflict (another operation began, the instance changed): try again on its next change.
            refused = true
            step()
          },
        )
      }
      const off = this.bus.on('gateway.instance.lifecycle', (e) => {
        if (e.instance_id !== id) return
        refused = false
        step()
      })
      step()
    })
  }
}

/** names: whether a request's `model` names the instance (as acquire matches). */
function names(i: InstanceRecord, model: string): boolean {
  return i.id === model || i.served_model_name === model || i.model_path === model
}

/** retryAfterOf: the refusal's own Retry-After in seconds, if it has one. */
function retryAfterOf(err: AppError): number | null {
  for (const [k, v] of Object.entries(err.headers)) {
    if (k.toLowerCase() !== 'retry-after') continue
    const n = Number(v)
    if (Number.isFinite(n) && n >= 0) return n
  }
  return null
}
