"""What a finished request's span says: its ``error.type`` and the attributes read off the
request's summary (GenAI usage and response, the sidecar's latency figures, the engine's
figures, the objectives' verdicts), every client-supplied string bounded.

Apart from the span's life (:mod:`sidecar.export.spans`: start, propagation, end) because this
is a pure mapping from a summary (sidecar/measure/summary.py) to a dict: no span, no provider,
no clock, so a new attribute is one line here and its test needs no tracer. Content (prompts, completions, headers, query
strings) never appears: the timeline does not hold it in the first place.
"""

from __future__ import annotations

from typing import Any

from ..measure.summary import RequestSummary
from ..measure.timeline import MAX_FINISH_REASONS, TokenCountSource
from . import semconv as sc

__all__ = [
    "MAX_METHOD",
    "bounded",
    "error_type_of",
    "genai_end_attributes",
    "objective_attributes",
    "where_time_went_attributes",
]

# Client-supplied strings are bounded before they become attributes.
MAX_STRING = 256
MAX_METHOD = 32


def bounded(value: str, limit: int = MAX_STRING) -> str:
    return value if len(value) <= limit else value[:limit]


def error_type_of(t: RequestSummary) -> str | None:
    """``error.type`` for a finished request, or None when it did not end in an error.

    Values: the HTTP status as a string for an upstream 5xx (and, as HTTP client spans
    do, a 4xx); otherwise the sidecar's own cause: ``upstream_unreachable``,
    ``upstream_timeout``, ``upstream_disconnected``, ``upstream_read_timeout``,
    ``upstream_invalid_response`` (the upstream broke HTTP/1.1 framing),
    ``stream_error`` (an error event inside a 200 stream), ``internal``. A cancelled request
    is not an error (the client left; ``llm_sidecar.cancelled`` says so). Read from the
    request's verdict (:meth:`~sidecar.base.outcomes.Verdict.otel_error_type`).
    """
    return t.verdict.otel_error_type(t.status)


def objective_attributes(t: RequestSummary, attrs: dict[str, Any]) -> None:
    """The request's objectives and verdicts, its cache class and tool-call timings."""
    if t.objectives_invalid:
        attrs[sc.LLM_SIDECAR_OBJECTIVE_INVALID] = t.objectives_invalid
    judgement = t.judgement
    if judgement is not None:
        for key, source_key, met_key, value, from_header, met in (
            (sc.LLM_SIDECAR_OBJECTIVE_TTFT, sc.LLM_SIDECAR_OBJECTIVE_TTFT_SOURCE, sc.LLM_SIDECAR_OBJECTIVE_TTFT_MET,
             judgement.ttft_objective, judgement.ttft_from_header, judgement.ttft_met),
            (sc.LLM_SIDECAR_OBJECTIVE_TPOT, sc.LLM_SIDECAR_OBJECTIVE_TPOT_SOURCE, sc.LLM_SIDECAR_OBJECTIVE_TPOT_MET,
             judgement.tpot_objective, judgement.tpot_from_header, judgement.tpot_met),
        ):  # fmt: skip
            if value is not None:
                attrs[key] = value
                attrs[source_key] = "header" if from_header else "default"
            if met is not None:
                attrs[met_key] = met
        if judgement.met is not None:
            attrs[sc.LLM_SIDECAR_OBJECTIVE_MET] = judgement.met
    if t.cache is not None:  # a stream with a first token
        attrs[sc.LLM_SIDECAR_CACHE_CLASS] = t.cache.value
    if t.time_to_first_tool_call is not None:
        attrs[sc.LLM_SIDECAR_TTFTC] = t.time_to_first_tool_call
        attrs[sc.LLM_SIDECAR_TOOL_CALLS] = t.tool_call_count
        attrs[sc.LLM_SIDECAR_TOOL_CALL_ASSEMBLY] = t.tool_call_assembly


