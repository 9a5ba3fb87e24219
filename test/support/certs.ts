import { readFileSync } from 'node:fs'
import { join } from 'node:path'

/**
 * makeCert: a self-signed P-256 certificate for `san` (default 127.0.0.1) with common name `cn`,
 * written as <name>.crt and <name>.key in `dir` by openssl; their PEM texts are returned.
 */
export function makeCert(
  dir: string,
  name: string,
  cn: string,
  san = 'IP:127.0.0.1',
): { cert: string; key: string; certFile: string; keyFile: string } {
  const keyFile = join(dir, `${name}.key`)
  const certFile = join(dir, `${name}.crt`)
  const r = Bun.spawnSync([
    'openssl',
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-keyout',
    keyFile,
    '-out',
    certFile,
    '-days',
    '2',
    '-subj',
    `/CN=${cn}`,
    '-addext',
    `subjectAltName=${san}`,
  ])
  if (r.exitCode !== 0) throw new Error(`openssl failed: ${r.stderr.toString()}`)
  return { cert: readFileSync(certFile, 'utf8'), key: readFileSync(keyFile, 'utf8'), certFile, keyFile }
}
