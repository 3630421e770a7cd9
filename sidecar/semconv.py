"""Every OpenTelemetry name the sidecar emits: span and metric attributes, event and metric
names, well-known values and recommended bucket boundaries. One module, so a rename is one
line and a reviewer can check the whole vocabulary against the spec in one place.

Sources: the OpenTelemetry GenAI semantic conventions (``docs/gen-ai/gen-ai-spans.md``,
``gen-ai-metrics.md`` and the ``gen_ai`` attribute registry, status Development), the
stable HTTP, server, URL and error attributes, and the Kubernetes resource attributes.
Names the conventions do not define live under ``llm_sidecar.*``; the two exceptions are
``gen_ai.request.stream`` and the ``gen_ai.first_token`` events, which the issue asked for
by name (several GenAI instrumentations already use ``gen_ai.request.stream``).
"""

from __future__ import annotations

# -- GenAI attributes (semconv registry, gen_ai.*) ------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"  # not (yet) in the registry; see above
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"

# gen_ai.operation.name well-known values used by the route table (sidecar/routes.py).
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

HTTP_KNOWN_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
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
LLM_SIDECAR_TOKENS_FROM_USAGE = "llm_sidecar.usage.reported"  # false: output counted from the stream
# Where gen_ai.usage.output_tokens came from: usage | engine | estimated (none: not set).
LLM_SIDECAR_TOKEN_COUNT_SOURCE = "llm_sidecar.usage.token_count_source"
# true when gen_ai.usage.output_tokens is the sidecar's count of stream events, not the server's.
LLM_SIDECAR_OUTPUT_TOKENS_ESTIMATED = "llm_sidecar.usage.output_tokens_estimated"
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
# What the sidecar itself added, in seconds, each way (see sidecar/timeline.py).
LLM_SIDECAR_OVERHEAD_REQUEST = "llm_sidecar.overhead.request"
LLM_SIDECAR_OVERHEAD_RESPONSE = "llm_sidecar.overhead.response"

# -- span events ---------------------------------------------------------------------------------
EVENT_FIRST_TOKEN = "gen_ai.first_token"
EVENT_FIRST_ANSWER_TOKEN = "gen_ai.first_answer_token"

# -- metrics (GenAI semconv names, units and recommended ExplicitBucketBoundaries) ---------------
METRIC_SERVER_TTFT = "gen_ai.server.time_to_first_token"
METRIC_SERVER_TPOT = "gen_ai.server.time_per_output_token"
METRIC_SERVER_REQUEST_DURATION = "gen_ai.server.request.duration"
METRIC_CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"
UNIT_SECONDS = "s"
UNIT_TOKENS = "{token}"

BUCKETS_SERVER_TTFT: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
BUCKETS_SERVER_TPOT: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
BUCKETS_SERVER_REQUEST_DURATION: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
BUCKETS_TOKEN_USAGE: tuple[float, ...] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

# -- resource ------------------------------------------------------------------------------------
SERVICE_NAME = "service.name"
SERVICE_VERSION = "service.version"
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
