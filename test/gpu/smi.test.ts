import { afterAll, describe, expect, it } from 'bun:test'
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  APP_QUERY_FIELDS,
  appQueryArgs,
  GPU_QUERY_FIELDS,
  GpuProbe,
  gpuQueryArgs,
  parseAppsCsv,
  parseGpuCsv,
  parseSmiNumber,
} from '../../src/gpu/smi.ts'
import { waitFor } from '../support/wait.ts'

const H100 = '0, GPU-c4dd1a2b, NVIDIA H100 80GB HBM3, 81559, 480, 81079, 12, 34'

describe('nvidia-smi query arguments', () => {
  it('asks for the documented fields without header or units', () => {
    expect(gpuQueryArgs()).toEqual([
      '--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu',
      '--format=csv,noheader,nounits',
    ])
    expect(appQueryArgs()).toEqual([
      '--query-compute-apps=pid,process_name,used_memory,gpu_uuid',
      '--format=csv,noheader,nounits',
    ])
    expect(GPU_QUERY_FIELDS).toHaveLength(8)
    expect(APP_QUERY_FIELDS).toHaveLength(4)
  })
})

describe('parseSmiNumber', () => {
  it('reads plain numbers and numbers with units', () => {
    expect(parseSmiNumber('81559')).toBe(81559)
    expect(parseSmiNumber(' 81559 MiB ')).toBe(81559)
    expect(parseSmiNumber('12 %')).toBe(12)
    expect(parseSmiNumber('2 GiB')).toBe(2048)
    expect(parseSmiNumber('34.5')).toBe(34.5)
  })

  it('turns unknown markers into null', () => {
    for (const v of ['[N/A]', '[Not Supported]', '[Insufficient Permissions]', 'N/A', '', '  ', undefined]) {
      expect(parseSmiNumber(v)).toBeNull()
    }
  })
})

