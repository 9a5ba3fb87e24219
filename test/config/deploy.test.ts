import { describe, expect, it } from 'bun:test'
import {
  chmodSync,
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, posix, resolve } from 'node:path'
import { plugins } from '../../plugins/index.ts'
import { loadConfigFile } from '../../src/config/file.ts'
import { ConfigError, type Env } from '../../src/config/load.ts'
import { RootConfigSchema } from '../../src/config/schema.ts'
import { connectionCap } from '../../src/host/limits.ts'

/**
 * The deployment files of config/README.md "On a real GPU host": the systemd unit goes through Debian's
 * `systemd-analyze verify` (warnings count as failures: it exits 0 on an unknown key or a bad value),
 * the container recipe through a Dockerfile parser written here against the build context it
 * documents, and both against the YAML they run and the code's own defaults.
 */
const ROOT = resolve(import.meta.dir, '../..')
const UNIT = join(ROOT, 'config/modelgate.service')
const CONTAINERFILE = join(ROOT, 'config/Containerfile')
const IGNORE_FILE = join(ROOT, 'config/Containerfile.dockerignore')
const GPU_YAML = join(ROOT, 'config/gpu-host.yaml')
const SECRETS: Env = {
  ADMIN_PASSWORD: 'operator-password',
  JWT_SECRET: 'a-jwt-secret-of-at-least-thirty-two-bytes',
}

// ---- systemd unit ----

type Unit = Map<string, [string, string][]>

/** parseUnit reads a unit file into sections of key/value pairs (repeated keys kept in order). */
function parseUnit(text: string): Unit {
  const unit: Unit = new Map()
  let section = ''
  const lines = text.replace(/\\\n/g, ' ').split('\n')
  for (const raw of lines) {
    const line = raw.trim()
    if (!line || line.startsWith('#') || line.startsWith(';')) continue
    const head = /^\[(.+)\]$/.exec(line)
    if (head) {
      section = head[1]!
      if (!unit.has(section)) unit.set(section, [])
      continue
    }
    const eq = line.indexOf('=')
    if (eq <= 0 || !section) throw new Error(`not a unit line: ${line}`)
    unit.get(section)!.push([line.slice(0, eq).trim(), line.slice(eq + 1).trim()])
  }
  return unit
}

function values(unit: Unit, section: string, key: string): string[] {
  return (unit.get(section) ?? []).filter(([k]) => k === key).map(([, v]) => v)
}

function value(unit: Unit, section: string, key: string): string | undefined {
  return values(unit, section, key).at(-1)
}

/** seconds reads a systemd time span made of plain numbers and s/min/ms units (enough for this unit). */
function seconds(span: string): number {
  let total = 0
  for (const m of span.matchAll(/(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?/g)) {
    const n = Number(m[1])
    const unitName = m[2] ?? 's'
    total +=
      unitName === 'ms'
        ? n / 1000
        : unitName === 'min' || unitName === 'm'
          ? n * 60
          : unitName === 'h'
            ? n * 3600
            : n
  }
  return total
}

/** environment collects the unit's Environment= assignments (one or more KEY=VALUE per line). */
function environment(unit: Unit): Record<string, string> {
  const env: Record<string, string> = {}
  for (const v of values(unit, 'Service', 'Environment')) {
    for (const m of v.matchAll(/"([^"=]+)=([^"]*)"|(\S+?)=(\S*)/g)) env[m[1] ?? m[3]!] = m[2] ?? m[4]!
  }
  return env
}

const unitText = readFileSync(UNIT, 'utf8')
const unit = parseUnit(unitText)
const execStart = value(unit, 'Service', 'ExecStart') ?? ''
const BINARY = execStart.replace(/^[-@:+!]+/, '').split(/\s+/)[0]!
const INSTALLED_UNIT = '/etc/systemd/system/modelgate.service'

const analyze = Bun.which('systemd-analyze')
if (!analyze && !process.env.CI)
  console.warn(
    'deploy.test.ts: systemd-analyze not found (Debian package "systemd"); skipping the unit verification. ' +
      '.ci/run installs it, and with CI set its absence fails the run.',
  )

/** The host's unit directory, for the targets the unit names (network-online.target, multi-user.target). */
function systemUnitDir(): string | null {
  for (const dir of ['/usr/lib/systemd/system', '/lib/systemd/system']) {
    if (existsSync(dir) && !lstatSync(dir).isSymbolicLink()) return dir
  }
  return null
}

/**
 * verifyUnit runs `systemd-analyze verify` on `text` installed where the README installs it, in a
 * scratch root holding the host's own system units and an executable at the unit's ExecStart path
 * (a stub: this checks the unit, not the binary). The unit file itself is used unchanged.
 */
function verifyUnit(text: string, opts: { withBinary?: boolean } = {}): { code: number; output: string } {
  const root = mkdtempSync(join(tmpdir(), 'modelgate-unit-'))
  try {
    const units = systemUnitDir()
    if (units)
      cpSync(units, join(root, 'usr/lib/systemd/system'), { recursive: true, verbatimSymlinks: true })
    const installed = join(root, INSTALLED_UNIT)
    mkdirSync(dirname(installed), { recursive: true })
    writeFileSync(installed, text)
    if (opts.withBinary !== false) {
      const bin = join(root, BINARY)
      mkdirSync(dirname(bin), { recursive: true })
      writeFileSync(bin, '#!/bin/sh\nexit 0\n')
      chmodSync(bin, 0o755)
    }
    const r = Bun.spawnSync([analyze!, 'verify', `--root=${root}`, '--man=no', INSTALLED_UNIT], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', SYSTEMD_LOG_COLOR: '0', LANG: 'C' },
    })
    return { code: r.exitCode ?? -1, output: (r.stdout.toString() + r.stderr.toString()).trim() }
  } finally {
    rmSync(root, { recursive: true, force: true })
  }
}

