import { DEFAULT_ENGINE_KIND, type EngineKind, engineDriver } from '../../src/engine/kinds.ts'
import { seededRandom } from './random.ts'
/**
 * buildPrompts makes prompts of exactly `target` tokens as the engine's own tokenizer counts them
 * (POST /tokenize), so a scenario's inputTokens is what the engine really prefills. It searches
 * the word count of a seeded word sequence until `/tokenize` reports the target (with BPE or
 * SentencePiece tokenizers common words are one token each, so this converges in a few calls).
 *
 * Each request then gets its own variant: the 32 words after the first, shuffled by request
 * number. Pre-tokenizers split at word boundaries, so a permutation keeps the count while the
 * shared prefix is one word long, which keeps the engine's prefix cache from shortening TTFT (as
 * `vllm bench serve`'s random dataset does). Three variants are re-counted; if any differs, every
 * request uses the base prompt and the note says so. Without `/tokenize` the prompt is estimated
 * at one token per word and the note says so.
 */
export interface PromptSet {
  source: 'tokenize' | 'estimate'
  /** tokens: the base prompt's length per the engine (or the estimate). */
  tokens: number
  note: string | null
  /** maxModelLen as `/tokenize` reported it, when it did. */
  maxModelLen: number | null
  prompt(i: number): string
}

export interface PromptOptions {
  engineUrl: string
  /** the engine at engineUrl (its driver's client counts the tokens); default vllm */
  engineKind?: EngineKind
  model: string
  target: number
  signal: AbortSignal
  timeoutMs: number
  seed?: number
}

const POOL = (
  'the of and to in is was for that on as with by at from his her an were are which this be or has had ' +
  'not first one their its new after who they have two been but also more when other into time all city ' +
  'school year during most some only over would world state there then many about where under later ' +
  'between three out because made can known such both before than war through early part well while ' +
  'these team since national music system number against used may four series began each called high ' +
  'did life north river south area end government second work said long water light house road field'
).split(' ')

function words(seed: number, n: number): string[] {
  const rnd = seededRandom(seed)
  return Array.from({ length: n }, () => POOL[Math.floor(rnd() * POOL.length)]!)
}

/** SHUFFLED is how many words after the first each request reorders (two 16-token KV blocks). */
const SHUFFLED = 32

/**
 * variants returns prompt(i): request i reorders words 2…33 with its own seed (Fisher-Yates) and
 * keeps the rest, joined once. Prefix caches hash blocks in a chain, so a different first block is
 * enough to miss for the whole prompt, and per-request work stays small for long prompts.
 */
function variants(base: readonly string[]): (i: number) => string {
  const head = base.slice(0, 1 + SHUFFLED)
  const rest = base.length > head.length ? ` ${base.slice(head.length).join(' ')}` : ''
  const plain = head.join(' ') + rest
  return (i) => {
    if (i === 0 || head.length < 3) return plain
    const w = [...head]
    const rnd = seededRandom(0x9e3779b9 ^ i)
    for (let k = w.length - 1; k > 1; k--) {
      const j = 1 + Math.floor(rnd() * k)
      const tmp = w[k]!
      w[k] = w[j]!
      w[j] = tmp
    }
    return w.join(' ') + rest
  }
}

/** NoTokenizer: the engine has no /tokenize; the prompt is then estimated. */
class NoTokenizer extends Error {}

export async function buildPrompts(o: PromptOptions): Promise<PromptSet> {
  const seed = o.seed ?? 0x5eed
  let pool = words(seed, o.target + 64)
  const wordsFor = (n: number) => {
    if (n > pool.length) pool = words(seed, n + 64)
    return pool.slice(0, n)
  }
  const engine = engineDriver(o.engineKind ?? DEFAULT_ENGINE_KIND).client(o.engineUrl)
  let maxModelLen: number | null = null
  const count = async (text: string) => {
    const r = await engine.tokenize(o.model, text, { timeoutMs: o.timeoutMs, signal: o.signal })
    if (r === null) throw new NoTokenizer()
    maxModelLen = r.maxModelLen ?? maxModelLen
    return r.count
  }
  try {
    let lo = -1 // largest word count known to be under the target
    let hi = Number.POSITIVE_INFINITY // smallest word count known to be over it
    let n = o.target
    let base: string[] | null = null
    for (let iter = 0; iter < 24 && base === null; iter++) {
      const c = await count(wordsFor(n).join(' '))
      if (c === o.target) base = wordsFor(n)
      else {
        if (c < o.target) lo = Math.max(lo, n)
        else hi = Math.min(hi, n)
        let next = n + (o.target - c)
        if (next <= lo || next >= hi) next = Number.isFinite(hi) ? Math.floor((lo + hi) / 2) : lo + 1
        if (next <= lo || next >= hi || next < 0) break
        n = next
      }
    }
    let note: string | null = null
    let tokens = o.target
    if (base === null) {
      // No word count lands exactly: pad the longest short prompt with one-token words.
      const start = Math.max(0, lo)
      const short = wordsFor(start)
      const have = await count(short.join(' '))
      base = [...short, ...Array<string>(Math.max(0, o.target - have)).fill('a')]
      tokens = await count(base.join(' '))
      if (tokens !== o.target)
        note = `no prompt of exactly ${o.target} tokens was found; using ${tokens} tokens`
    }
    const prompt = variants(base)
    const sample = await Promise.all([1, 2, 3].map((i) => count(prompt(i))))
    const stable = sample.every((c) => c === tokens)
    if (!stable) {
      const extra = 'shuffled variants changed the token count, so every request sends the same prompt'
      note = note ? `${note}; ${extra}` : extra
    }
    const joined = prompt(0)
    return { source: 'tokenize', tokens, note, maxModelLen, prompt: stable ? prompt : () => joined }
  } catch (err) {
    if (!(err instanceof NoTokenizer)) throw err
    return {
      source: 'estimate',
      tokens: o.target,
      note: 'the engine has no /tokenize endpoint: prompt length estimated at one token per word (see input_tokens_avg)',
      maxModelLen: null,
      prompt: variants(wordsFor(o.target)),
    }
  }
}
