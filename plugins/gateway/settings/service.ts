import { randomBytes } from 'node:crypto'
import {
  chmodSync,
  closeSync,
  fsyncSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeSync,
} from 'node:fs'
import { join } from 'node:path'
import type { Logger } from '../../../src/host/logger.ts'
import { badRequest } from '../../../src/http/errors.ts'
import { HF_TOKEN_MASK } from './schemas.ts'

/**
 * SettingsStore keeps the gateway's runtime settings (today: the model-hub token engines receive as
 * `HF_TOKEN`) in `data_dir/settings.json`, mode 0600: only the service's user can read it, and the
 * secret stays out of the SQLite file (backups, exports). Writes are atomic (a 0600 temp file, fsync,
 * rename), so a crash leaves the old or the new settings, never half of them.
 *
 * The token is never logged, never in a response to admin-readonly (view), never on an engine's
 * command line: launch.ts puts it in the engine's environment only (engineEnv), which no route shows.
 */
export const SETTINGS_FILE = 'settings.json'

export interface StoredSettings {
  hf_token: string | null
  updated_at: string | null
}

export interface SettingsView {
  hf_token: string | null
  hf_token_set: boolean
  hf_token_masked: boolean
  updated_at: string | null
}

export class SettingsStore {
  readonly path: string
  private current: StoredSettings = { hf_token: null, updated_at: null }

  constructor(
    dataDir: string,
    private readonly log: Logger,
  ) {
    this.path = join(dataDir, SETTINGS_FILE)
    this.load()
  }

  /** engineEnv: what a newly started engine gets from the settings (nothing when no token is set). */
  engineEnv(): Record<string, string> {
    return this.current.hf_token ? { HF_TOKEN: this.current.hf_token } : {}
  }

  /** view: the settings as `admin` (real) or `admin-readonly` (masked) may see them. */
  view(reveal: boolean): SettingsView {
    const token = this.current.hf_token
    return {
      hf_token: token === null ? null : reveal ? token : HF_TOKEN_MASK,
      hf_token_set: token !== null,
      hf_token_masked: token !== null && !reveal,
      updated_at: this.current.updated_at,
    }
  }

  /** setHfToken stores a new token (null or "" removes it); engines started from now on get it. */
  setHfToken(token: string | null, by: string): void {
    const value = token === null || token === '' ? null : token
    if (value === HF_TOKEN_MASK)
      throw badRequest('body.hf_token: that is the masked placeholder, not a token; send the token itself')
    const next: StoredSettings = { hf_token: value, updated_at: new Date().toISOString() }
    this.write(next)
    this.current = next
    // Whether it is set and by whom: never the value.
    this.log.info(value === null ? 'model-hub token removed' : 'model-hub token set', { by })
  }

  private load(): void {
    let text: string
    try {
      const st = statSync(this.path)
      if ((st.mode & 0o077) !== 0) {
        chmodSync(this.path, 0o600)
        this.log.warn(`${this.path} was readable by others; its mode is now 0600`, {
          was: (st.mode & 0o777).toString(8),
        })
      }
      text = readFileSync(this.path, 'utf8')
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return
      this.log.error(`settings could not be read from ${this.path}; starting without them`, {
        error: (err as NodeJS.ErrnoException).code ?? 'unknown',
      })
      return
    }
    const parsed = parseSettings(text)
    if (!parsed) {
      // The parser's message would quote the file (the token): say only that it is unusable.
      this.log.error(`settings file ${this.path} is not valid; starting without a model-hub token`)
      return
    }
    this.current = parsed
  }

  private write(next: StoredSettings): void {
    const tmp = `${this.path}.${randomBytes(6).toString('hex')}.tmp`
    // 'wx' with 0600: a new file only this user can read, whatever the umask adds.
    const fd = openSync(tmp, 'wx', 0o600)
    try {
      writeSync(fd, `${JSON.stringify({ version: 1, ...next }, null, 2)}\n`)
      fsyncSync(fd)
    } catch (err) {
      closeSync(fd)
      rmSync(tmp, { force: true })
      throw err
    }
    closeSync(fd)
    renameSync(tmp, this.path)
  }
}

function parseSettings(text: string): StoredSettings | null {
  let raw: unknown
  try {
    raw = JSON.parse(text)
  } catch {
    return null
  }
  if (typeof raw !== 'object' || raw === null) return null
  const o = raw as Record<string, unknown>
  const token = o.hf_token
  if (token !== null && token !== undefined && (typeof token !== 'string' || !/^[\x21-\x7E]+$/.test(token)))
    return null
  return {
    hf_token: typeof token === 'string' ? token : null,
    updated_at: typeof o.updated_at === 'string' ? o.updated_at : null,
  }
}