describe('parseGpuCsv', () => {
  it('reads one row per GPU', () => {
    expect(parseGpuCsv(`${H100}\n1, GPU-ffee, NVIDIA H100 80GB HBM3, 81559, 3200, 78359, 97, 61\n`)).toEqual([
      {
        index: 0,
        uuid: 'GPU-c4dd1a2b',
        name: 'NVIDIA H100 80GB HBM3',
        memoryTotalMib: 81559,
        memoryUsedMib: 480,
        memoryFreeMib: 81079,
        utilizationPercent: 12,
        temperatureC: 34,
      },
      {
        index: 1,
        uuid: 'GPU-ffee',
        name: 'NVIDIA H100 80GB HBM3',
        memoryTotalMib: 81559,
        memoryUsedMib: 3200,
        memoryFreeMib: 78359,
        utilizationPercent: 97,
        temperatureC: 61,
      },
    ])
  })

  it('reads unknown values as null (MIG reports utilization as [N/A])', () => {
    const [gpu] = parseGpuCsv(
      '2, MIG-1234, NVIDIA A100-SXM4-80GB, [N/A], [Not Supported], 9000, [N/A], [Insufficient Permissions]',
    )
    expect(gpu).toMatchObject({
      index: 2,
      memoryTotalMib: null,
      memoryUsedMib: null,
      memoryFreeMib: 9000,
      utilizationPercent: null,
      temperatureC: null,
    })
  })

  it('tolerates CRLF, blank lines, units and trailing whitespace', () => {
    const gpus = parseGpuCsv('\r\n0, GPU-a, Tesla T4, 15360 MiB, 0 MiB, 15360 MiB, 0 %, 40  \r\n\r\n')
    expect(gpus).toEqual([
      {
        index: 0,
        uuid: 'GPU-a',
        name: 'Tesla T4',
        memoryTotalMib: 15360,
        memoryUsedMib: 0,
        memoryFreeMib: 15360,
        utilizationPercent: 0,
        temperatureC: 40,
      },
    ])
  })

  it('returns nothing for blank output or error text', () => {
    expect(parseGpuCsv('')).toEqual([])
    expect(parseGpuCsv('   \n')).toEqual([])
    expect(parseGpuCsv('No devices were found')).toEqual([])
    expect(
      parseGpuCsv("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    ).toEqual([])
    expect(parseGpuCsv('index, uuid, name, memory.total [MiB]')).toEqual([])
  })

  it('rejoins a name that contains commas and survives short rows', () => {
    expect(parseGpuCsv('0, GPU-a, Weird, GPU, Name, 100, 10, 90, 5, 30')[0]).toMatchObject({
      name: 'Weird, GPU, Name',
      memoryTotalMib: 100,
      temperatureC: 30,
    })
    expect(parseGpuCsv('3, GPU-b, Short')[0]).toMatchObject({ index: 3, name: 'Short', memoryTotalMib: null })
  })
})

describe('parseAppsCsv', () => {
  it('reads one row per compute process', () => {
    expect(
      parseAppsCsv('1234, /usr/bin/python3, 70312, GPU-c4dd1a2b\n99, vllm, 512 MiB, GPU-ffee\n'),
    ).toEqual([
      { pid: 1234, processName: '/usr/bin/python3', usedMemoryMib: 70312, gpuUuid: 'GPU-c4dd1a2b' },
      { pid: 99, processName: 'vllm', usedMemoryMib: 512, gpuUuid: 'GPU-ffee' },
    ])
  })

  it('turns unknown values into null and keeps names with commas', () => {
    expect(parseAppsCsv('[N/A], [Insufficient Permissions], [N/A], GPU-x')).toEqual([
      { pid: null, processName: '', usedMemoryMib: null, gpuUuid: 'GPU-x' },
    ])
    expect(parseAppsCsv('7, python -c a,b, 100, GPU-y')[0]?.processName).toBe('python -c a,b')
  })

  it('returns nothing when no process runs', () => {
    expect(parseAppsCsv('')).toEqual([])
    expect(parseAppsCsv('No running processes found')).toEqual([])
  })
})

const dir = mkdtempSync(join(tmpdir(), 'modelgate-smi-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

function script(name: string, body: string): string {
  const path = join(dir, name)
  writeFileSync(path, `#!/bin/sh\n${body}\n`)
  chmodSync(path, 0o755)
  return path
}

const calls = join(dir, 'calls')
const fakeSmi = script(
  'fake-smi',
  `echo "$1" >> '${calls}'
case "$1" in
  --query-gpu=*) printf '${H100}\\n1, GPU-ffee, NVIDIA H100 80GB HBM3, 81559, 3200, 78359, [N/A], 61\\n' ;;
  --query-compute-apps=*) printf '4321, python3, 2700, GPU-ffee\\n' ;;
esac`,
)
const callCount = (): number => readFileSync(calls, 'utf8').split('\n').filter(Boolean).length

describe('GpuProbe', () => {
  it('runs the command for GPUs and processes', async () => {
    const snap = await new GpuProbe([fakeSmi]).snapshot()
    if (!snap.available) throw new Error(snap.reason)
    expect(snap.gpus.map((g) => [g.index, g.memoryFreeMib, g.utilizationPercent])).toEqual([
      [0, 81079, 12],
      [1, 78359, null],
    ])
    expect(snap.apps).toEqual([
      { pid: 4321, processName: 'python3', usedMemoryMib: 2700, gpuUuid: 'GPU-ffee' },
    ])
    expect(snap.takenAt).toBeGreaterThan(0)
  })

  it('caches a snapshot and shares one in-flight probe between callers', async () => {
    writeFileSync(calls, '')
    const probe = new GpuProbe([fakeSmi], { cacheMs: 60_000 })
    const [a, b, c] = await Promise.all([probe.snapshot(), probe.snapshot(), probe.snapshot()])
    expect(a).toBe(b)
    expect(b).toBe(c)
    expect(await probe.snapshot()).toBe(a)
    expect(callCount()).toBe(2)
  })

  it('never answers a probe that began before invalidate() after it (a change just made)', async () => {
    // The fake reads the GPU's used memory, then waits for a gate: a probe caught mid-way.
    const used = join(dir, 'used')
    const gate = join(dir, 'gate')
    const started = join(dir, 'started')
    writeFileSync(used, '1000')
    writeFileSync(started, '')
    rmSync(gate, { force: true })
    const gated = script(
      'gated-smi',
      `v=$(cat '${used}'); echo "$1" >> '${started}'
while [ ! -f '${gate}' ]; do sleep 0.01; done
case "$1" in
  --query-gpu=*) printf '0, GPU-a, NVIDIA H100 80GB HBM3, 81559, %s, 0, 0, 30\\n' "$v" ;;
esac`,
    )
    const probe = new GpuProbe([gated], { cacheMs: 60_000 })
    const before = probe.snapshot()
    await waitFor('the first probe read the GPU', () => readFileSync(started, 'utf8').split('\n').length > 2)
    writeFileSync(used, '5000') // a wake took memory back
    probe.invalidate()
    const after = probe.snapshot()
    writeFileSync(gate, '')
    const [a, b] = await Promise.all([before, after])
    if (!a.available || !b.available) throw new Error('probe unavailable')
    expect(a.gpus[0]!.memoryUsedMib).toBe(1000)
    expect(b.gpus[0]!.memoryUsedMib).toBe(5000)
    // and what is cached from now on is the fresh one
    const c = await probe.snapshot()
    if (!c.available) throw new Error('probe unavailable')
    expect(c.gpus[0]!.memoryUsedMib).toBe(5000)
  })

  it('probes again once the cache has expired', async () => {
    writeFileSync(calls, '')
    const probe = new GpuProbe([fakeSmi], { cacheMs: 0 })
    await probe.snapshot()
    await probe.snapshot()
    expect(callCount()).toBe(4)
  })

  it('serves a view the newest reading at once while nvidia-smi is slow, one fresh run for every caller', async () => {
    // The fake answers with the used memory in a file, and only once a gate file exists.
    const used = join(dir, 'used-r')
    const gate = join(dir, 'gate-r')
    const runs = join(dir, 'runs-r')
    writeFileSync(used, '1000')
    writeFileSync(runs, '')
    writeFileSync(gate, '')
    const slow = script(
      'slow-smi',
      `echo "$1" >> '${runs}'
while [ ! -f '${gate}' ]; do sleep 0.01; done
case "$1" in
  --query-gpu=*) printf '0, GPU-a, NVIDIA H100 80GB HBM3, 81559, %s, 0, 0, 30\\n' "$(cat '${used}')" ;;
esac`,
    )
    const runCount = () => readFileSync(runs, 'utf8').split('\n').filter(Boolean).length
    const probe = new GpuProbe([slow], { cacheMs: 0 })
    // The first reading after start is waited for: there is nothing older to show.
    const first = await probe.reading()
    if (!first.available) throw new Error(first.reason)
    expect(first.gpus[0]!.memoryUsedMib).toBe(1000)
    expect(runCount()).toBe(2)
    // nvidia-smi now hangs: views still get the last reading, and ten of them start one run.
    rmSync(gate)
    writeFileSync(used, '7000')
    const views = await Promise.all(Array.from({ length: 10 }, () => probe.reading()))
    for (const v of views) expect(v).toBe(first)
    await waitFor('the background reading to start', () => runCount() === 4)
    expect(runCount()).toBe(4)
    // A decision (snapshot) waits for the run under way; once it ends, views show it.
    const decided = probe.snapshot()
    writeFileSync(gate, '')
    const fresh = await decided
    if (!fresh.available) throw new Error(fresh.reason)
    expect(fresh.gpus[0]!.memoryUsedMib).toBe(7000)
    expect(fresh.takenAt).toBeGreaterThanOrEqual(first.takenAt)
    const after = await probe.reading()
    if (!after.available) throw new Error(after.reason)
    expect(after.gpus[0]!.memoryUsedMib).toBe(7000)
  })

  it('passes arguments through a wrapper command', async () => {
    const wrapper = script('wrapper', 'shift; exec "$@"')
    const snap = await new GpuProbe([wrapper, '--sim', fakeSmi]).snapshot()
    expect(snap.available && snap.gpus.length).toBe(2)
  })

  it('reports a missing binary clearly', async () => {
    expect(await new GpuProbe(['/nonexistent/nvidia-smi']).snapshot()).toEqual({
      available: false,
      reason: 'nvidia-smi not found (command: /nonexistent/nvidia-smi)',
    })
  })

  it('reports a non-zero exit with the tool’s own message', async () => {
    const broken = script(
      'broken-smi',
      `echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9`,
    )
    const snap = await new GpuProbe([broken]).snapshot()
    expect(snap).toEqual({
      available: false,
      reason: `broken-smi exited with code 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. (command: ${broken})`,
    })
  })

  it('kills a hung query at the deadline', async () => {
    // It would sleep past the test's own timeout: only the kill at the deadline lets it answer.
    const hung = script('hung-smi', 'exec sleep 600')
    const snap = await new GpuProbe([hung], { timeoutMs: 200 }).snapshot()
    expect(snap).toEqual({ available: false, reason: `hung-smi timed out after 200 ms (command: ${hung})` })
  })

  it('keeps the GPUs when only the process query fails', async () => {
    const partial = script(
      'partial-smi',
      `case "$1" in --query-gpu=*) echo '${H100}' ;; *) echo 'not supported' >&2; exit 2 ;; esac`,
    )
    const snap = await new GpuProbe([partial]).snapshot()
    expect(snap.available && snap.gpus.length).toBe(1)
    expect(snap.available && snap.apps).toEqual([])
  })

  it('is unavailable without a configured command', async () => {
    expect(await new GpuProbe(null).snapshot()).toEqual({
      available: false,
      reason: 'no GPU probe configured',
    })
    expect(await new GpuProbe([]).snapshot()).toEqual({ available: false, reason: 'no GPU probe configured' })
  })
})
