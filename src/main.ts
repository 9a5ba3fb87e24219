#!/usr/bin/env bun
import { resolve } from 'node:path'
import demoYaml from '../config/demo.yaml' with { type: 'text' }
import pkg from '../package.json' with { type: 'json' }
import { plugins } from '../plugins/index.ts'
import { knownPlugins, loadConfigFile } from './config/file.ts'
import { ConfigError, type LoadedConfig, loadConfig } from './config/load.ts'
import { Host } from './host/host.ts'
import { runSim } from './sim/cli.ts'

/**
 * modelgate's command line: serve (default) | demo | check-config | version | sim engine | sim sglang |
 * sim smi.
 */
export const VERSION: string = pkg.version

const USAGE = `modelgate ${VERSION}

Usage:
  modelgate [serve] [--config FILE]   run with a YAML config (default ./modelgate.yaml, or $MODELGATE_CONFIG)
  modelgate demo                      run on the embedded demo config (simulated GPUs and vLLM engine)
  modelgate check-config --config FILE
                                      validate a config; exit 2 listing every problem
  modelgate version                   print the version
  modelgate sim engine MODEL [vllm serve flags]
  modelgate sim sglang --model-path MODEL [sglang.launch_server flags]
  modelgate sim smi [nvidia-smi query flags]

Exit codes of serve: 0 stopped by a signal; 2 the configuration is invalid (the problems are
printed, as check-config prints them; retrying cannot help); 1 start-up failed for another reason
(a port in use, a coordination service unreachable), which a retry may get past.
`

/** selfCommand is the argv that re-runs this program: the binary itself, or bun + this file. */
function selfCommand(): string[] {
  const compiled = import.meta.path.startsWith('/$bunfs/') || import.meta.path.includes('~BUN')
  return compiled ? [process.execPath] : [process.execPath, resolve(import.meta.dir, 'main.ts')]
}

function flag(args: string[], name: string): string | undefined {
  const i = args.indexOf(name)
  if (i >= 0) return args[i + 1]
  const eq = args.find((a) => a.startsWith(`${name}=`))
  return eq?.slice(name.length + 1)
}

function configPath(args: string[]): string {
  return flag(args, '--config') ?? process.env.MODELGATE_CONFIG ?? 'modelgate.yaml'
}

function reportConfigError(err: unknown): number {
  if (err instanceof ConfigError) {
    console.error(`modelgate: invalid configuration (${err.problems.length} problem(s)):`)
    for (const p of err.problems) console.error(`  ${p}`)
    return 2
  }
  throw err
}

async function serve(load: () => LoadedConfig): Promise<number> {
  let config: LoadedConfig
  try {
    config = load()
  } catch (err) {
    return reportConfigError(err)
  }
  const host = new Host({ config, definitions: plugins, version: VERSION, selfCommand: selfCommand() })
  let signals = 0
  const onSignal = (sig: string) => {
    signals++
    if (signals > 1) {
      host.log.warn(`second ${sig}: forcing exit`)
      host.kill()
      process.exit(130)
    }
    host
      .shutdown(sig)
      .then(() => process.exit(0))
      .catch((err) => {
        host.log.error('shutdown failed', { error: String(err) })
        host.kill()
        process.exit(1)
      })
  }
  process.on('SIGTERM', () => onSignal('SIGTERM'))
  process.on('SIGINT', () => onSignal('SIGINT'))
  try {
    await host.boot()
  } catch (err) {
    // A configuration problem is exit 2 wherever it surfaces (systemd's RestartPreventExitStatus=2
    // does not retry it); anything else (a port in use, etcd unreachable) is 1, which may pass.
    if (err instanceof ConfigError) return reportConfigError(err)
    host.log.error('start-up failed', { error: err instanceof Error ? err.message : String(err) })
    return 1
  }
  const urls = host.urls
  for (const [name, url] of Object.entries(urls))
    console.log(`modelgate ${VERSION}: ${name} on ${url}  (docs: ${url}/docs)`)
  return new Promise<number>(() => {}) // serve until a signal exits the process
}

export async function main(argv: string[]): Promise<number> {
  const [cmd = 'serve', ...rest] = argv
  const env = process.env
  switch (cmd) {
    case 'version':
    case '--version':
      console.log(VERSION)
      return 0
    case 'help':
    case '--help':
    case '-h':
      console.log(USAGE)
      return 0
    case 'check-config':
      try {
        loadConfigFile(configPath(rest), env, plugins)
        console.log(`${configPath(rest)}: ok`)
        return 0
      } catch (err) {
        return reportConfigError(err)
      }
    case 'demo':
      return serve(() => loadConfig(demoYaml, env, knownPlugins(plugins)))
    case 'serve':
      return serve(() => loadConfigFile(configPath(rest), env, plugins))
    case 'sim':
      return runSim(rest)
    default:
      if (cmd.startsWith('--')) return serve(() => loadConfigFile(configPath(argv), env, plugins))
      console.error(`modelgate: unknown command '${cmd}'\n\n${USAGE}`)
      return 2
  }
}

if (import.meta.main) {
  const code = await main(process.argv.slice(2))
  if (code !== 0 || !['serve', 'demo'].includes(process.argv[2] ?? 'serve')) process.exit(code)
}