describe('config/modelgate.service', () => {
  it.skipIf(!analyze && !process.env.CI)('passes systemd-analyze verify without a warning', () => {
    if (!analyze)
      throw new Error(
        'systemd-analyze is missing (Debian package "systemd"): .ci/run should have installed it',
      )
    expect(verifyUnit(unitText)).toEqual({ code: 0, output: '' })
  })

  it.skipIf(!analyze && !process.env.CI)(
    'the same check catches a bad value, an unknown key and a missing binary',
    () => {
      if (!analyze) throw new Error('systemd-analyze is missing (Debian package "systemd")')
      const badValue = verifyUnit(unitText.replace(/^KillMode=.*$/m, 'KillMode=sometimes'))
      expect(badValue.output).toContain('kill mode')
      const unknownKey = verifyUnit(unitText.replace('[Service]', '[Service]\nKillsMode=process'))
      expect(unknownKey.output).toContain("Unknown key 'KillsMode'")
      const noBinary = verifyUnit(unitText, { withBinary: false })
      expect(noBinary.code).not.toBe(0)
      expect(noBinary.output).toContain(BINARY)
    },
  )

  it('runs the installed binary on the installed YAML as a dedicated user', () => {
    expect(execStart).toBe('/usr/local/bin/modelgate serve --config /etc/modelgate/modelgate.yaml')
    expect(value(unit, 'Service', 'User')).toBe('modelgate')
    expect(values(unit, 'Service', 'SupplementaryGroups').join(' ')).toContain('video')
    expect(value(unit, 'Install', 'WantedBy')).toBe('multi-user.target')
  })

  it('leaves the engines to modelgate: KillMode=process, a stop timeout beyond the shutdown budget', () => {
    expect(value(unit, 'Service', 'KillMode')).toBe('process')
    expect(value(unit, 'Service', 'KillSignal') ?? 'SIGTERM').toBe('SIGTERM')
    const stopMs = seconds(value(unit, 'Service', 'TimeoutStopSec') ?? '90') * 1000
    const defaultBudget = (RootConfigSchema.properties.shutdown.properties.timeout_ms as { default: number })
      .default
    const yamlBudget = loadConfigFile(GPU_YAML, SECRETS, plugins).root.shutdown.timeout_ms
    expect(stopMs).toBeGreaterThan(defaultBudget)
    expect(stopMs).toBeGreaterThan(yamlBudget)
  })

  it('restarts after a crash but not after a configuration error (exit 2)', () => {
    expect(value(unit, 'Service', 'Restart')).toBe('on-failure')
    expect(values(unit, 'Service', 'RestartPreventExitStatus').join(' ').split(/\s+/)).toContain('2')
  })

  it('raises the open-file limit the front derives its connection cap from', () => {
    const limit = Number(value(unit, 'Service', 'LimitNOFILE')?.split(':').at(-1))
    expect(Number.isInteger(limit)).toBe(true)
    expect(connectionCap(limit)).toBeGreaterThanOrEqual(10_000)
  })

  it('uses no setting that hides the GPUs, breaks JITs or deletes what running engines use', () => {
    const off = (v: string | undefined) => v === undefined || /^(no|false|off|0)$/i.test(v)
    for (const key of [
      'PrivateDevices',
      'ProtectClock',
      'MemoryDenyWriteExecute',
      'PrivateTmp',
      'DynamicUser',
      'RemoveIPC',
    ])
      expect({ key, value: off(value(unit, 'Service', key)) }).toEqual({ key, value: true })
    expect(value(unit, 'Service', 'DevicePolicy') ?? 'auto').toBe('auto')
    expect(values(unit, 'Service', 'DeviceAllow')).toEqual([])
  })

  it('can write data_dir, HF_HOME and the caches under ProtectSystem=strict', () => {
    expect(value(unit, 'Service', 'ProtectSystem')).toBe('strict')
    const writable = [
      ...values(unit, 'Service', 'StateDirectory').flatMap((v) => v.split(/\s+/).map((d) => `/var/lib/${d}`)),
      ...values(unit, 'Service', 'CacheDirectory').flatMap((v) =>
        v.split(/\s+/).map((d) => `/var/cache/${d}`),
      ),
      ...values(unit, 'Service', 'ReadWritePaths').flatMap((v) =>
        v.split(/\s+/).map((d) => d.replace(/^-/, '')),
      ),
      '/dev/shm', // ProtectSystem=strict leaves /dev alone
    ]
    const canWrite = (path: string) => writable.some((w) => path === w || path.startsWith(`${w}/`))
    const env = environment(unit)
    const dataDir = loadConfigFile(GPU_YAML, { ...SECRETS, ...env }, plugins).root.data_dir
    const paths = {
      data_dir: dataDir,
      WorkingDirectory: value(unit, 'Service', 'WorkingDirectory'),
      HF_HOME: env.HF_HOME,
      HOME: env.HOME,
      XDG_CACHE_HOME: env.XDG_CACHE_HOME,
      tmp: '/tmp',
    }
    for (const [name, path] of Object.entries(paths)) {
      expect({ name, path, writable: path !== undefined && canWrite(path) }).toEqual({
        name,
        path,
        writable: true,
      })
    }
  })
})

