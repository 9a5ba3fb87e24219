import { afterEach, describe, expect, it } from 'bun:test'
import { Type as T } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { orderPlugins } from '../../src/host/registry.ts'
import { startHost, type TestHost } from '../support/host.ts'

const Empty = T.Object({}, { additionalProperties: false })

function recorder() {
  const events: string[] = []
  const make = (id: string, dependsOn: string[] = [], failSetup = false): PluginDefinition =>
    definePlugin({
      id,
      description: id,
      dependsOn,
      config: Empty,
      setup(ctx) {
        events.push(`setup ${id}`)
        if (failSetup) throw new Error(`${id} setup failed`)
        for (const d of dependsOn) ctx.api<{ id: string }>(d)
        return {
          api: { id },
          routes: new Elysia().get(`/api/${id}/ping`, () => ({ id })),
          start: () => {
            events.push(`start ${id}`)
          },
          stop: () => {
            events.push(`stop ${id}`)
          },
        }
      },
    }) as unknown as PluginDefinition
  return { events, make }
}

describe('plugin registry', () => {
  let th: TestHost | undefined
  afterEach(async () => {
    await th?.stop()
    th = undefined
  })

  it('orders plugins after their dependencies, stable otherwise', () => {
    const { make } = recorder()
    const defs = [make('c', ['b']), make('a'), make('b', ['a'])]
    expect(orderPlugins(defs, new Set(['a', 'b', 'c'])).map((d) => d.id)).toEqual(['a', 'b', 'c'])
    expect(orderPlugins(defs, new Set(['a'])).map((d) => d.id)).toEqual(['a'])
  })

  it('refuses a missing dependency and a cycle', () => {
    const { make } = recorder()
    expect(() => orderPlugins([make('b', ['a'])], new Set(['b']))).toThrow("requires plugin 'a'")
    expect(() => orderPlugins([make('x', ['y']), make('y', ['x'])], new Set(['x', 'y']))).toThrow(
      'dependency cycle',
    )
  })

  it('sets up and starts in dependency order, stops in reverse, and mounts routes', async () => {
    const { events, make } = recorder()
    th = await startHost('plugins:\n  b: {}\n  a: {}\n', [make('b', ['a']), make('a')])
    expect(events).toEqual(['setup a', 'setup b', 'start a', 'start b'])
    const res = await fetch(`${th.url}/api/b/ping`)
    expect(await res.json()).toEqual({ id: 'b' })
    await th.host.shutdown('test')
    expect(events.slice(4)).toEqual(['stop b', 'stop a'])
  })

  it('stops the plugins already set up when a later setup fails', async () => {
    const { events, make } = recorder()
    await expect(
      startHost('plugins:\n  a: {}\n  b: {}\n', [make('a'), make('b', ['a'], true)]),
    ).rejects.toThrow('b setup failed')
    expect(events).toEqual(['setup a', 'setup b', 'stop a'])
  })

  it('refuses api access to a plugin not declared in dependsOn', async () => {
    const sneaky = definePlugin({
      id: 'sneaky',
      description: 's',
      config: Empty,
      setup(ctx) {
        ctx.api('a')
        return {}
      },
    }) as unknown as PluginDefinition
    const { make } = recorder()
    await expect(startHost('plugins:\n  a: {}\n  sneaky: {}\n', [make('a'), sneaky])).rejects.toThrow(
      "must list 'a' in dependsOn",
    )
  })
})
