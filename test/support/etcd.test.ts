import { describe, expect, it, setDefaultTimeout } from 'bun:test'
import { resolve } from 'node:path'

/**
 * etcdAvailable in a fresh process with ETCD_BIN / ETCDCTL_BIN pointed at files that are or are
 * not there: a test needs etcdctl only when it uses it, and a missing part is named with its package.
 */
const ROOT = resolve(import.meta.dir, '../..')
const THERE = process.execPath
const NOT_THERE = '/nonexistent/etcd-part'
// Each case starts bun: a slow shared machine needs more than bun's 5 s.
setDefaultTimeout(30_000)

function check(need: string, env: Record<string, string>) {
  const code = `import { etcdAvailable } from './test/support/etcd.ts'; console.log(etcdAvailable(${need}))`
  const r = Bun.spawnSync([process.execPath, '-e', code], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', ...env },
    timeout: 20_000,
  })
  return { code: r.exitCode, out: r.stdout.toString().trim(), err: r.stderr.toString() }
}

describe('etcdAvailable', () => {
  it('runs a test that needs only the server when etcdctl is missing', () => {
    const r = check('', { ETCD_BIN: THERE, ETCDCTL_BIN: NOT_THERE })
    expect(r).toMatchObject({ code: 0, out: 'true' })
  })

  it('skips a test that uses etcdctl, naming etcdctl and its package, not the server', () => {
    const r = check('{ etcdctl: true }', { ETCD_BIN: THERE, ETCDCTL_BIN: NOT_THERE })
    expect(r).toMatchObject({ code: 0, out: 'false' })
    expect(r.err).toContain(`etcdctl is missing (${NOT_THERE}: Debian package "etcd-client")`)
    expect(r.err).not.toContain('etcd-server')
  })

  it('names the server and its package when etcd is missing', () => {
    const r = check('', { ETCD_BIN: NOT_THERE, ETCDCTL_BIN: THERE })
    expect(r.out).toBe('false')
    expect(r.err).toContain(`etcd is missing (${NOT_THERE}: Debian package "etcd-server")`)
  })

  it('fails instead of skipping with CI set', () => {
    const r = check('{ etcdctl: true }', { CI: '1', ETCD_BIN: THERE, ETCDCTL_BIN: NOT_THERE })
    expect(r.code).not.toBe(0)
    expect(r.err).toContain('etcdctl is missing')
    expect(r.err).toContain('with CI set, tests that need it fail instead of skipping')
  })
})
