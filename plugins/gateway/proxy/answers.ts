import type { DirectoryAnswers } from '../../../src/directory/directory.ts'
import { queueFull, serverStopping } from '../../../src/directory/hold-queue.ts'
import { proxyError } from '../../../src/http/errors.ts'

/** Retry-After of a model still loading or not ready, when its backend cannot tell. */
const RETRY_AFTER_STARTING_SECONDS = 10

/** GATEWAY_ANSWERS: the directory's refusals in the gateway's words (the proxy shape). */
export const GATEWAY_ANSWERS: DirectoryAnswers = {
  unknown: (model) =>
    proxyError(400, 'invalid_request_error', 'invalid_model', `The model '${model}' does not exist`, 'model'),
  waking: (model, seconds, message) =>
    proxyError(
      503,
      'service_unavailable',
      'model_sleeping',
      message ?? `Model '${model}' is sleeping and is being woken up; retry in ${seconds} s`,
      undefined,
      { 'retry-after': String(seconds) },
    ),
  starting: (model, seconds) =>
    proxyError(
      503,
      'service_unavailable',
      'model_not_ready',
      `Model '${model}' is still loading`,
      undefined,
      {
        'retry-after': String(seconds ?? RETRY_AFTER_STARTING_SECONDS),
      },
    ),
  wakeFailed: (model, reason) =>
    proxyError(502, 'bad_gateway', 'wake_failed', `Model '${model}' could not be woken up: ${reason}`),
  queueFull: queueFull,
  stopping: serverStopping,
  unavailable: (model) =>
    proxyError(503, 'service_unavailable', 'model_not_ready', `Model '${model}' is not ready`, undefined, {
      'retry-after': String(RETRY_AFTER_STARTING_SECONDS),
    }),
}