// ---- gpu-host.yaml ----

describe('config/gpu-host.yaml', () => {
  it('is a valid configuration of this build, with vLLM from its virtualenv', () => {
    const { root, plugins: cfg } = loadConfigFile(GPU_YAML, SECRETS, plugins)
    const gateway = cfg.get('gateway') as { engine: { command: string[]; host: string } }
    expect(gateway.engine.command).toEqual(['/opt/vllm/bin/vllm', 'serve'])
    expect(gateway.engine.host).toBe('127.0.0.1')
    expect(root.server.host).toBe('127.0.0.1')
    expect(root.auth.mode).toBe('simple')
    expect(root.data_dir).toBe('/var/lib/modelgate')
  })

  it('refuses to start without the admin secrets instead of running open', () => {
    let problems: string[] = []
    try {
      loadConfigFile(GPU_YAML, {}, plugins)
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err
      problems = err.problems
    }
    expect(problems.join('\n')).toContain('admin_password')
    expect(problems.join('\n')).toContain('jwt_secret')
  })
})

// ---- Containerfile ----

const INSTRUCTIONS = new Set([
  'ADD',
  'ARG',
  'CMD',
  'COPY',
  'ENTRYPOINT',
  'ENV',
  'EXPOSE',
  'FROM',
  'HEALTHCHECK',
  'LABEL',
  'MAINTAINER',
  'ONBUILD',
  'RUN',
  'SHELL',
  'STOPSIGNAL',
  'USER',
  'VOLUME',
  'WORKDIR',
])

interface Instruction {
  name: string
  args: string
  line: number
}

/**
 * parseDockerfile splits a Dockerfile into instructions the way BuildKit's parser does for the
 * subset used here: parser directives only at the top, `#` comment lines (also inside a
 * continuation, as are empty lines), `\` at the end of a line continuing it, every instruction
 * with arguments. Heredocs are refused.
 */
