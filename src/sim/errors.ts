/**
 * simError renders vLLM's error bodies: the newer `{"error":{message,type,param,code}}` or, with
 * SIM_ERROR_SHAPE=old, the older `{"object":"error",message,type,param,code}`; FastAPI's own 404/405
 * stay `{"detail": …}` as in vLLM.
 */
export type ErrorShapeStyle = 'new' | 'old'

const TYPES: Record<number, string> = {
  400: 'BadRequestError',
  404: 'NotFoundError',
  500: 'InternalServerError',
  501: 'NotImplementedError',
  503: 'ServiceUnavailableError',
}

export function errorBody(
  style: ErrorShapeStyle,
  status: number,
  message: string,
  param: string | null = null,
) {
  const type = TYPES[status] ?? 'BadRequestError'
  if (style === 'old') return { object: 'error', message, type, param, code: status }
  return { error: { message, type, param, code: status } }
}

export function simError(
  style: ErrorShapeStyle,
  status: number,
  message: string,
  param: string | null = null,
) {
  return Response.json(errorBody(style, status, message, param), { status })
}

export function notFound(): Response {
  return Response.json({ detail: 'Not Found' }, { status: 404 })
}

export function methodNotAllowed(): Response {
  return Response.json({ detail: 'Method Not Allowed' }, { status: 405 })
}

/** streamErrorFrame is the one SSE frame vLLM sends when a stream fails, before `[DONE]`. */
export function streamErrorFrame(style: ErrorShapeStyle, status: number, message: string): string {
  return `data: ${JSON.stringify(errorBody(style, status, message))}\n\ndata: [DONE]\n\n`
}
