"""Every OpenTelemetry name the sidecar emits: span and metric attributes, event and metric
names, well-known values and recommended bucket boundaries. One module, so a rename is one
line and a reviewer can check the whole vocabulary against the spec in one place.

Version: the GenAI conventions now live in ``open-telemetry/semantic-conventions-genai``
(status Development, no release tag yet). Two sets of metric names, chosen once at start by
``OTEL_SEMCONV_STABILITY_OPT_IN`` (a comma list, as the contrib instrumentations read it):

- default: the last *released* names (semantic-conventions v1.41.0 and genai ``model/gen-ai/
  metrics.yaml`` at commit ``9ba9b77579bd6d44b6c124877405e99920a2fe96``):
  ``gen_ai.client.operation.duration``, ``...operation.time_to_first_chunk``,
  ``...operation.time_per_output_chunk`` and the ``gen_ai.client.token.usage`` histogram.
- ``gen_ai_latest_experimental``: the current names, checked against ``model/gen-ai/
  token-metrics.yaml`` at commit ``9b2ce3b4e6b351a44025a289eefc1a6f6108a938`` and the
  repository's migration guide (PRs #521 and #374): ``gen_ai.client.inference.duration``,
  ``...inference.time_to_first_chunk``, ``...inference.time_per_output_chunk``; the token
  histogram replaced by ``gen_ai.client.inference.usage.*`` counters (``gen_ai.token.modality``
  required) and the per-operation histograms ``gen_ai.client.inference.operation.*``. No span
  attribute the sidecar sets was renamed there (``gen_ai.usage.cache_creation.input_tokens``
  became ``...cache_write...``; the sidecar never set it), so spans are the same either way.
  The YAML gives no bucket boundaries; the advised ones below are from ``gen-ai-metrics.md``.

What the sidecar is: it observes every request as a *client* of the inference server beside
it (it sends the request and times the response stream exactly as a client would, minus
the client's own network), so it emits the ``gen_ai.client.*`` metrics and a CLIENT span.
It does not emit the ``gen_ai.server.*`` metrics: those are the model server's own account
(time to *generate* the first token), which vLLM and friends export themselves; the
sidecar's figures include the HTTP hop, tokenisation and queueing as a client sees them,
and two sources under one server name would be summed together by any dashboard.

Names the conventions do not define live under ``llm_sidecar.*``, except the span events
``gen_ai.first_token`` and ``gen_ai.first_answer_token``, kept under the names they shipped
with (the registry defines no event for the first chunk; its attribute
``gen_ai.response.time_to_first_chunk`` is set too).
"""

from __future__ import annotations

# -- GenAI attributes (semconv registry, gen_ai.*) ------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
# seconds (double) from the request to the first chunk of a streamed response
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS = (
    "gen_ai.usage.reasoning.output_tokens"  # also llm_sidecar.usage.reasoning_tokens
)
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"  # default names only
GEN_AI_TOKEN_MODALITY = "gen_ai.token.modality"  # latest names: required on usage counters
# The token-metrics doc: "When the provider does not break usage down by modality and the
# modality cannot be reliably determined, instrumentations SHOULD report the tokens under the
# `unknown` modality." The usage blocks the sidecar reads (OpenAI-style, vLLM, llama.cpp, ...)
# give one total that may include image or audio tokens of a multimodal model.
GEN_AI_TOKEN_MODALITY_UNKNOWN = "unknown"

# gen_ai.operation.name well-known values used by the route table (sidecar/base/routes.py).
GEN_AI_OPERATION_CHAT = "chat"
GEN_AI_OPERATION_TEXT_COMPLETION = "text_completion"