function parseDockerfile(text: string): Instruction[] {
  const lines = text.split('\n')
  const out: Instruction[] = []
  let i = 0
  while (i < lines.length && /^#\s*(syntax|escape|check)\s*=/i.test(lines[i]!)) {
    if (/^#\s*escape\s*=/i.test(lines[i]!))
      throw new Error('an escape directive is not supported by this check')
    i++
  }
  for (; i < lines.length; i++) {
    const first = lines[i]!
    if (!first.trim() || first.trim().startsWith('#')) continue
    const start = i + 1
    let body = first
    while (/\\\s*$/.test(body)) {
      body = body.replace(/\\\s*$/, '')
      i++
      // Comment and empty lines inside a continuation are skipped; the end of the file ends it.
      while (i < lines.length && (!lines[i]!.trim() || lines[i]!.trim().startsWith('#'))) i++
      if (i >= lines.length) break
      body += lines[i]!
    }
    const m = /^\s*([A-Za-z]+)(?:\s+(.*))?$/.exec(body)
    if (!m) throw new Error(`line ${start}: not an instruction: ${body}`)
    const name = m[1]!.toUpperCase()
    if (/<<-?["']?[A-Za-z]/.test(m[2] ?? ''))
      throw new Error(`line ${start}: heredocs are not supported by this check`)
    const args = (m[2] ?? '').trim()
    if (!args) throw new Error(`line ${start}: ${name} has no arguments`)
    out.push({ name, args, line: start })
  }
  return out
}

/** execForm parses a JSON-array (exec form) argument; null for shell form. */
function execForm(args: string): string[] | null {
  if (!args.startsWith('[')) return null
  const parsed = JSON.parse(args) as unknown
  if (!Array.isArray(parsed) || !parsed.every((a) => typeof a === 'string'))
    throw new Error(`not a string array: ${args}`)
  return parsed
}

/** words splits a shell-form argument on blanks, honouring double and single quotes. */
function words(args: string): string[] {
  return [...args.matchAll(/"((?:[^"\\]|\\.)*)"|'([^']*)'|(\S+)/g)].map((m) => m[1] ?? m[2] ?? m[3]!)
}

/** substitute expands ${VAR}, ${VAR:-default} and $VAR from `vars`, as Dockerfile instructions do. */
function substitute(s: string, vars: Record<string, string>): string {
  return s.replace(/\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)/g, (_m, a, def, b) => vars[a ?? b] ?? def ?? '')
}

/** envPairs reads `ENV k=v k2="v 2"` (and the legacy `ENV k v`). */
function envPairs(args: string): [string, string][] {
  if (!/^\w+=/.test(args)) {
    const [k, ...rest] = args.split(/\s+/)
    return [[k!, rest.join(' ')]]
  }
  return words(args).map((w) => {
    const eq = w.indexOf('=')
    return [w.slice(0, eq), w.slice(eq + 1)]
  })
}

/** ignored tells whether a context path is left out by a .dockerignore (last matching pattern wins). */
function ignored(path: string, patterns: string[]): boolean {
  const toRegex = (p: string) =>
    new RegExp(
      `^${p
        .replace(/[.+^$()|{}[\]]/g, '\\$&')
        .replace(/\*\*\/?/g, '\u0000')
        .replace(/\*/g, '[^/]*')
        .replace(/\?/g, '[^/]')
        .replace(/\u0000/g, '.*')}(/.*)?$`,
    )
  let out = false
  for (const raw of patterns) {
    const negate = raw.startsWith('!')
    const p = posix.normalize((negate ? raw.slice(1) : raw).replace(/^\/+/, ''))
    if (toRegex(p).test(path)) out = !negate
  }
  return out
}

interface Stage {
  base: string
  name: string | null
  instructions: Instruction[]
}

const recipe = parseDockerfile(readFileSync(CONTAINERFILE, 'utf8'))
const ignorePatterns = readFileSync(IGNORE_FILE, 'utf8')
  .split('\n')
  .map((l) => l.trim())
  .filter((l) => l && !l.startsWith('#'))

function stages(): { globalArgs: Record<string, string>; stages: Stage[] } {
  const globalArgs: Record<string, string> = {}
  const out: Stage[] = []
  for (const ins of recipe) {
    if (ins.name === 'FROM') {
      const [image = '', as, name] = words(ins.args).filter((w) => !w.startsWith('--platform'))
      if (as !== undefined && as.toUpperCase() !== 'AS')
        throw new Error(`line ${ins.line}: FROM image [AS name]`)
      out.push({ base: substitute(image, globalArgs), name: name ?? null, instructions: [] })
    } else if (out.length === 0) {
      const eq = ins.args.indexOf('=')
      if (eq > 0) globalArgs[ins.args.slice(0, eq)] = ins.args.slice(eq + 1)
    } else {
      out.at(-1)!.instructions.push(ins)
    }
  }
  return { globalArgs, stages: out }
}

describe('config/Containerfile', () => {
  const { stages: all } = stages()
  const final = all.at(-1)!
  const finalOf = (name: string) => final.instructions.filter((i) => i.name === name)
  const finalEnv = Object.fromEntries(finalOf('ENV').flatMap((i) => envPairs(i.args)))

  it('parses: known instructions only, ARGs then FROM first', () => {
    expect(recipe.length).toBeGreaterThan(0)
    for (const ins of recipe)
      expect({ line: ins.line, known: INSTRUCTIONS.has(ins.name) }).toEqual({ line: ins.line, known: true })
    const firstOther = recipe.find((i) => i.name !== 'ARG')
    expect(firstOther?.name).toBe('FROM')
  })

  it('runs on a vLLM image and builds the binary the way build/compile.ts writes it', () => {
    expect(final.base).toMatch(/^vllm\/vllm-openai:v\d+\.\d+\.\d+$/)
    const build = all.find((s) => s.name === 'build')!
    expect(build).toBeDefined()
    const workdir = build.instructions.find((i) => i.name === 'WORKDIR')!.args
    const run = build.instructions.filter((i) => i.name === 'RUN').map((i) => i.args)
    expect(run.some((r) => r.includes('npm ci'))).toBe(true)
    expect(run.some((r) => r.includes('npm run build'))).toBe(true)
    expect(readFileSync(join(ROOT, 'build/compile.ts'), 'utf8')).toContain(
      "join(root, 'build', 'dist', 'modelgate')",
    )
    const fromBuild = finalOf('COPY')
      .map((i) => words(i.args))
      .find((w) => w[0] === '--from=build')!
    expect(fromBuild[1]).toBe(posix.join(workdir, 'build/dist/modelgate'))
  })

  it("the build stage's files are enough to compile a binary that accepts the image's YAML", () => {
    // The build stage replayed in a scratch directory: its COPYs from this checkout, the repository's
    // node_modules standing in for `npm ci` (no registry here), then build/compile.ts.
    const build = all.find((s) => s.name === 'build')!
    const workdir = build.instructions.find((i) => i.name === 'WORKDIR')!.args
    const dir = mkdtempSync(join(tmpdir(), 'modelgate-image-'))
    try {
      for (const ins of build.instructions.filter((i) => i.name === 'COPY')) {
        const paths = words(ins.args).filter((w) => !w.startsWith('--'))
        const dest = paths.at(-1)!
        for (const src of paths.slice(0, -1)) {
          const target = dest.endsWith('/') || paths.length > 2 ? posix.join(dest, posix.basename(src)) : dest
          cpSync(join(ROOT, src), join(dir, posix.relative(workdir, posix.resolve(workdir, target))), {
            recursive: true,
          })
        }
      }
      symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'))
      const compiled = Bun.spawnSync([process.execPath, 'build/compile.ts'], { cwd: dir })
      expect({ code: compiled.exitCode, stderr: compiled.stderr.toString() }).toEqual({ code: 0, stderr: '' })
      const yamlCopy = finalOf('COPY')
        .map((i) => words(i.args))
        .find((w) => w[0] === 'config/gpu-host.yaml')!
      const check = Bun.spawnSync(
        [join(dir, 'build/dist/modelgate'), 'check-config', '--config', join(ROOT, yamlCopy[0]!)],
        { env: { PATH: process.env.PATH ?? '', ...finalEnv, ...SECRETS } as Record<string, string> },
      )
      expect({ code: check.exitCode, out: check.stdout.toString() + check.stderr.toString() }).toEqual({
        code: 0,
        out: `${join(ROOT, yamlCopy[0]!)}: ok\n`,
      })
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 60_000)

  it('copies only what exists in the documented build context (the repository root) and is not ignored', () => {
    const stageNames = new Set(all.map((s) => s.name).filter(Boolean))
    for (const ins of recipe.filter((i) => i.name === 'COPY' || i.name === 'ADD')) {
      const parts = execForm(ins.args) ?? words(ins.args)
      const flags = parts.filter((p) => p.startsWith('--'))
      const paths = parts.filter((p) => !p.startsWith('--'))
      expect(paths.length).toBeGreaterThanOrEqual(2)
      const from = flags.find((f) => f.startsWith('--from='))?.slice('--from='.length)
      if (from) {
        expect(stageNames.has(from)).toBe(true)
        continue
      }
      for (const src of paths.slice(0, -1)) {
        const rel = posix.normalize(src)
        expect({ src, exists: existsSync(join(ROOT, rel)), ignored: ignored(rel, ignorePatterns) }).toEqual({
          src,
          exists: true,
          ignored: false,
        })
      }
    }
    // What the ignore file leaves out is what a build does not need.
    expect(ignored('node_modules/elysia/package.json', ignorePatterns)).toBe(true)
    expect(ignored('data/modelgate.db', ignorePatterns)).toBe(true)
    expect(ignored('src/main.ts', ignorePatterns)).toBe(false)
  })

  it('starts the copied binary in exec form on the copied YAML, as a non-root user', () => {
    const entrypoint = execForm(finalOf('ENTRYPOINT').at(-1)!.args)
    const cmd = execForm(finalOf('CMD').at(-1)!.args)
    expect(entrypoint).not.toBeNull()
    expect(cmd).not.toBeNull()
    const destinations = finalOf('COPY').map((i) => words(i.args).at(-1))
    expect(destinations).toContain(entrypoint![0])
    const argv = [...entrypoint!, ...cmd!]
    const config = argv[argv.indexOf('--config') + 1]
    expect(argv[1]).toBe('serve')
    expect(destinations).toContain(config)
    expect(finalEnv.MODELGATE_CONFIG).toBe(config)
    const copiedYaml = finalOf('COPY')
      .map((i) => words(i.args))
      .find((w) => w.at(-1) === config)!
    expect(copiedYaml[0]).toBe('config/gpu-host.yaml')
    const user = finalOf('USER').at(-1)?.args
    expect(user).toBeDefined()
    expect(['root', '0']).not.toContain(user!.split(':')[0])
  })

  it("exposes the ports its YAML listens on, on every address, with the image's vLLM", () => {
    const vars = { ...finalEnv, ...SECRETS }
    const { root, plugins: cfg } = loadConfigFile(GPU_YAML, vars, plugins)
    const router = cfg.get('router') as { host: string; port: number }
    const gateway = cfg.get('gateway') as { engine: { command: string[]; host: string } }
    const exposed = finalOf('EXPOSE').flatMap((i) => words(i.args).map((p) => Number(p.split('/')[0])))
    expect(exposed.sort((a, b) => a - b)).toEqual([root.server.port, router.port].sort((a, b) => a - b))
    expect(root.server.host).toBe('0.0.0.0')
    expect(router.host).toBe('0.0.0.0')
    expect(gateway.engine.command).toEqual(['vllm', 'serve'])
    expect(gateway.engine.host).toBe('127.0.0.1')
    expect(finalEnv.HOME).toBe(root.data_dir)
    expect(finalOf('STOPSIGNAL').at(-1)?.args ?? 'SIGTERM').toBe('SIGTERM')
  })

  it('the parser check itself refuses what a builder would', () => {
    expect(() => parseDockerfile('FORM ubuntu\n')).not.toThrow() // parsing is lexical; the known-instruction check catches it
    expect(parseDockerfile('FORM ubuntu\n').every((i) => INSTRUCTIONS.has(i.name))).toBe(false)
    expect(() => parseDockerfile('FROM\n')).toThrow('no arguments')
    expect(parseDockerfile('FROM a\nRUN x \\\n')).toEqual([
      { name: 'FROM', args: 'a', line: 1 },
      { name: 'RUN', args: 'x', line: 2 },
    ])
    expect(() => execForm('["/bin/x", 1]')).toThrow()
    expect(() => execForm("['/bin/x']")).toThrow()
    expect(execForm('/bin/x serve')).toBeNull()
    expect(parseDockerfile('FROM a\nRUN a \\\n  # note\n  b\n')).toEqual([
      { name: 'FROM', args: 'a', line: 1 },
      { name: 'RUN', args: 'a   b', line: 2 },
    ])
  })
})
