import { t } from 'elysia'

/** InferenceKey: the inference-key route's answer. */
export const InferenceKey = t.Object({
  required: t.Boolean({ description: 'INFERENCE_API_KEY is set: /v1 needs the key' }),
  key: t.Nullable(t.String()),
})

/** DashboardPagesSchema: the pages route's answer. */
export const DashboardPagesSchema = t.Object({
  pages: t.Array(
    t.Object({
      plugin: t.String({ description: 'the plugin that contributes the page (`host`: the host’s own)' }),
      id: t.String(),
      title: t.String(),
      path: t.String({ description: 'its route in the URL fragment (`/models/:id`)' }),
      nav: t.Optional(t.String({ description: 'its label in the navigation; absent: reached by a link' })),
    }),
  ),
  off: t.Array(t.Object({ plugin: t.String(), path: t.String() })),
})
