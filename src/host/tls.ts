import { createPrivateKey, X509Certificate } from 'node:crypto'
import { readFileSync, statSync } from 'node:fs'
import { rootCertificates } from 'node:tls'
import { ConfigError } from '../config/load.ts'
import type { Logger } from './logger.ts'
import type { SelfTrust } from './plugin.ts'

/** TlsFiles: the PEM texts every listener presents (`server.tls`). */
export interface TlsFiles {
  cert: string
  key: string
}

/** How often the certificate and key files are looked at for a change (certbot, cert-manager). */
const POLL_MS = 2000

/**
 * CertFiles holds the certificate and key of `server.tls`: read and checked at start (a file that
 * cannot be read, or is not a PEM certificate / private key, or a key that is not the
 * certificate's, stops start-up naming `server.tls.cert_file` or `server.tls.key_file`), then
 * looked at every POLL_MS (size and mtime of both, by path: a renamed-over file is seen as the
 * new one). A change is read and checked the same way: a good pair goes to every subscriber (each
 * listener swaps its listening socket, see WireFront.useTls) and is logged once; a bad one is
 * logged as an error and the certificate in use stays.
 *
 * Polling rather than fs.watch: a watch on the file follows the old inode across a rename (what
 * certbot and Kubernetes secret volumes do), and a watch on the directory misses a symlink's
 * target changing; two stat calls every two seconds cost nothing.
 */
export class CertFiles {
  private current: TlsFiles
  private stamp: string
  private timer: Timer | null = null
  private readonly subscribers: ((files: TlsFiles) => void)[] = []
  /** reloads: certificates taken over since start (for tests and the log). */
  reloads = 0

  constructor(
    readonly certFile: string,
    readonly keyFile: string,
    private readonly log: Logger,
    private readonly pollMs = POLL_MS,
  ) {
    this.stamp = this.statStamp()
    const read = readPair(certFile, keyFile)
    if ('problems' in read) throw new ConfigError(read.problems)
    this.current = read.files
  }

  /** files: the certificate and key in use now. */
  get files(): TlsFiles {
    return this.current
  }

  /** subscribe: `fn` gets each new pair once it is checked. */
  subscribe(fn: (files: TlsFiles) => void): void {
    this.subscribers.push(fn)
  }

  /** watch starts looking at the files (an unref'd timer: it never keeps the process alive). */
  watch(): void {
    if (this.timer) return
    this.timer = setInterval(() => this.check(), this.pollMs)
    this.timer.unref()
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = null
  }

  /** check reads the files again when their size or mtime changed; true when a new pair was taken. */
  check(): boolean {
    const stamp = this.statStamp()
    if (stamp === this.stamp) return false
    this.stamp = stamp
    const read = readPair(this.certFile, this.keyFile)
    if ('problems' in read) {
      this.log.error('TLS certificate not reloaded: the certificate in use stays', {
        problems: read.problems.join('; '),
      })
      return false
    }
    if (read.files.cert === this.current.cert && read.files.key === this.current.key) return false
    this.current = read.files
    this.reloads++
    const x509 = new X509Certificate(read.files.cert)
    this.log.info('TLS certificate reloaded', {
      cert_file: this.certFile,
      subject: x509.subject.replace(/\n/g, ', '),
      valid_to: x509.validTo,
    })
    for (const fn of this.subscribers) {
      try {
        fn(read.files)
      } catch (err) {
        this.log.error('TLS certificate reload failed on a listener', { error: String(err) })
      }
    }
    return true
  }

  private statStamp(): string {
    const one = (path: string) => {
      try {
        const s = statSync(path)
        return `${s.size}:${s.mtimeMs}:${s.ino}`
      } catch {
        return 'missing'
      }
    }
    return `${one(this.certFile)}|${one(this.keyFile)}`
  }
}

/** readPair reads and checks both files; problems are named by their config path. */
export function readPair(certFile: string, keyFile: string): { files: TlsFiles } | { problems: string[] } {
  const problems: string[] = []
  const read = (path: string, key: string): string | null => {
    try {
      return readFileSync(path, 'utf8')
    } catch (err) {
      const code = (err as { code?: string }).code
      problems.push(
        `server.tls.${key}: cannot read ${path}${code === 'ENOENT' ? ': no such file' : `: ${(err as Error).message}`}`,
      )
      return null
    }
  }
  const cert = read(certFile, 'cert_file')
  const key = read(keyFile, 'key_file')
  let x509: X509Certificate | null = null
  if (cert !== null) {
    try {
      x509 = new X509Certificate(cert)
    } catch {
      problems.push(`server.tls.cert_file: ${certFile} is not a PEM certificate`)
    }
  }
  let privateKey: ReturnType<typeof createPrivateKey> | null = null
  if (key !== null) {
    try {
      privateKey = createPrivateKey(key)
    } catch {
      problems.push(`server.tls.key_file: ${keyFile} is not a PEM private key (unencrypted)`)
    }
  }
  if (x509 && privateKey && !x509.checkPrivateKey(privateKey))
    problems.push(`server.tls.key_file: ${keyFile} is not the key of the certificate in ${certFile}`)
  if (problems.length > 0 || cert === null || key === null) return { problems }
  return { files: { cert, key } }
}

/**
 * selfTrust: what verifies the listener on `host` that presents `cert`, with verification on.
 * A self-signed certificate is its own trust anchor; one a CA issued chains to the system's roots
 * (a private CA's root must then be in the file, after the chain). The name checked is `host` when
 * the certificate names it, else its first DNS name (a wildcard's with a label put in).
 */
export function selfTrust(cert: string, host: string): SelfTrust {
  const x509 = new X509Certificate(cert)
  const ca = x509.issuer === x509.subject ? [cert] : [cert, ...rootCertificates]
  const bare = host.replace(/^\[|\]$/g, '')
  const names = /^[\d.]+$|:/.test(bare) ? x509.checkIP(bare) : x509.checkHost(bare)
  if (names) return { ca }
  const dns = (x509.subjectAltName ?? '')
    .split(/,\s*/)
    .filter((n) => n.startsWith('DNS:'))
    .map((n) => n.slice(4))[0]
  return dns ? { ca, serverName: dns.replace(/^\*\./, 'modelgate.') } : { ca }
}