# gen_ai.provider.name: the *API flavour* the request speaks, not who trained the model
# ("acts as a discriminator that identifies the GenAI telemetry format flavor"). vLLM,
# SGLang and friends serving /v1/chat/completions speak OpenAI's API, so ``openai``;
# server.address and gen_ai.request.model tell the real system. Engine-native APIs have no
# well-known value; the conventions allow a custom one, so they are named after the engine.
GEN_AI_PROVIDER_OPENAI = "openai"  # well-known
GEN_AI_PROVIDER_ANTHROPIC = "anthropic"  # well-known
GEN_AI_PROVIDER_TGI = "tgi"  # custom: Hugging Face Text Generation Inference native API
GEN_AI_PROVIDER_OLLAMA = "ollama"  # custom: Ollama native API
GEN_AI_PROVIDER_LLAMA_CPP = "llama.cpp"  # custom: llama.cpp server native API
GEN_AI_PROVIDER_TRITON = "triton"  # custom: NVIDIA Triton generate extension

GEN_AI_TOKEN_TYPE_INPUT = "input"
GEN_AI_TOKEN_TYPE_OUTPUT = "output"

# -- HTTP, server, URL, error (stable) ---------------------------------------------------------
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_REQUEST_METHOD_ORIGINAL = "http.request.method_original"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_TEMPLATE = "url.template"  # low-cardinality route template (HTTP client spans)
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

HTTP_KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)
HTTP_METHOD_OTHER = "_OTHER"

# -- llm_sidecar.* (ours: what the conventions do not define) --------------------------------
LLM_SIDECAR_OUTCOME = "llm_sidecar.outcome"  # ok | error | cancelled, as the Prometheus label
LLM_SIDECAR_CANCELLED = "llm_sidecar.cancelled"  # true only when the client went away
LLM_SIDECAR_STREAMED = "llm_sidecar.streamed"  # the response was read as a token stream
LLM_SIDECAR_TTFB = "llm_sidecar.time_to_first_byte"  # seconds (double)
LLM_SIDECAR_TTFT = "llm_sidecar.time_to_first_token"  # seconds
LLM_SIDECAR_TTFAT = "llm_sidecar.time_to_first_answer_token"  # seconds, when != TTFT
LLM_SIDECAR_TPOT = "llm_sidecar.time_per_output_token"  # seconds
LLM_SIDECAR_TPS = "llm_sidecar.output_tokens_per_second"  # tokens/s of decode
LLM_SIDECAR_TOKENS_FROM_USAGE = (
    "llm_sidecar.usage.reported"  # false: output counted from the stream
)
# Where gen_ai.usage.output_tokens came from: usage | engine | estimated (none: not set).
LLM_SIDECAR_TOKEN_COUNT_SOURCE = "llm_sidecar.usage.token_count_source"
# true when gen_ai.usage.output_tokens is the sidecar's count of stream events, not the server's.
LLM_SIDECAR_OUTPUT_TOKENS_ESTIMATED = "llm_sidecar.usage.output_tokens_estimated"
# Set beside gen_ai.usage.reasoning.output_tokens (the registry's name) for queries that read
# the sidecar's own namespace.
LLM_SIDECAR_REASONING_TOKENS = "llm_sidecar.usage.reasoning_tokens"
LLM_SIDECAR_PARSE_ERRORS = "llm_sidecar.stream.parse_errors"
LLM_SIDECAR_STREAM_ERROR_TYPE = "llm_sidecar.stream.error_type"  # the server's own error type
LLM_SIDECAR_TOKEN_KIND = "llm_sidecar.token.kind"  # on first-token events: answer|reasoning|tool
# The engine's own account, when its stream reports one (Ollama, llama.cpp), in seconds.
LLM_SIDECAR_ENGINE_LOAD = "llm_sidecar.engine.load_time"
LLM_SIDECAR_ENGINE_PREFILL = "llm_sidecar.engine.prefill_time"
LLM_SIDECAR_ENGINE_DECODE = "llm_sidecar.engine.decode_time"
# Waiting in the engine's queue (vLLM per-request metrics, TGI x-queue-time, SGLang meta_info).
LLM_SIDECAR_ENGINE_QUEUE = "llm_sidecar.engine.queue_time"
# What the sidecar itself added, in seconds, each way (see sidecar/measure/timeline.py).
LLM_SIDECAR_OVERHEAD_REQUEST = "llm_sidecar.overhead.request"
LLM_SIDECAR_OVERHEAD_RESPONSE = "llm_sidecar.overhead.response"

