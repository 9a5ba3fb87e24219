import { signal } from '@preact/signals'
import { useEffect, useState } from 'preact/hooks'
import { ErrorNote } from '../../../../../src/dashboard/client/components/error-note.tsx'
import { ms } from '../../../../../src/dashboard/client/format.ts'
import { canWrite } from '../../../../../src/dashboard/client/session.ts'
import { type ApiError, host } from '../api.ts'
import { type ChatMessage, type ChatStats, streamChat } from '../chat-stream.ts'
import { catalogChanges, sortedInstances } from '../live.ts'

/**
 * ChatPage, the playground: a streaming chat with any model a client may name (the gateway's own
 * `GET /v1/models`: active, sleeping, loading, or catalogued and not loaded, which the chat loads)
 * through the gateway's `/v1`,
 * with time to first token and tokens per second for each answer. The inference key comes from the
 * gateway (`/api/dashboard/inference-key`) and stays in this module's memory: it is never typed,
 * shown, stored, or put in a URL. Only an admin is given the key (a request can wake a sleeping
 * model: it changes state), so a read-only user sees why there is no chat instead.
 */
let inferenceKey: Promise<string | null> | null = null
const keyOnce = () => {
  inferenceKey ??= host.inferenceKey().then(
    (k) => k.key,
    (err) => {
      inferenceKey = null
      throw err
    },
  )
  return inferenceKey
}

/** Listed: a model of `GET /v1/models`, with its state (active, sleeping, loading, unloaded). */
interface Listed {
  id: string
  state: string
}
const listed = signal<Listed[] | null>(null)

/** refreshModels: the models the chat offers, as an OpenAI client lists them (with the same key). */
async function refreshModels(): Promise<void> {
  const key = await keyOnce()
  const res = await fetch('/v1/models', key ? { headers: { authorization: `Bearer ${key}` } } : {})
  if (!res.ok) return
  listed.value = ((await res.json()) as { data: Listed[] }).data
}

interface Turn extends ChatMessage {
  stats?: ChatStats
}

/** The conversation lives beside the page, not in it: it survives a visit to another page. */
const turns = signal<Turn[]>([])
const streaming = signal<AbortController | null>(null)
const lastError = signal<ApiError | null>(null)

function Stats({ stats }: { stats: ChatStats | undefined }) {
  if (!stats) return null
  return (
    <div class="chat-stats muted small">
      <span data-stat="ttft">TTFT {ms(stats.ttftMs)}</span> ·{' '}
      <span data-stat="tokens">{stats.tokens} tokens</span>
      {' · '}
      <span data-stat="tps">
        {stats.tokensPerSecond === null ? '—' : stats.tokensPerSecond.toFixed(1)} tokens/s
      </span>
      {stats.finishReason && ` · ${stats.finishReason}`}
    </div>
  )
}

export function ChatPage() {
  if (!canWrite.value)
    return (
      <div class="page chat">
        <p class="muted chat-readonly">
          The chat needs the admin role: it sends requests with the inference key, which can wake a sleeping
          model, and a read-only user is not given that key.
        </p>
      </div>
    )
  return <Playground />
}

function Playground() {
  const instances = sortedInstances.value
  const changes = catalogChanges.value
  // Listed again whenever an instance or the catalogue changes (a load, a sleep, an entry saved).
  useEffect(() => {
    void refreshModels().catch(() => undefined)
  }, [instances, changes])
  const models: Listed[] =
    listed.value ??
    [...new Set(instances.filter((i) => i.status === 'active').map((i) => i.served_model_name))].map(
      (id) => ({ id, state: 'active' }),
    )
  const [model, setModel] = useState('')
  const [system, setSystem] = useState('')
  const [input, setInput] = useState('')
  const [maxTokens, setMaxTokens] = useState('256')
  const chosen = models.some((m) => m.id === model)
    ? model
    : ((models.find((m) => m.state === 'active') ?? models[0])?.id ?? '')

  const send = async (e: Event) => {
    e.preventDefault()
    if (!input.trim() || !chosen) return
    const history: Turn[] = [...turns.value, { role: 'user', content: input }]
    const messages: ChatMessage[] = [
      ...(system.trim() ? [{ role: 'system' as const, content: system }] : []),
      ...history.map(({ role, content }) => ({ role, content })),
    ]
    let answer: Turn = { role: 'assistant', content: '' }
    turns.value = [...history, answer]
    setInput('')
    lastError.value = null
    const abort = new AbortController()
    streaming.value = abort
    try {
      const stats = await streamChat({
        key: await keyOnce(),
        model: chosen,
        messages,
        ...(maxTokens ? { maxTokens: Number(maxTokens) } : {}),
        signal: abort.signal,
        onText: (delta, s) => {
          answer = { ...answer, content: answer.content + delta, stats: s }
          turns.value = [...history, answer]
        },
      })
      turns.value = [...history, { ...answer, stats }]
    } catch (err) {
      if (!abort.signal.aborted) lastError.value = err as ApiError
    } finally {
      streaming.value = null
    }
  }

  return (
    <div class="page chat">
      <div class="row">
        <label>
          Model
          <select name="model" value={chosen} onChange={(e) => setModel(e.currentTarget.value)}>
            {models.length === 0 && <option value="">no model</option>}
            {models.map((m) => (
              <option key={m.id} value={m.id} data-state={m.state}>
                {m.state === 'active' ? m.id : `${m.id} (${m.state})`}
              </option>
            ))}
          </select>
        </label>
        <label>
          Max tokens
          <input
            class="short"
            name="max_tokens"
            type="number"
            min={1}
            value={maxTokens}
            onInput={(e) => setMaxTokens(e.currentTarget.value)}
          />
        </label>
        <button
          type="button"
          disabled={!!streaming.value || turns.value.length === 0}
          onClick={() => {
            turns.value = []
          }}
        >
          New chat
        </button>
      </div>
      <label>
        System prompt
        <input
          name="system"
          placeholder="optional"
          value={system}
          onInput={(e) => setSystem(e.currentTarget.value)}
        />
      </label>
      <div class="transcript card" aria-live="polite">
        {turns.value.length === 0 && <p class="muted">Ask the model something.</p>}
        {turns.value.map((t, i) => (
          <div key={i} class={`turn ${t.role}`} data-role={t.role}>
            <div class="content">
              {t.content || (streaming.value && i === turns.value.length - 1 ? '…' : '')}
            </div>
            <Stats stats={t.stats} />
          </div>
        ))}
      </div>
      <form class="chat-input" onSubmit={send}>
        <textarea
          name="message"
          rows={3}
          placeholder="Message"
          value={input}
          onInput={(e) => setInput(e.currentTarget.value)}
          onKeyDown={(e) => {
            if (e.key === 'Enter' && !e.shiftKey) {
              e.preventDefault()
              e.currentTarget.form?.requestSubmit()
            }
          }}
        />
        {streaming.value ? (
          <button type="button" onClick={() => streaming.value?.abort()}>
            Stop
          </button>
        ) : (
          <button type="submit" class="primary" disabled={!chosen || !input.trim()}>
            Send
          </button>
        )}
      </form>
      <ErrorNote error={lastError.value} />
    </div>
  )
}
