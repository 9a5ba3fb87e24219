import { checkModel, readJson, requestHex } from './openai-request.ts'
import type { InferenceRuntime } from './runtime.ts'
import { fnv1a } from './tokenizer.ts'

/**
 * handlePooling answers vLLM's pooling-model endpoints (`/pooling`, `/classify`, `/score`, `/rerank`,
 * `/v1/embeddings` and their aliases) with deterministic, plausible numbers. They exist so the gateway
 * can forward to them; the values only depend on the input text.
 */
export type PoolingRoute = 'pooling' | 'embeddings' | 'classify' | 'score' | 'rerank'

function unit(text: string, salt = 0): number {
  return fnv1a(text, 0x811c9dc5 ^ salt) / 4294967296
}

function texts(value: unknown): string[] {
  if (typeof value === 'string') return [value]
  if (Array.isArray(value)) return value.map((v) => (typeof v === 'string' ? v : JSON.stringify(v)))
  return []
}

function vector(text: string, dims = 8): number[] {
  return Array.from({ length: dims }, (_, i) => Number((unit(text, i + 1) * 2 - 1).toFixed(6)))
}

export async function handlePooling(
  rt: InferenceRuntime,
  req: Request,
  route: PoolingRoute,
): Promise<Response> {
  const body = await readJson(rt, req)
  if (body instanceof Response) return body
  const model = checkModel(rt, body)
  if (model instanceof Response) return model
  const created = Math.floor(Date.now() / 1000)
  const count = (list: string[]) => list.reduce((n, t) => n + rt.tokenizer.count(t), 0)
  const usageOf = (tokens: number) => ({
    prompt_tokens: tokens,
    total_tokens: tokens,
    completion_tokens: 0,
    prompt_tokens_details: null,
  })

  if (route === 'score') {
    const left = texts(body['text_1'] ?? body['queries'])
    const right = texts(body['text_2'] ?? body['documents'] ?? body['items'])
    const data = right.map((t, index) => ({
      index,
      object: 'score',
      score: Number(unit(`${left[Math.min(index, left.length - 1)] ?? ''}|${t}`).toFixed(6)),
    }))
    return Response.json({
      id: `score-${requestHex()}`,
      object: 'list',
      created,
      model,
      data,
      usage: usageOf(count([...left, ...right])),
    })
  }
  if (route === 'rerank') {
    const query = typeof body['query'] === 'string' ? body['query'] : ''
    const docs = texts(body['documents'])
    const ranked = docs
      .map((text, index) => ({
        index,
        document: { text },
        relevance_score: Number(unit(`${query}|${text}`).toFixed(6)),
      }))
      .sort((a, b) => b.relevance_score - a.relevance_score)
    const topN = typeof body['top_n'] === 'number' && body['top_n'] > 0 ? body['top_n'] : ranked.length
    return Response.json({
      id: `rerank-${requestHex()}`,
      model,
      usage: { total_tokens: count([query, ...docs]) },
      results: ranked.slice(0, topN),
    })
  }
  const inputs = texts(body['input'] ?? body['prompt'] ?? body['messages'])
  const usage = usageOf(count(inputs))
  if (route === 'classify') {
    const data = inputs.map((t, index) => {
      const p = Number(unit(t).toFixed(6))
      return {
        index,
        label: p >= 0.5 ? 'LABEL_0' : 'LABEL_1',
        probs: [p, Number((1 - p).toFixed(6))],
        num_classes: 2,
      }
    })
    return Response.json({ id: `classify-${requestHex()}`, object: 'list', created, model, data, usage })
  }
  if (route === 'embeddings') {
    const data = inputs.map((t, index) => ({ index, object: 'embedding', embedding: vector(t) }))
    return Response.json({ id: `embd-${requestHex()}`, object: 'list', created, model, data, usage })
  }
  const data = inputs.map((t, index) => ({ index, object: 'pooling', data: vector(t) }))
  return Response.json({ id: `pool-${requestHex()}`, object: 'list', created, model, data, usage })
}