# The request's own objectives (sidecar/measure/objectives.py): seconds, where each came
# from (header | default), the verdicts (booleans; absent when not judged), and the names of
# objective headers that were present but ignored (ttft, tpot).
LLM_SIDECAR_OBJECTIVE_TTFT = "llm_sidecar.objective.ttft"
LLM_SIDECAR_OBJECTIVE_TPOT = "llm_sidecar.objective.tpot"
LLM_SIDECAR_OBJECTIVE_TTFT_SOURCE = "llm_sidecar.objective.ttft.source"
LLM_SIDECAR_OBJECTIVE_TPOT_SOURCE = "llm_sidecar.objective.tpot.source"
LLM_SIDECAR_OBJECTIVE_TTFT_MET = "llm_sidecar.objective.ttft.met"
LLM_SIDECAR_OBJECTIVE_TPOT_MET = "llm_sidecar.objective.tpot.met"
LLM_SIDECAR_OBJECTIVE_MET = "llm_sidecar.objective.met"  # ok 2xx and every judged objective met
LLM_SIDECAR_OBJECTIVE_INVALID = "llm_sidecar.objective.invalid"
# How much of the prompt the prefix cache held: none | partial | most | unknown
# (sidecar/measure/cache_class.py); the counts are gen_ai.usage.*input_tokens.
LLM_SIDECAR_CACHE_CLASS = "llm_sidecar.cache.class"
# Tool calls of a streamed response: seconds to the first piece of the first call, how many
# calls, and per call the seconds from its first piece to its last (parallel calls apart).
LLM_SIDECAR_TTFTC = "llm_sidecar.time_to_first_tool_call"
LLM_SIDECAR_TOOL_CALLS = "llm_sidecar.tool_calls.count"
LLM_SIDECAR_TOOL_CALL_ASSEMBLY = "llm_sidecar.tool_calls.assembly_time"

# -- span events ---------------------------------------------------------------------------------
EVENT_FIRST_TOKEN = "gen_ai.first_token"
EVENT_FIRST_ANSWER_TOKEN = "gen_ai.first_answer_token"
# A stream the upstream sent nothing for --stall-seconds, at its last byte (once a stream).
EVENT_STALLED = "llm_sidecar.stalled"
LLM_SIDECAR_STALL_PHASE = "llm_sidecar.stall.phase"  # head | first_token | decode
LLM_SIDECAR_STALL_SECONDS = "llm_sidecar.stall.threshold"  # seconds: --stall-seconds

# -- metrics (GenAI client metrics: names, units, advised ExplicitBucketBoundaries) ------------
# A "chunk" is a stream event that carries output (content, reasoning or a tool call), the
# events TTFT and ITL are measured on: a role-only first chunk carries nothing and is not one.
METRIC_CLIENT_OPERATION_DURATION = (
    "gen_ai.client.operation.duration"  # every request, error.type on errors
)
METRIC_CLIENT_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"  # streamed only
METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK = (
    "gen_ai.client.operation.time_per_output_chunk"  # per chunk after the first
)
METRIC_CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"
# The current names (OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental), see above.
SEMCONV_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
SEMCONV_OPT_IN_GEN_AI_LATEST = "gen_ai_latest_experimental"
SEMCONV_GEN_AI_COMMIT = "9b2ce3b4e6b351a44025a289eefc1a6f6108a938"
METRIC_CLIENT_INFERENCE_DURATION = "gen_ai.client.inference.duration"
METRIC_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK = "gen_ai.client.inference.time_to_first_chunk"
METRIC_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.inference.time_per_output_chunk"
# counters, summed over requests ("_total" in Prometheus)
METRIC_CLIENT_INFERENCE_USAGE_INPUT_TOKENS = "gen_ai.client.inference.usage.input_tokens"
METRIC_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS = "gen_ai.client.inference.usage.output_tokens"
METRIC_CLIENT_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS = (
    "gen_ai.client.inference.usage.cache_read.input_tokens"
)
METRIC_CLIENT_INFERENCE_USAGE_CACHE_WRITE_INPUT_TOKENS = (
    "gen_ai.client.inference.usage.cache_write.input_tokens"
)
METRIC_CLIENT_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS = (
    "gen_ai.client.inference.usage.reasoning.output_tokens"
)
# histograms, one observation per request
METRIC_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS = "gen_ai.client.inference.operation.input_tokens"
METRIC_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS = "gen_ai.client.inference.operation.output_tokens"
UNIT_SECONDS = "s"
UNIT_TOKENS = "{token}"

