import { describe, expect, it } from 'bun:test'
import {
  type Change,
  type InstanceState,
  isTransition,
  Lifecycle,
  type Operation,
  STATES,
} from '../../plugins/gateway/lifecycle.ts'
import { WaitError } from '../../src/host/abortable.ts'
import { AppError } from '../../src/http/errors.ts'

/** The instance lifecycle's table (plugins/gateway/lifecycle.ts), every pair of states, and its waits. */
const LEGAL: [InstanceState, InstanceState][] = [
  ['starting', 'active'],
  ['starting', 'failed'],
  ['starting', 'stopping'],
  ['active', 'sleeping'],
  ['active', 'failed'],
  ['active', 'stopping'],
  ['sleeping', 'active'],
  ['sleeping', 'failed'],
  ['sleeping', 'stopping'],
  ['failed', 'stopping'],
  ['stopping', 'removed'],
]
const legal = new Set(LEGAL.map(([a, b]) => `${a}>${b}`))

function refusal(fn: () => unknown): AppError {
  try {
    fn()
  } catch (err) {
    if (err instanceof AppError) return err
    throw err
  }
  throw new Error('expected a refusal, got none')
}

function recorded(initial: InstanceState, opts: { routing?: boolean; operation?: Operation } = {}) {
  const changes: Change[] = []
  const l = new Lifecycle('m-1', initial, opts, (c) => changes.push(c))
  return { l, changes }
}

describe('instance lifecycle: the transition table', () => {
  for (const from of STATES) {
    for (const to of STATES) {
      if (legal.has(`${from}>${to}`)) {
        it(`${from} → ${to} is allowed and reported once`, () => {
          const { l, changes } = recorded(from)
          expect(l.to(to, 'why')).toBe(from)
          expect(l.state).toBe(to)
          expect(changes).toEqual([{ kind: 'state', previous: from, current: to, message: 'why' }])
        })
      } else {
        it(`${from} → ${to} is refused with 409 INVALID_STATE and changes nothing`, () => {
          const { l, changes } = recorded(from)
          const err = refusal(() => l.to(to, 'why'))
          expect(err.status).toBe(409)
          expect(err.code).toBe('INVALID_STATE')
          expect(err.message).toBe(`Instance m-1 is ${from}; it cannot become ${to}`)
          expect(l.state).toBe(from)
          expect(changes).toEqual([])
        })
      }
    }
  }

  it('the table the tests check is the table the code uses', () => {
    for (const from of STATES)
      for (const to of STATES) expect(isTransition(from, to)).toBe(legal.has(`${from}>${to}`))
  })
})

