"""Histogram bucket bounds, as named constants shared by metrics, config and SLO rules.

Starting points are the OpenTelemetry GenAI semantic conventions' advised boundaries. For
TTFT and ITL/TPOT those of the *server* metrics (``gen_ai.server.time_to_first_token`` from
1 ms, ``gen_ai.server.time_per_output_token``), which step by round numbers, where the
client chunk metrics' boundaries double from 0.01 to 81.92. Only the bounds are borrowed:
the sidecar measures as a client and emits no ``gen_ai.server.*`` metric (see
``sidecar/export/semconv.py``). End to end starts from the doubling 0.01 .. 81.92 of the
request-duration metrics, tokens from the powers of 4 of ``gen_ai.client.token.usage``
(now ``gen_ai.client.inference.operation.*_tokens``), each refined where a latency SLO
threshold needs an exact bound: a latency SLI reads the bucket *at* its
threshold, so every threshold a user can choose must be one of these numbers.
"""

from __future__ import annotations

__all__ = [
    "TTFT_BUCKETS",
    "ITL_BUCKETS",
    "E2E_BUCKETS",
    "TPS_BUCKETS",
    "TOKEN_COUNT_BUCKETS",
    "ENGINE_PHASE_BUCKETS",
    "OVERHEAD_BUCKETS",
    "TOOL_CALL_COUNT_BUCKETS",
]

# Seconds. semconv TTFT: 0.001 .. 10; added 0.15-0.4, 1.5-3 and a long-prefill tail.
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
)  # fmt: skip

# Seconds, for inter-token latency and TPOT. semconv TPOT: 0.01 .. 2.5; added the
# sub-10 ms range of fast GPUs and 20-40 ms, where most decode SLOs sit.
ITL_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip

# Seconds, request end to end. semconv doubles from 0.01 to 81.92; round numbers are
# easier to write SLOs against, and generations can run for minutes.
E2E_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0,
    60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)  # fmt: skip

# Output tokens per second of decode, per request.
TPS_BUCKETS: tuple[float, ...] = (
    1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 75.0, 100.0, 125.0,
    150.0, 200.0, 300.0, 500.0, 1000.0,
)  # fmt: skip

# Tokens per request: semconv gen_ai.client.token.usage (gen_ai.client.inference.operation.*),
# powers of 4.
TOKEN_COUNT_BUCKETS: tuple[float, ...] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
)  # fmt: skip

# Seconds, engine-reported load / prefill / decode / queue phases (Ollama, llama.cpp,
# vLLM, TGI, SGLang).
ENGINE_PHASE_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip

# Seconds the sidecar itself adds to one request, one way (llm_sidecar_overhead_seconds):
# tens of microseconds when healthy, so the low end is fine; the top shows a stuck loop.
OVERHEAD_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip

# Tool calls in one response (llm_tool_calls_per_response): one call is the common case,
# parallel calls a handful; the top is the most a response's record keeps (MAX_TOOL_CALLS).
TOOL_CALL_COUNT_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128)
