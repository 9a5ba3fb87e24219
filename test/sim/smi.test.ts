import { afterEach, describe, expect, it } from 'bun:test'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { writeEngineRecord } from '../../src/sim/state.ts'
import { cleanupSims, runSmiCli, tempSimDir } from './helpers.ts'

afterEach(cleanupSims)

const NOUNITS = '--format=csv,noheader,nounits'

function record(pid: number, gpus: number[], mib: number, running = 0) {
  return {
    pid,
    gpus,
    used_mib_per_gpu: mib,
    process_name: 'python3',
    model: 'm',
    started_at: new Date().toISOString(),
    running,
  }
}

describe('sim smi', () => {
  it('answers the gateway GPU query with idle figures', () => {
    const dir = tempSimDir()
    const res = runSmiCli(
      [
        '--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu',
        NOUNITS,
      ],
      { MODELGATE_SIM_DIR: dir },
    )
    expect(res.code).toBe(0)
    const lines = res.stdout.trim().split('\n')
    expect(lines).toHaveLength(2)
    const cells = lines[0]?.split(', ') ?? []
    expect(cells[0]).toBe('0')
    expect(cells[1]).toMatch(/^GPU-[0-9a-f-]{36}$/)
    expect(cells.slice(2, 7)).toEqual(['NVIDIA H100 80GB HBM3', '81559', '4', '81555', '0'])
  })

  it('respects the requested field order and the --sim-gpus flag', () => {
    const dir = tempSimDir()
    const res = runSmiCli(['--query-gpu=memory.total,name,index', NOUNITS, '--sim-gpus', '1x24,1x40'], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(res.stdout).toBe('23034, NVIDIA L4, 0\n40960, NVIDIA A100-SXM4-40GB, 1\n')
  })

  it('prints headers and units like nvidia-smi', () => {
    const dir = tempSimDir()
    const withHeader = runSmiCli(
      ['--query-gpu=index,name,memory.total,utilization.gpu', '--format=csv', '--sim-gpus=1x80'],
      {
        MODELGATE_SIM_DIR: dir,
      },
    )
    expect(withHeader.stdout).toBe(
      'index, name, memory.total [MiB], utilization.gpu [%]\n0, NVIDIA H100 80GB HBM3, 81559 MiB, 0 %\n',
    )
    const noHeader = runSmiCli(['--query-gpu=memory.used', '--format=csv,noheader', '--sim-gpus=1x80'], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(noHeader.stdout).toBe('4 MiB\n')
  })

  it('prints [N/A] for the fields named in MODELGATE_SIM_SMI_NA', () => {
    const dir = tempSimDir()
    const res = runSmiCli(['--query-gpu=index,utilization.gpu,temperature.gpu,memory.used', NOUNITS], {
      MODELGATE_SIM_DIR: dir,
      MODELGATE_SIM_GPUS: '1x80',
      MODELGATE_SIM_SMI_NA: 'utilization.gpu,temperature.gpu',
    })
    expect(res.stdout).toBe('0, [N/A], [N/A], 4\n')
  })

  it('prints nothing for compute apps when no engine runs', () => {
    const dir = tempSimDir()
    const res = runSmiCli(['--query-compute-apps=pid,process_name,used_memory,gpu_uuid', NOUNITS], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(res).toEqual({ code: 0, stdout: '' })
  })

  it('lists one compute-app row per engine per GPU and adds their memory and load', () => {
    const dir = tempSimDir()
    writeEngineRecord(dir, record(process.pid, [0, 1], 30000, 4))
    const apps = runSmiCli(['--query-compute-apps=gpu_bus_id,used_memory,pid,process_name', NOUNITS], {
      MODELGATE_SIM_DIR: dir,
    })
    const rows = apps.stdout.trim().split('\n')
    expect(rows).toHaveLength(2)
    expect(rows[0]).toMatch(new RegExp(`^00000000:[0-9A-F]{2}:00.0, 30000, ${process.pid}, python3$`))
    const gpus = runSmiCli(['--query-gpu=index,memory.used,memory.free,utilization.gpu', NOUNITS], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(gpus.stdout).toBe('0, 30004, 51555, 42\n1, 30004, 51555, 42\n')
    const header = runSmiCli(['--query-compute-apps=pid,used_memory', '--format=csv'], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(header.stdout.split('\n')[0]).toBe('pid, used_gpu_memory [MiB]')
  })

  it('forgets engines whose process is gone, like a GPU freeing a dead process memory', async () => {
    const dir = tempSimDir()
    const dead = Bun.spawn(['true'])
    await dead.exited
    writeEngineRecord(dir, record(dead.pid, [0], 70000))
    const res = runSmiCli(['--query-gpu=memory.used', NOUNITS, '-i', '0'], { MODELGATE_SIM_DIR: dir })
    expect(res.stdout).toBe('4\n')
    expect(existsSync(join(dir, 'engines', `${dead.pid}.json`))).toBe(false)
  })

  it('rejects an unknown field with exit code 2 and the nvidia-smi message', () => {
    const res = runSmiCli(['--query-gpu=index,foo', NOUNITS], { MODELGATE_SIM_DIR: tempSimDir() })
    expect(res.code).toBe(2)
    expect(res.stdout).toContain('Field "foo" is not a valid field to query.')
  })

  it('fails like a host without a driver when asked to', () => {
    const res = runSmiCli(['--query-gpu=index', NOUNITS], {
      MODELGATE_SIM_DIR: tempSimDir(),
      MODELGATE_SIM_SMI_FAIL: '1',
    })
    expect(res.code).toBe(9)
    expect(res.stdout).toContain("couldn't communicate with the NVIDIA driver")
  })

  it('prints a table with no arguments and a list with -L', () => {
    const dir = tempSimDir()
    expect(runSmiCli([], { MODELGATE_SIM_DIR: dir }).stdout).toContain('NVIDIA-SMI')
    expect(runSmiCli(['-L'], { MODELGATE_SIM_DIR: dir }).stdout).toMatch(
      /^GPU 0: NVIDIA H100 80GB HBM3 \(UUID: GPU-/,
    )
  })
})
