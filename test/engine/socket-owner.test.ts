import { afterEach, describe, expect, it } from 'bun:test'
import { readFileSync } from 'node:fs'
import { portOwners } from '../../src/engine/socket-owner.ts'
import { freePortRange } from '../support/ports.ts'

/** portOwners against real listening sockets of this process and of a process group of its own. */
const cleanups: (() => unknown)[] = []
afterEach(() => {
  for (const f of cleanups.splice(0).reverse()) f()
})

/** ownGroup: this test process's process group (field 5 of /proc/self/stat). */
function ownGroup(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8')
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2])
}

function listen(hostname: string, port: number): void {
  const l = Bun.listen({ hostname, port, socket: { data() {} } })
  cleanups.push(() => l.stop(true))
}

/** otherGroup: a process in a process group of its own, as an engine is. */
function otherGroup(): number {
  const child = Bun.spawn(['sleep', '60'], { detached: true, stdin: 'ignore', stdout: 'ignore' })
  cleanups.push(() => child.kill('SIGKILL'))
  return child.pid
}

describe('port owners', () => {
  it("sorts a port's listeners into the group's own and anyone else's, with pid and command", async () => {
    const port = freePortRange(1)
    listen('127.0.0.1', port)
    const mine = await portOwners(port, '127.0.0.1', ownGroup())
    expect(mine).toEqual({
      ours: [
        {
          address: `127.0.0.1:${port}`,
          inode: expect.any(Number),
          pid: process.pid,
          command: expect.any(String),
        },
      ],
      others: [],
    })
    const theirs = (await portOwners(port, '127.0.0.1', otherGroup()))!
    expect(theirs.ours).toEqual([])
    expect(theirs.others).toMatchObject([{ address: `127.0.0.1:${port}`, pid: process.pid }])
    expect(theirs.others[0]!.command).toContain(process.argv0.split('/').at(-1)!)
  })

  it("counts only listeners that take connections for the engine's address", async () => {
    const p = freePortRange(4)
    const addresses = async (port: number, host: string) =>
      (await portOwners(port, host, ownGroup()))!.ours.map((l) => l.address)
    listen('127.0.0.2', p)
    listen('::1', p)
    expect(await portOwners(p, '127.0.0.1', ownGroup())).toEqual({ ours: [], others: [] })
    expect(await addresses(p, '::1')).toEqual([`[::1]:${p}`])
    listen('0.0.0.0', p + 1)
    expect(await addresses(p + 1, '127.0.0.1')).toEqual([`0.0.0.0:${p + 1}`])
    listen('::', p + 2)
    expect(await addresses(p + 2, '0.0.0.0')).toEqual([`[::]:${p + 2}`])
    expect(await portOwners(p + 3, '127.0.0.1', ownGroup())).toEqual({ ours: [], others: [] })
  })
})