describe('instance lifecycle: operations and routing', () => {
  const BEGIN: Record<Operation, InstanceState[]> = {
    sleep: ['active'],
    wake: ['sleeping'],
    move: ['starting', 'active', 'sleeping'],
  }
  for (const op of Object.keys(BEGIN) as Operation[]) {
    for (const state of STATES) {
      if (BEGIN[op].includes(state)) continue
      it(`${op} cannot begin while ${state} (409 INVALID_STATE)`, () => {
        const { l, changes } = recorded(state)
        const err = refusal(() => l.begin(op))
        expect([err.status, err.code]).toEqual([409, 'INVALID_STATE'])
        expect(l.operation).toBeNull()
        expect(changes).toEqual([])
      })
    }
  }

  it('one operation at a time: a second one is 409 OPERATION_IN_PROGRESS naming the first', () => {
    const { l } = recorded('active')
    l.begin('sleep')
    for (const op of ['sleep', 'move'] as Operation[]) {
      const err = refusal(() => l.begin(op))
      expect([err.status, err.code, err.message]).toEqual([
        409,
        'OPERATION_IN_PROGRESS',
        'Instance m-1 is busy (sleep in progress)',
      ])
    }
    l.end('sleep')
    l.begin('move')
    expect(l.operation).toBe('move')
  })

  it('ending an operation that is not running is a bug, refused with 500', () => {
    const { l } = recorded('active')
    expect(refusal(() => l.end('wake')).status).toBe(500)
    l.begin('move')
    expect(refusal(() => l.end('sleep')).status).toBe(500)
    expect(l.operation).toBe('move')
  })

  it('takes new requests only when active, routed to, and not going to sleep', () => {
    const { l } = recorded('starting')
    expect(l.takesRequests).toBe(false)
    l.to('active', 'ready')
    expect(l.takesRequests).toBe(true)
    l.begin('sleep')
    expect(l.takesRequests).toBe(false)
    l.end('sleep')
    l.route(false)
    expect(l.takesRequests).toBe(false)
    l.route(true)
    l.to('sleeping', 'slept')
    expect(l.takesRequests).toBe(false)
    l.to('active', 'woke')
    expect(l.takesRequests).toBe(true)
    l.to('failed', 'died')
    expect(l.routing).toBe(false)
  })

  it('a move target starts unrouted with its move running', () => {
    const { l } = recorded('starting', { routing: false, operation: 'move' })
    expect([l.routing, l.operation]).toEqual([false, 'move'])
    l.to('active', 'ready')
    expect(l.takesRequests).toBe(false)
    l.route(true)
    expect(l.takesRequests).toBe(true)
  })

  it('routing cannot be turned on for an instance that cannot serve', () => {
    for (const state of ['starting', 'failed', 'stopping', 'removed'] as InstanceState[]) {
      const { l } = recorded(state, { routing: false })
      expect(refusal(() => l.route(true)).code).toBe('INVALID_STATE')
      expect(l.routing).toBe(false)
    }
  })
})

describe('instance lifecycle: waiting on it', () => {
  it('waitUntil resolves on the change itself, and at once when it already holds', async () => {
    const { l } = recorded('starting')
    await l.waitUntil((x) => x.state === 'starting')
    let done = false
    const ready = l
      .waitUntil((x) => x.state === 'active')
      .then(() => {
        done = true
      })
    await Promise.resolve()
    expect(done).toBe(false)
    l.to('active', 'ready')
    await ready
    expect(done).toBe(true)
  })

  it('waitUntil rejects when the instance is removed without the condition holding', async () => {
    const { l } = recorded('active')
    const waiting = l.waitUntil((x) => x.state === 'sleeping', { what: 'sleep of m-1' })
    l.to('stopping', 'unload')
    l.to('removed', 'gone')
    const err = (await waiting.catch((e: unknown) => e)) as AppError
    expect([err.status, err.code]).toEqual([409, 'INVALID_STATE'])
    expect(err.message).toBe('Instance m-1 was removed while waiting for sleep of m-1')
    await expect(l.waitUntil((x) => x.state === 'active')).rejects.toThrow('was removed')
  })

  it('waitUntil ends on its signal and on its deadline with a WaitError naming what it waited for', async () => {
    const { l } = recorded('starting')
    const ac = new AbortController()
    const aborted = l.waitUntil((x) => x.state === 'active', { signal: ac.signal, what: 'the target' })
    ac.abort()
    const a = (await aborted.catch((e: unknown) => e)) as WaitError
    expect([a instanceof WaitError, a.kind, a.message]).toEqual([true, 'aborted', 'the target was aborted'])
    const late = (await l
      .waitUntil((x) => x.state === 'active', { timeoutMs: 5, what: 'the target' })
      .catch((e: unknown) => e)) as WaitError
    expect([late.kind, late.message]).toEqual(['timeout', 'the target did not finish within 5 ms'])
  })

  it('drained resolves when the last in-flight request is released', async () => {
    const { l } = recorded('active')
    l.acquire()
    l.acquire()
    let drained = false
    const waiting = l.drained().then(() => {
      drained = true
    })
    l.release()
    await Promise.resolve()
    expect([l.inFlight, drained]).toEqual([1, false])
    l.release()
    await waiting
    expect([l.inFlight, drained]).toEqual([0, true])
    await l.drained()
  })
})
