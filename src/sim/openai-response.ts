import type { Server } from 'bun'
import { simError, streamErrorFrame } from './errors.ts'
import { type FinishReason, Generation } from './generation.ts'
import type { InferencePlan } from './openai-request.ts'
import type { InferenceRuntime } from './runtime.ts'

/**
 * respondInference runs a planned request through a Generation and renders vLLM's OpenAI responses:
 * SSE chunks (role chunk for chat, one chunk per token, finish_reason on the last, optional usage
 * chunk, `[DONE]`) or a single JSON body. A client disconnect aborts the generation at once; an
 * engine-side abort (sleep with mode=abort) ends it with a `finish_reason: "abort"` chunk and
 * `[DONE]` (a non-stream request gets its partial text with that finish reason).
 */
const encoder = new TextEncoder()

export function usageOf(plan: InferencePlan, completion: number) {
  const prompt = plan.gen.promptTokens
  return {
    prompt_tokens: prompt,
    total_tokens: prompt + completion,
    completion_tokens: completion,
    prompt_tokens_details: null,
  }
}

function head(plan: InferencePlan) {
  return {
    id: plan.id,
    object: plan.kind === 'chat' ? 'chat.completion.chunk' : 'text_completion',
    created: plan.created,
    model: plan.model,
  }
}

function tokenChoice(plan: InferencePlan, text: string, finish: FinishReason | null) {
  if (plan.kind === 'chat') {
    return finish
      ? { index: 0, delta: { content: text }, logprobs: null, finish_reason: finish, stop_reason: null }
      : { index: 0, delta: { content: text }, logprobs: null, finish_reason: null }
  }
  return { index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null }
}

/** abortChoice is the last chunk of a request the engine aborted: no text, finish_reason "abort". */
function abortChoice(plan: InferencePlan) {
  if (plan.kind === 'chat')
    return { index: 0, delta: {}, logprobs: null, finish_reason: 'abort', stop_reason: null }
  return { index: 0, text: '', logprobs: null, finish_reason: 'abort', stop_reason: null }
}

function frame(value: unknown): string {
  return `data: ${JSON.stringify(value)}\n\n`
}

/**
 * Renderer is how one API dresses a Generation: the SSE text before the first token, per token, at
 * the end (normal, engine abort, engine failure), and the single JSON body of a non-stream request.
 * Chat and completions use OPENAI_RENDERER; the Responses and Messages routes bring their own, so
 * every API goes through the same scheduler, KV accounting, sleep checks, metrics and faults.
 */
export interface Renderer {
  start(plan: InferencePlan): string
  token(plan: InferencePlan, text: string, finish: FinishReason | null): string
  done(plan: InferencePlan, completion: number): string
  aborted(plan: InferencePlan, completion: number): string
  fail(rt: InferenceRuntime, message: string): string
  body(plan: InferencePlan, text: string, reason: FinishReason, completion: number): unknown
  /** failBody is the non-stream answer to an engine failure (vLLM's error shape by default). */
  failBody?(rt: InferenceRuntime, message: string): Response
}

const OPENAI_RENDERER: Renderer = {
  start: (plan) =>
    plan.kind === 'chat'
      ? frame({
          ...head(plan),
          choices: [
            { index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null },
          ],
        })
      : '',
  token: (plan, text, finish) => frame({ ...head(plan), choices: [tokenChoice(plan, text, finish)] }),
  done: (plan, completion) =>
    `${plan.includeUsage ? frame({ ...head(plan), choices: [], usage: usageOf(plan, completion) }) : ''}data: [DONE]\n\n`,
  aborted: (plan, completion) =>
    frame({ ...head(plan), choices: [abortChoice(plan)] }) + OPENAI_RENDERER.done(plan, completion),
  fail: (rt, message) => streamErrorFrame(rt.knobs.errorShape, 500, message),
  body: (plan, text, reason, completion) => completionBody(plan, text, reason, completion),
}

export function respondInference(
  rt: InferenceRuntime,
  req: Request,
  server: Server<unknown>,
  plan: InferencePlan,
  render: Renderer = OPENAI_RENDERER,
): Response | Promise<Response> {
  server.timeout(req, 0)
  if (rt.sleep.blocksInference && rt.knobs.sleepInference === 'crash') {
    rt.crash('RuntimeError: CUDA error: an illegal memory access was encountered (engine is asleep)')
  }
  return plan.stream ? streamResponse(rt, req, plan, render) : collectResponse(rt, req, plan, render)
}

function streamResponse(rt: InferenceRuntime, req: Request, plan: InferencePlan, render: Renderer): Response {
  let gen: Generation | undefined
  let open = true
  const stream = new ReadableStream<Uint8Array>({
    start(controller) {
      const send = (text: string): void => {
        if (!open || text === '') return
        try {
          controller.enqueue(encoder.encode(text))
        } catch {
          open = false
          gen?.disconnect()
        }
      }
      const close = (): void => {
        if (!open) return
        open = false
        try {
          controller.close()
        } catch {}
      }
      send(render.start(plan))
      gen = new Generation(rt, plan.gen, {
        token: (text, _index, finish) => send(render.token(plan, text, finish)),
        done: (completion) => {
          send(render.done(plan, completion))
          close()
        },
        fail: (message) => {
          send(render.fail(rt, message))
          close()
        },
        aborted: (completion) => {
          send(render.aborted(plan, completion))
          close()
        },
      })
      gen.start()
    },
    cancel() {
      open = false
      gen?.disconnect()
    },
  })
  req.signal.addEventListener('abort', () => {
    open = false
    gen?.disconnect()
  })
  return new Response(stream, {
    headers: { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' },
  })
}

function collectResponse(
  rt: InferenceRuntime,
  req: Request,
  plan: InferencePlan,
  render: Renderer,
): Promise<Response> {
  return new Promise<Response>((resolve) => {
    let text = ''
    let reason: FinishReason = 'length'
    const gen = new Generation(rt, plan.gen, {
      token: (t, _index, finish) => {
        text += t
        if (finish) reason = finish
      },
      done: (completion) => resolve(Response.json(render.body(plan, text, reason, completion))),
      fail: (message) =>
        resolve(render.failBody ? render.failBody(rt, message) : simError(rt.knobs.errorShape, 500, message)),
      aborted: (completion) => resolve(Response.json(render.body(plan, text, 'abort', completion))),
    })
    req.signal.addEventListener('abort', () => {
      gen.disconnect()
      resolve(new Response(null, { status: 499 }))
    })
    gen.start()
  })
}

function completionBody(plan: InferencePlan, text: string, reason: FinishReason, completion: number) {
  const usage = usageOf(plan, completion)
  if (plan.kind === 'chat') {
    return {
      id: plan.id,
      object: 'chat.completion',
      created: plan.created,
      model: plan.model,
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: text,
            refusal: null,
            annotations: null,
            audio: null,
            function_call: null,
            tool_calls: [],
            reasoning_content: null,
          },
          logprobs: null,
          finish_reason: reason,
          stop_reason: null,
        },
      ],
      service_tier: null,
      system_fingerprint: null,
      usage,
      prompt_logprobs: null,
      kv_transfer_params: null,
    }
  }
  return {
    id: plan.id,
    object: 'text_completion',
    created: plan.created,
    model: plan.model,
    choices: [
      { index: 0, text, logprobs: null, finish_reason: reason, stop_reason: null, prompt_logprobs: null },
    ],
    usage,
    kv_transfer_params: null,
  }
}
