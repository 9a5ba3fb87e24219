import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import { CatalogEntryBody, CatalogEntrySchema, CatalogListSchema, CatalogSavedSchema } from './schemas.ts'
import type { CatalogStore } from './store.ts'

/**
 * catalogRoutes: the catalogue read and edited at run time. Thin: CatalogStore decides. A name may
 * hold `/` (`org/model:tag`): give it percent-encoded in one segment (`org%2Fmodel%3Atag`, what
 * the dashboard sends) or as it is (`/api/catalog/org/model:tag`); both reach the same handler,
 * and the second spelling is left out of /docs.
 */
const tags = ['gateway']
const Params = t.Object({ name: t.String({ description: 'the entry name, percent-encoded' }) })

const NAME_RULES =
  'A name is 1–128 characters of A–Z a–z 0–9 . _ : / - and is not a file path: a leading /, an empty, . or .. ' +
  'segment, a backslash or a control character is 400 VALIDATION_ERROR saying which.'

const PUT_DOCS =
  'Body: the entry without its name (the name is the path). Creates (201) or replaces (200) an entry saved ' +
  'through the API and answers it as stored, with `source: "api"` and `updated_at`. Unknown fields, more than 64 ' +
  'extra_args or one longer than 1024 characters, gpu_ids that do not match tensor_parallel_size and flags the load ' +
  'sets itself in extra_args are 400 VALIDATION_ERROR. 400 CATALOG_ENTRY_TOO_LARGE when no set of ' +
  'tensor_parallel_size GPUs of one kind here (or its gpu_ids) could hold one engine of it, whatever runs now: the ' +
  'message gives the need per GPU (the newest matching memory profile, else gpu_memory_utilization × the device), ' +
  "each GPU kind's count and size, and the TP. Without a GPU probe it is saved unchecked, with a `warning`. " +
  '409 CATALOG_ENTRY_FROM_CONFIG for a name defined in the YAML (edit it there); 409 CATALOG_NAME_TAKEN for a ' +
  'name that differs only in case from an entry of either source (names are unique whatever their case; ' +
  'lookups are exact); 409 CATALOG_FULL past 1000 ' +
  `saved entries. ${NAME_RULES}`

export function catalogRoutes(store: CatalogStore) {
  const getOne = ({ params }: { params: { name: string } }) => store.require(params.name)
  const put = async ({
    params,
    body,
    set,
  }: {
    params: { name: string }
    body: typeof CatalogEntryBody.static
    set: { status?: number | string }
  }) => {
    const { saved, created } = await store.save(params.name, body)
    set.status = created ? 201 : 200
    return saved
  }
  const remove = ({ params }: { params: { name: string } }) => {
    store.remove(params.name)
    return { deleted: true as const, name: params.name }
  }
  const rest = (p: { '*': string }) => ({ name: p['*'] })
  const hidden = { detail: { hide: true } }
  const Deleted = t.Object({ deleted: t.Literal(true), name: t.String() })
  return new Elysia({ name: 'gateway-catalog-routes' })
    .get(
      '/api/catalog',
      () => {
        const entries = store.list()
        return { entries, total: entries.length }
      },
      {
        response: { 200: CatalogListSchema },
        detail: {
          tags,
          summary: 'The catalogue: models this host may serve on demand',
          description:
            'Every entry by name, from the YAML (`source: "config"`, plugins.gateway.catalog) and saved through this ' +
            'API (`source: "api"`), with its load options, `pin` (never evicted) and `preload` (loaded at start).',
        },
      },
    )
    .get('/api/catalog/:name', getOne, {
      params: Params,
      response: { 200: CatalogEntrySchema, 400: ControllerError, 404: ControllerError },
      detail: {
        tags,
        summary: 'One catalogue entry',
        description: `404 CATALOG_ENTRY_NOT_FOUND. ${NAME_RULES}`,
      },
    })
    .put('/api/catalog/:name', put, {
      params: Params,
      body: CatalogEntryBody,
      response: {
        200: CatalogSavedSchema,
        201: CatalogSavedSchema,
        400: ControllerError,
        409: ControllerError,
        507: ControllerError,
      },
      detail: { tags, summary: 'Create or replace a catalogue entry', description: PUT_DOCS },
    })
    .delete('/api/catalog/:name', remove, {
      params: Params,
      response: { 200: Deleted, 400: ControllerError, 404: ControllerError, 409: ControllerError },
      detail: {
        tags,
        summary: 'Remove a catalogue entry',
        description:
          'Removes an entry saved through the API and answers `{deleted: true, name}`; a model it serves now keeps ' +
          `running. 404 CATALOG_ENTRY_NOT_FOUND; 409 CATALOG_ENTRY_FROM_CONFIG for a name defined in the YAML. ${NAME_RULES}`,
      },
    })
    .get('/api/catalog/*', ({ params }) => getOne({ params: rest(params) }), hidden)
    .put('/api/catalog/*', ({ params, body, set }) => put({ params: rest(params), body, set }), {
      body: CatalogEntryBody,
      ...hidden,
    })
    .delete('/api/catalog/*', ({ params }) => remove({ params: rest(params) }), hidden)
}
