import { describe, expect, it } from 'bun:test'
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { Glob } from 'bun'

/**
 * The docs beside the code link to each other by relative paths: every such link (and image) in
 * the top README, config/, src/ and each plugin's README must reach a file that exists, and a
 * link to a heading (`file.md#anchor`) a heading that file has, so moving a doc or renaming a
 * section cannot leave a reader at a dead end.
 */
const ROOT = resolve(import.meta.dir, '../..')

function docs(): string[] {
  const fixed = ['README.md', 'config/README.md', 'config/REFERENCE.md', 'src/README.md']
  const pluginDocs = [...new Glob('plugins/*/README.md').scanSync(ROOT)].sort()
  return [...fixed, ...pluginDocs]
}

/** prose: the text outside fenced blocks and inline code, where a link is a link. */
function prose(text: string): string {
  return text.replace(/^```[\s\S]*?^```/gm, '').replace(/`[^`\n]*`/g, '')
}

/** slug: a heading's anchor as GitHub makes it (lower case, punctuation dropped, spaces to dashes). */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-')
}

function anchorsOf(file: string): Set<string> {
  const text = readFileSync(file, 'utf8').replace(/^```[\s\S]*?^```/gm, '')
  return new Set([...text.matchAll(/^#{1,6}\s+(.+)$/gm)].map((m) => slug(m[1]!)))
}

/** links: every relative link target of a doc, as written. */
function links(text: string): string[] {
  return [...prose(text).matchAll(/!?\[[^\]]*\]\(([^)\s]+)\)/g)]
    .map((m) => m[1]!)
    .filter((t) => !/^[a-z]+:/i.test(t))
}

describe('links between the docs', () => {
  it('finds the docs it checks, and links in them', () => {
    const found = docs()
    for (const p of ['gateway', 'router', 'cluster', 'benchmarks'])
      expect(found).toContain(`plugins/${p}/README.md`)
    const all = found.flatMap((d) => links(readFileSync(join(ROOT, d), 'utf8')))
    expect(all.length).toBeGreaterThan(20)
  })

  it('every relative link points to a file that exists, and to a heading it has', () => {
    const broken: string[] = []
    for (const doc of docs()) {
      const path = join(ROOT, doc)
      for (const target of links(readFileSync(path, 'utf8'))) {
        const [file, anchor] = target.split('#') as [string, string | undefined]
        const to = file ? resolve(dirname(path), file) : path
        if (!existsSync(to)) broken.push(`${doc}: ${target} (no ${relative(ROOT, to)})`)
        else if (anchor && to.endsWith('.md') && !anchorsOf(to).has(anchor))
          broken.push(`${doc}: ${target} (${relative(ROOT, to)} has no heading #${anchor})`)
      }
    }
    expect(broken).toEqual([])
  })
})