def genai_end_attributes(t: RequestSummary, attrs: dict[str, Any]) -> None:
    """The GenAI response and usage attributes and the sidecar's own figures of a GenAI call."""
    # gen_ai.request.stream is the request's own flag when its body was JSON; otherwise a
    # response read as a token stream proves the client asked for one.
    if t.request_stream is not None:
        attrs[sc.GEN_AI_REQUEST_STREAM] = t.request_stream
    elif t.streamed:
        attrs[sc.GEN_AI_REQUEST_STREAM] = True
    if t.ttfb is not None:  # the upstream's head came
        attrs[sc.LLM_SIDECAR_STREAMED] = t.streamed
    if t.streamed and t.ttft is not None:
        attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = t.ttft
    if t.response_model:
        attrs[sc.GEN_AI_RESPONSE_MODEL] = bounded(t.response_model)
    if t.response_id:
        attrs[sc.GEN_AI_RESPONSE_ID] = bounded(t.response_id)
    if t.finish_reasons:
        # the record keeps no more than MAX_FINISH_REASONS; the cut stays should that change
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(
            bounded(r, 64) for r in t.finish_reasons[:MAX_FINISH_REASONS]
        )
    value: float | None  # counts here, seconds in the loop below
    for key, value in (
        (sc.GEN_AI_USAGE_INPUT_TOKENS, t.input_tokens),
        (sc.GEN_AI_USAGE_OUTPUT_TOKENS, t.output_tokens),
        (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, t.cached_input_tokens),
        (sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, t.reasoning_tokens),
        (sc.LLM_SIDECAR_REASONING_TOKENS, t.reasoning_tokens),
    ):
        if value is not None:
            attrs[key] = value
    if t.output_tokens is not None:
        source = t.token_count_source
        attrs[sc.LLM_SIDECAR_TOKENS_FROM_USAGE] = t.tokens_from_usage
        attrs[sc.LLM_SIDECAR_TOKEN_COUNT_SOURCE] = source.value
        attrs[sc.LLM_SIDECAR_OUTPUT_TOKENS_ESTIMATED] = source is TokenCountSource.ESTIMATED
    for key, value in (
        (sc.LLM_SIDECAR_TTFB, t.ttfb),
        (sc.LLM_SIDECAR_TTFT, t.ttft),
        (sc.LLM_SIDECAR_TTFAT, t.ttfat),
        (sc.LLM_SIDECAR_TPOT, t.tpot),
        (sc.LLM_SIDECAR_TPS, t.tokens_per_second),
    ):
        if value is not None:
            attrs[key] = value
    engine = t.engine
    if engine is not None:
        for key, value in (
            (sc.LLM_SIDECAR_ENGINE_LOAD, engine.load_seconds),
            (sc.LLM_SIDECAR_ENGINE_PREFILL, engine.prefill_seconds),
            (sc.LLM_SIDECAR_ENGINE_DECODE, engine.decode_seconds),
        ):
            if value is not None:
                attrs[key] = value
    where_time_went_attributes(t, attrs)
    if t.parse_errors:
        attrs[sc.LLM_SIDECAR_PARSE_ERRORS] = t.parse_errors
    if t.stream_error_type:
        attrs[sc.LLM_SIDECAR_STREAM_ERROR_TYPE] = bounded(t.stream_error_type, 64)


def where_time_went_attributes(t: RequestSummary, attrs: dict[str, Any]) -> None:
    """Span attributes for the engine's queue time and the sidecar's own cost each way
    (the engine's load/prefill/decode are set beside the other figures)."""
    engine = t.engine
    if engine is not None and engine.queue_seconds is not None:
        attrs[sc.LLM_SIDECAR_ENGINE_QUEUE] = engine.queue_seconds
    overhead = t.request_overhead
    if overhead is not None:
        attrs[sc.LLM_SIDECAR_OVERHEAD_REQUEST] = overhead
    overhead = t.response_overhead
    if overhead is not None:
        attrs[sc.LLM_SIDECAR_OVERHEAD_RESPONSE] = overhead
