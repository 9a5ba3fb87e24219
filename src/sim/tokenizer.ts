/**
 * FakeTokenizer stands in for a Hugging Face tokenizer: deterministic across processes and reversible.
 *
 * - A token is a chat special marker (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`) or a run of
 *   non-whitespace characters (a "word"). Whitespace is not a token.
 * - A word's id is a stable FNV-1a hash (1000 … 150999); specials have Qwen's ids (151643 …).
 * - decode maps ids back through the fixed output vocabulary (`WORDS`) plus every word this process has
 *   tokenized, joining with single spaces. So `decode(encode(x)) === x` for text whose words are
 *   separated by single spaces; unknown ids decode to a vocabulary word.
 * - Chat prompts are rendered with a ChatML template first, so `/tokenize {messages}` and the chat
 *   endpoints' `usage.prompt_tokens` agree.
 */
export const WORDS: readonly string[] = [
  ...new Set(
    (
      'the of and to in is was for that on as with by at from his her an were are which this be or has had ' +
      'not first one their its new after who they have two been but also he she more when other into time all ' +
      'city school year during most some only over would world state up there then many about where under later ' +
      'between three out university because made can known such both before than season film war through early ' +
      'part well while these team since national music system number against used may four series began each ' +
      'called including high did life north river south area end however government second work said long ' +
      'water light mountain garden forest ocean signal engine memory model token stream cache kernel tensor ' +
      'vector matrix layer weight batch queue server client socket packet router gateway cluster replica shard ' +
      'latency throughput budget device thread process window bridge valley harbor island desert meadow ' +
      'silver golden quiet bright rapid gentle steady careful simple modern ancient distant nearby hidden open ' +
      'clear warm cold green blue red white black purple orange yellow stone paper glass metal wood cloud rain ' +
      'snow wind storm thunder lake sea shore coast hill field farm village town road path street'
    )
      .split(' ')
      .filter((w) => w !== ''),
  ),
]

const SPECIALS: Record<string, number> = {
  '<|endoftext|>': 151643,
  '<|im_start|>': 151644,
  '<|im_end|>': 151645,
}
const SPECIAL_BY_ID = new Map(Object.entries(SPECIALS).map(([k, v]) => [v, k]))
const TOKEN_RE = /<\|[a-z_]+\|>|(?:(?!<\|[a-z_]+\|>)\S)+/g
const MAX_LEARNED = 200_000

export function fnv1a(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i)
    h = Math.imul(h, 0x01000193) >>> 0
  }
  return h >>> 0
}

export function wordId(word: string): number {
  return SPECIALS[word] ?? 1000 + (fnv1a(word) % 150_000)
}

export interface ChatMessage {
  role?: unknown
  content?: unknown
}

/** messageText flattens OpenAI message content (a string or a list of `{type:'text', text}` parts). */
export function messageText(content: unknown): string {
  if (typeof content === 'string') return content
  if (Array.isArray(content)) {
    return content
      .map((part) => (part && typeof part === 'object' && 'text' in part ? String(part.text) : ''))
      .join(' ')
  }
  return ''
}

/** renderChat applies the ChatML template the simulated models use. */
export function renderChat(messages: ChatMessage[], addGenerationPrompt = true): string {
  let text = ''
  for (const m of messages)
    text += `<|im_start|>${String(m.role ?? 'user')}\n${messageText(m.content)}<|im_end|>\n`
  if (addGenerationPrompt) text += '<|im_start|>assistant\n'
  return text
}

export class FakeTokenizer {
  private readonly byId = new Map<number, string>()

  constructor() {
    for (const w of WORDS) if (!this.byId.has(wordId(w))) this.byId.set(wordId(w), w)
  }

  encode(text: string): number[] {
    const ids: number[] = []
    for (const match of text.matchAll(TOKEN_RE)) {
      const word = match[0]
      const id = wordId(word)
      if (!SPECIAL_BY_ID.has(id) && !this.byId.has(id) && this.byId.size < MAX_LEARNED)
        this.byId.set(id, word)
      ids.push(id)
    }
    return ids
  }

  count(text: string): number {
    let n = 0
    for (const _ of text.matchAll(TOKEN_RE)) n++
    return n
  }

  decode(ids: number[]): string {
    return ids
      .map(
        (id) => SPECIAL_BY_ID.get(id) ?? this.byId.get(id) ?? WORDS[Math.abs(Math.trunc(id)) % WORDS.length],
      )
      .join(' ')
  }
}

/** OutputWords yields the deterministic "sampled" words of one request, seeded by its prompt. */
export class OutputWords {
  private state: number

  constructor(seed: number) {
    this.state = seed >>> 0 || 1
  }

  next(): string {
    // mulberry32
    this.state = (this.state + 0x6d2b79f5) >>> 0
    let t = this.state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    const r = ((t ^ (t >>> 14)) >>> 0) / 4294967296
    return WORDS[Math.floor(r * WORDS.length)] ?? 'the'
  }
}
