/**
 * Text for /docs: how runs behave and how every metric is defined. Kept here so the route file
 * stays about routes, and so the README can quote the same definitions.
 */
export const METRIC_DOCS = `**How requests are made.** Each request is a streamed \`POST /v1/completions\` with a prompt of exactly
\`input_tokens\` tokens as the engine's own \`/tokenize\` counts them (when an engine lacks \`/tokenize\` the prompt is
estimated at one token per word and the scenario's \`prompt_source\` is \`estimate\` with a \`prompt_note\`), \`max_tokens =
output_tokens\`, \`ignore_eos: true\`, \`temperature: 0\` and \`stream_options.include_usage\`, so token counts come from the
engine's \`usage\`. Every request reorders the 32 words after the first (same length), so the engine's prefix cache, which
hashes blocks in a chain, cannot shorten TTFT.
\`direct\` scenarios call the engine port with the served model name; \`proxy\` scenarios call the gateway's \`/v1\` with the
instance id as model and the inference API key when one is set. Warmup requests run first (closed loop) and are discarded.
Without \`requestRate\` the measured phase is a closed loop keeping \`concurrency\` requests in flight; with it, requests
arrive as a Poisson process at that rate (seeded, like \`vllm bench serve --request-rate\`) and \`concurrency\` caps how
many are in flight.

**Metric definitions** (as \`vllm bench serve\` defines them; times in milliseconds):
- **TTFT** = arrival of the first stream chunk carrying generated content − the request's send time.
- **E2E** = arrival of the last chunk carrying generated content − the send time.
- **TPS** (per request) = output tokens ÷ (E2E − TTFT) in seconds; **TPOT** = (E2E − TTFT) ÷ (output tokens − 1);
  **ITL** = gaps between consecutive content chunks (exact up to 200 000 gaps per scenario, uniformly sampled beyond).
- **requests_per_second** = successful requests ÷ the measured phase's wall-clock duration (first send → last response
  end); **tokens_per_second_total** = output tokens of successful requests ÷ that duration;
  **total_tokens_per_second** adds the input tokens. Never sums of latencies.
- **Percentiles** interpolate linearly between closest ranks (numpy's default); averages are arithmetic means. Latency
  statistics cover successful requests only; they are null when none succeeded.
- **Goodput**: a request is good when it succeeded and met every SLA set on its scenario: E2E ≤ \`sla_threshold_ms\`,
  and, when given, TTFT ≤ \`sla_ttft_ms\` and TPOT ≤ \`sla_tpot_ms\`. With no SLA every successful request is good.
  \`goodput_percent\` = good ÷ all measured requests (failed ones included) × 100; \`goodput_requests_per_second\` = good
  ÷ duration.
- A request **fails** on a non-2xx answer, an error event in the stream, a broken connection, a stream without generated
  content, or \`request_timeout_ms\`; failures are counted (\`failed_requests\`, \`failed_by_status\`, \`first_errors\`, \`errors\`), never dropped.
  A scenario whose measured requests all failed is \`failed\` (its \`error\` says why), and so is its run.`

export const STATUS_DOCS = `**Statuses.** Run: pending → running → completed | cancelled | failed. A run waits as pending while
\`max_concurrent_runs\` others execute. Scenario: pending → running → completed | failed | cancelled, with \`phase\`
queued → preparing (building prompts) → warmup → measuring → done. A scenario fails when it cannot run (its instance is
gone or not active, \`/tokenize\` fails, or the built prompt plus output exceeds the context); the run then ends failed
with the reason in \`error\`, after its other scenarios ran. A scenario whose requests fail still completes, with the
failures counted. Cancelling (POST …/cancel or DELETE) aborts in-flight requests: the run and its unfinished scenarios
become cancelled and a scenario cut short keeps metrics over the requests that finished. A run interrupted by a shutdown
or restart becomes failed with the reason in \`error\`.`
