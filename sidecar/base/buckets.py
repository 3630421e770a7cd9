"""Histogram bucket bounds, as named constants shared by metrics, config and SLO rules.

The ranges start from the OpenTelemetry GenAI semantic conventions' advised boundaries (for
TTFT and ITL/TPOT those of the *server* metrics, which step by round numbers; only the bounds
are borrowed: the sidecar measures as a client and emits no ``gen_ai.server.*`` metric, see
``sidecar/export/semconv.py``), thinned to what the SLOs and panels read: a latency SLI reads
the bucket *at* its threshold, so every threshold a user can choose must be one of these
numbers, and every other bound only sets how far a panel's quantile can be off
(docs/metrics.md, "Bucket layouts").
"""

from __future__ import annotations

__all__ = [
    "TTFT_BUCKETS",
    "TTFT_BY_CACHE_BUCKETS",
    "TTFB_BUCKETS",
    "ITL_BUCKETS",
    "E2E_BUCKETS",
    "TPS_BUCKETS",
    "TOKEN_COUNT_BUCKETS",
    "ENGINE_PHASE_BUCKETS",
    "OVERHEAD_BUCKETS",
    "TOOL_CALL_COUNT_BUCKETS",
    "TOOL_CALL_SECONDS_BUCKETS",
]

# Every layout below is what its readers need and no more: each bound costs one series for
# every model (and label value) on every pod of a fleet. A latency SLI reads the bucket at its
# threshold, so the thresholds a spec may choose are these bounds; a dashboard quantile lies
# within the bucket that holds it, so the gap between two bounds is the most a p50/p90/p99
# panel can be off by (docs/metrics.md, "Bucket layouts", has the table).

# Seconds. 1-2.5-5 steps from the semconv TTFT range, with 2 (the default objective) in place
# of 2.5, from 0.1 s (a first token sooner is a cache or a tiny prompt: read as "under 0.1 s")
# to 10 s (a longer prefill reads as "at least 10 s").
TTFT_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)

# Seconds, for inter-token latency, TPOT and the capacity curve (one layout, so the TPOT
# objective's threshold is always a bound of the per-band ITL the capacity rules read).
# 25-100 ms, where decode objectives sit, in steps of 25 ms; a gap over 250 ms is a stall.
# Under 25 ms (a fast GPU) meets every objective here: its quantiles are interpolated.
ITL_BUCKETS: tuple[float, ...] = (0.025, 0.05, 0.075, 0.1, 0.25)

# Seconds, request end to end: generations run from a second to minutes; the objectives a
# spec picks sit at 30 s to 2 min (60 s the default), the rest tells short from long.
E2E_BUCKETS: tuple[float, ...] = (2.5, 10.0, 30.0, 60.0, 120.0)

# Seconds to the response headers: under 10 ms is a cache or an error, seconds a queue.
TTFB_BUCKETS: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)

# Seconds, TTFT by prefix-cache class: the classes are compared with each other (a hit
# should be several times faster: a factor of 4 or 5 between bounds tells them apart), and a
# class's objective is one of these; the plain TTFT histogram has the fine layout.
TTFT_BY_CACHE_BUCKETS: tuple[float, ...] = (0.25, 1.0, 5.0)

# Output tokens per second of decode, per request: its panel's mean is exact (sum over
# count); the bounds tell a slow decode from a usual and a fast one.
TPS_BUCKETS: tuple[float, ...] = (10.0, 30.0, 100.0)

# Tokens per request: from 64 in powers of 16 (semconv gen_ai.client.token.usage has powers of 4).
TOKEN_COUNT_BUCKETS: tuple[float, ...] = (64, 1024, 16384)

# Seconds, engine-reported load / prefill / decode / queue phases (Ollama, llama.cpp,
# vLLM, TGI, SGLang).
ENGINE_PHASE_BUCKETS: tuple[float, ...] = (0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0)

# Seconds the sidecar itself adds to one request, one way (llm_sidecar_overhead_seconds):
# tens of microseconds when healthy, so the low end is fine; the top shows a stuck loop.
OVERHEAD_BUCKETS: tuple[float, ...] = (0.0001, 0.001, 0.01, 1.0)

# Tool calls in one response (llm_tool_calls_per_response): its panel reads the mean (sum
# over count); the one bound tells a single call from parallel ones.
TOOL_CALL_COUNT_BUCKETS: tuple[float, ...] = (1,)

# Seconds to an agent's tool call (the request to its first piece; its first piece to its
# last argument piece): a call sent whole is 0, streamed arguments take tenths of a second to
# seconds, reasoning before the call seconds more: a factor of 10 between bounds.
TOOL_CALL_SECONDS_BUCKETS: tuple[float, ...] = (0.1, 1.0, 10.0)