# -- metrics in our own namespace, recorded beside the GenAI ones ---------------------------
# No GenAI convention names these (checked against the genai repository's gen-ai-metrics.md,
# client-inference.md and token-metrics.yaml at the commits above): its metrics time the
# operation, the first chunk and each chunk, and count tokens; ``gen_ai.invoke_agent.
# tool_calls`` counts an *agent invocation's* tool calls (one point per invoke_agent span),
# not an inference response's, and nothing times tool calls, splits the first chunk by prefix
# cache or judges a request's own objectives. So ``llm_sidecar.client.*``: ``client`` as in
# ``gen_ai.client.*`` (the sidecar measures as the server's client), and apart from the span
# attributes of the same figures (``llm_sidecar.time_to_first_tool_call`` ...).
METRIC_OWN_TTFT_BY_CACHE = (
    "llm_sidecar.client.time_to_first_token_by_cache"  # + llm_sidecar.cache.class
)
METRIC_OWN_TIME_TO_FIRST_TOOL_CALL = "llm_sidecar.client.time_to_first_tool_call"
METRIC_OWN_TOOL_CALL_ASSEMBLY = (
    "llm_sidecar.client.tool_call.assembly_duration"  # one point per call
)
METRIC_OWN_TOOL_CALLS = "llm_sidecar.client.tool_calls"  # per response with a call
METRIC_OWN_REQUEST_OBJECTIVES = "llm_sidecar.client.request.objectives"  # counter, + name, result
METRIC_OWN_REQUEST_OBJECTIVE_INVALID = (
    "llm_sidecar.client.request.objective_invalid"  # counter, + name
)
LLM_SIDECAR_OBJECTIVE_NAME = "llm_sidecar.objective.name"  # ttft | tpot | all
LLM_SIDECAR_OBJECTIVE_RESULT = "llm_sidecar.objective.result"  # met | missed
UNIT_TOOL_CALLS = "{tool_call}"  # as gen_ai.invoke_agent.tool_calls
UNIT_REQUESTS = "{request}"
UNIT_HEADERS = "{header}"
METRIC_OWN_STREAMS_STALLED = "llm_sidecar.client.streams.stalled"  # observable gauge, + phase
UNIT_STREAMS = "{stream}"

# gen-ai-metrics.md gives the three duration metrics the same boundaries.
BUCKETS_CLIENT_SECONDS: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
BUCKETS_TOKEN_USAGE: tuple[float, ...] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

# -- resource ------------------------------------------------------------------------------------
SERVICE_NAME = "service.name"
SERVICE_VERSION = "service.version"
SERVICE_INSTANCE_ID = "service.instance.id"
DEFAULT_SERVICE_NAME = "llm-sidecar"
INSTRUMENTATION_SCOPE = "llm_sidecar"

# Downward-API environment variables -> Kubernetes resource attributes. OTEL_RESOURCE_ATTRIBUTES
# wins over these when both name the same attribute.
K8S_ENV_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("K8S_POD_NAME", "k8s.pod.name"),
    ("K8S_POD_UID", "k8s.pod.uid"),
    ("K8S_NAMESPACE_NAME", "k8s.namespace.name"),
    ("K8S_NODE_NAME", "k8s.node.name"),
    ("K8S_CONTAINER_NAME", "k8s.container.name"),
    ("K8S_DEPLOYMENT_NAME", "k8s.deployment.name"),
)

__all__ = [name for name in dir() if name.isupper()]
