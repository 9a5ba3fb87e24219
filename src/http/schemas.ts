import { t } from 'elysia'

/** ControllerError and ProxyError are the two error shapes (admin API and inference) as response schemas for /docs. */
export const ControllerError = t.Object(
  {
    error: t.Object({ code: t.String(), message: t.String(), statusCode: t.Number() }),
  },
  { description: 'Controller error shape' },
)

export const ProxyError = t.Object(
  {
    error: t.Object({
      message: t.String(),
      type: t.String(),
      param: t.Optional(t.String()),
      code: t.String(),
    }),
  },
  { description: 'Proxy (OpenAI-style) error shape' },
)
