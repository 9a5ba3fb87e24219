import { Elysia } from 'elysia'
import { principalOf } from '../../../src/http/app.ts'
import { ControllerError } from '../../../src/http/schemas.ts'
import { SettingsBody, SettingsSchema } from './schemas.ts'
import type { SettingsStore } from './service.ts'

/**
 * settingsRoutes: the settings (the model-hub token). Reading is for admin and admin-readonly
 * (the guard's rule for a GET), changing for admin. Only an admin sees the real token; the guard has
 * already authenticated the caller, the route only picks the view for the caller's role.
 */
const tags = ['gateway']

export function settingsRoutes(settings: SettingsStore) {
  const isAdmin = (request: Request) => principalOf(request)?.roles.includes('admin') ?? false
  return new Elysia({ name: 'gateway-settings-routes' })
    .get('/api/settings', ({ request }) => settings.view(isAdmin(request)), {
      response: { 200: SettingsSchema },
      detail: {
        tags,
        summary: 'Read the settings (model-hub token)',
        description:
          'admin gets the real model-hub token; admin-readonly gets a fixed masked placeholder when one is set. ' +
          'Engines receive the token as HF_TOKEN in their environment, never on their command line.',
        'x-auth': 'admin',
      },
    })
    .put(
      '/api/settings',
      ({ request, body }) => {
        settings.setHfToken(body.hf_token, principalOf(request)?.username ?? 'anonymous')
        return settings.view(isAdmin(request))
      },
      {
        body: SettingsBody,
        response: { 200: SettingsSchema, 400: ControllerError },
        detail: {
          tags,
          summary: 'Change the settings (model-hub token)',
          description:
            'Sets (or, with null or "", removes) the model-hub token. Engines started from now on get it as ' +
            'HF_TOKEN; engines already running keep the environment they started with. Stored in ' +
            'data_dir/settings.json (mode 0600); never logged. 400 VALIDATION_ERROR for a value that is not ' +
            'printable ASCII without spaces, longer than 512 characters, or the masked placeholder itself.',
          'x-auth': 'admin',
        },
      },
    )
}
