import { t } from 'elysia'

/**
 * The settings resource: the model-hub token engines receive as `HF_TOKEN`. An `admin` reads the real
 * value; an `admin-readonly` reads HF_TOKEN_MASK (a masked placeholder: a fixed prefix and
 * asterisks), which says that a token is set and nothing about it, not even its length.
 */
export const HF_TOKEN_MASK = `hf_${'*'.repeat(16)}`

/** Longest token accepted: hub tokens are ~40 characters; the bound keeps the env and the file small. */
export const HF_TOKEN_MAX_LENGTH = 512

export const SettingsSchema = t.Object({
  hf_token: t.Nullable(
    t.String({
      description: `the model-hub token (admin), or \`${HF_TOKEN_MASK}\` when one is set (admin-readonly); null when none is set`,
    }),
  ),
  hf_token_set: t.Boolean({ description: 'whether a model-hub token is set' }),
  hf_token_masked: t.Boolean({
    description: 'true when hf_token is the masked placeholder (admin-readonly)',
  }),
  updated_at: t.Nullable(t.String({ description: 'when the settings last changed (ISO 8601)' })),
})

const BODY_TOKEN_ERROR = `body.hf_token: must be null or a string of at most ${HF_TOKEN_MAX_LENGTH} printable ASCII characters without spaces`

export const SettingsBody = t.Object({
  hf_token: t.Nullable(
    t.String({
      maxLength: HF_TOKEN_MAX_LENGTH,
      // Printable ASCII without spaces: it becomes an environment variable's value.
      pattern: '^[\\x21-\\x7E]*$',
      description: 'the new model-hub token; null or "" removes it',
    }),
    // The message never echoes the value (a token must not reach a response or the log).
    { error: BODY_TOKEN_ERROR },
  ),
})
