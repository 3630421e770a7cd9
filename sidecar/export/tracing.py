"""OpenTelemetry: a GenAI span per proxied request, W3C context propagation, opt-in GenAI
metrics, and OTLP export configured by the standard ``OTEL_*`` environment variables.

Three parts, each usable alone:

- :class:`RequestTelemetry` is the proxy's :class:`~sidecar.relay.data.proxy.RequestTracer` (``start``
  and ``inject``) and a :data:`~sidecar.relay.data.proxy.Recorder` (``record``) that ends the span from
  the finished timeline and records the OTel metrics. Providers are injected, never taken
  from the global API state, so tests hand in in-memory ones.
- :func:`providers_from_env` builds the SDK tracer and meter providers with OTLP exporters,
  or nothing at all when no OTLP endpoint is configured (the proxy then gets ``tracer=None``
  and pays nothing per request).
- :func:`resource_attributes` derives the resource from ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES`` and Kubernetes downward-API variables.

Span kind is CLIENT. The GenAI conventions say an inference span "SHOULD be CLIENT ...
when the GenAI call happens over instrumented protocol such as HTTP", with ``server.*``
naming the GenAI server; the sidecar's one span describes exactly that call to the
inference server next to it. The upstream's own SERVER span (vLLM's, for instance) then
becomes its child, which is the CLIENT -> SERVER pair service graphs are built from. A
client's own span, when it sent ``traceparent``, is the parent.

Timing: the timeline holds ``time.perf_counter()`` values. :meth:`RequestTelemetry.start`
pairs one wall-clock reading (``time.time_ns()``) with one monotonic reading, and every
timestamp of the request is placed on the wall clock through that pair, so span start,
events and end are mutually consistent to the nanosecond and immune to clock steps.

Telemetry never breaks the relay: every entry point logs and swallows its own exceptions.
Content (prompts, completions, headers, query strings) never reaches a span; the timeline
does not hold it in the first place.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import structlog
from opentelemetry import trace as trace_api
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from . import semconv as sc
from ..base.labels import OTHER as OTHER_MODEL, UNKNOWN as UNKNOWN_MODEL
from ..base.routes import OTHER, ROUTES
from ..base.outcomes import Outcome
from ..measure.cache_class import cache_class
from ..measure.objectives import ObjectiveDefaults, RequestObjectives, judge
from ..measure.timeline import MAX_FINISH_REASONS, RequestTimeline, TokenCountSource
from .otel_own_metrics import OwnInstruments

__all__ = [
    "RequestTelemetry",
    "TelemetryProviders",
    "providers_from_env",
    "resource_attributes",
    "wanted_exporters",
    "otlp_protocol",
    "PROVIDER_BY_ROUTE",
]

_log = structlog.get_logger("sidecar.tracing")

# The API flavour each route speaks (see semconv.py for why vLLM's OpenAI routes are "openai").
PROVIDER_BY_ROUTE: dict[str, str] = {
    "/v1/chat/completions": sc.GEN_AI_PROVIDER_OPENAI,
    "/v1/completions": sc.GEN_AI_PROVIDER_OPENAI,
    "/v1/responses": sc.GEN_AI_PROVIDER_OPENAI,
    "/v1/messages": sc.GEN_AI_PROVIDER_ANTHROPIC,
    "/generate_stream": sc.GEN_AI_PROVIDER_TGI,
    "/generate": sc.GEN_AI_PROVIDER_TGI,
    "/": sc.GEN_AI_PROVIDER_TGI,
    "/api/chat": sc.GEN_AI_PROVIDER_OLLAMA,
    "/api/generate": sc.GEN_AI_PROVIDER_OLLAMA,
    "/completion": sc.GEN_AI_PROVIDER_LLAMA_CPP,
    "/v2/models/{model}/generate_stream": sc.GEN_AI_PROVIDER_TRITON,
}

# Client-supplied strings are bounded before they become attributes.
_MAX_STRING = 256
_MAX_FINISH_REASONS = MAX_FINISH_REASONS  # the record keeps no more
_MAX_METHOD = 32


def _bounded(value: str, limit: int = _MAX_STRING) -> str:
    return value if len(value) <= limit else value[:limit]


# -- propagation ------------------------------------------------------------------------------


class _HeaderGetter(Getter):
    """Reads aiohttp's case-insensitive multidict; repeated ``tracestate``/``baggage`` headers
    are one list (W3C allows splitting them), ``traceparent`` keeps only its first value."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        getall = getattr(carrier, "getall", None)
        if getall is not None:
            values = getall(key, None)
        else:
            value = carrier.get(key)
            values = None if value is None else [value]
        if not values:
            return None
        if len(values) > 1 and key != "traceparent":
            return [",".join(values)]
        return list(values)

    def keys(self, carrier: Any) -> list[str]:
        return list(carrier.keys())


_GETTER = _HeaderGetter()
_TRACE_HEADERS = ("traceparent", "tracestate")


class _Trace:
    """The handle kept on ``timeline.trace``: the span, its parent context, and the clock pair
    that maps the timeline's monotonic seconds onto epoch nanoseconds."""

    __slots__ = ("span", "parent", "wall_ns", "mono")

    def __init__(self, parent: Context, wall_ns: int, mono: float) -> None:
        self.span: trace_api.Span = trace_api.INVALID_SPAN
        self.parent = parent
        self.wall_ns = wall_ns
        self.mono = mono

    def ns(self, t: float) -> int:
        return self.wall_ns + round((t - self.mono) * 1e9)


# -- the per-request part -----------------------------------------------------------------------


def _error_type(t: RequestTimeline) -> str | None:
    """``error.type`` for a finished request, or None when it did not end in an error.

    Values: the HTTP status as a string for an upstream 5xx (and, as HTTP client spans
    do, a 4xx); otherwise the sidecar's own cause: ``upstream_unreachable``,
    ``upstream_timeout``, ``upstream_disconnected``, ``upstream_read_timeout``,
    ``upstream_invalid_response`` (the upstream broke HTTP/1.1 framing),
    ``stream_error`` (an error event inside a 200 stream), ``internal``. A cancelled request
    is not an error (the client left; ``llm_sidecar.cancelled`` says so).
    """
    if t.outcome is Outcome.ERROR:
        if t.error_type == "upstream_status" and t.status is not None:
            return str(t.status)
        return t.error_type or "_OTHER"
    if t.outcome is Outcome.OK and t.status is not None and t.status >= 400:
        return str(t.status)
    return None


def genai_latest_names(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a comma list, read as the OTel contrib
    instrumentations read it: entries trimmed, case-insensitive) names
    ``gen_ai_latest_experimental``: then the current GenAI metric names are emitted."""
    env = os.environ if environ is None else environ
    entries = {e.strip().lower() for e in env.get(sc.SEMCONV_OPT_IN_ENV, "").split(",")}
    return sc.SEMCONV_OPT_IN_GEN_AI_LATEST in entries


class _Instruments:
    """The opt-in GenAI client metrics, with the conventions' advised bucket boundaries.

    ``latest``: the current names (see :mod:`sidecar.export.semconv`); otherwise the last
    released ones. Chosen once here, so the per-chunk path is the same either way."""

    def __init__(self, meter_provider, *, latest: bool = False) -> None:
        meter = meter_provider.get_meter(sc.INSTRUMENTATION_SCOPE, __version__)
        self.latest = latest
        self.own = OwnInstruments(meter_provider)  # our namespace: what the conventions do not name
        self.duration = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_DURATION if latest else sc.METRIC_CLIENT_OPERATION_DURATION,
            unit=sc.UNIT_SECONDS,
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_CLIENT_SECONDS,
        )  # fmt: skip
        self.ttfc = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK if latest else sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK,
            unit=sc.UNIT_SECONDS,
            description="Time to receive the first chunk, measured from when the client issues the "
            "generation request to when the first chunk is received in the response stream.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_CLIENT_SECONDS,
        )  # fmt: skip
        self.tpoc = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK if latest else sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK,
            unit=sc.UNIT_SECONDS,
            description="Time per output chunk, recorded for each chunk received after the first one.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_CLIENT_SECONDS,
        )  # fmt: skip
        if not latest:
            self.tokens = meter.create_histogram(
                sc.METRIC_CLIENT_TOKEN_USAGE, unit=sc.UNIT_TOKENS,
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=sc.BUCKETS_TOKEN_USAGE,
            )  # fmt: skip
            return
        # latest: per-request histograms and running counters (token-metrics.yaml)
        self.op_input = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of input (prompt) tokens used per inference operation.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_TOKEN_USAGE,
        )  # fmt: skip
        self.op_output = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of output (completion) tokens used per inference operation.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_TOKEN_USAGE,
        )  # fmt: skip
        counter = meter.create_counter
        self.usage_input = counter(
            sc.METRIC_CLIENT_INFERENCE_USAGE_INPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of input (prompt) tokens used, including cached tokens.",
        )  # fmt: skip
        self.usage_output = counter(
            sc.METRIC_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of output (completion) tokens used, including reasoning tokens.",
        )  # fmt: skip
        self.usage_cache_read = counter(
            sc.METRIC_CLIENT_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of input tokens served from a provider-managed cache.",
        )  # fmt: skip
        self.usage_reasoning = counter(
            sc.METRIC_CLIENT_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of output tokens used for reasoning (e.g. chain-of-thought, extended thinking).",
        )  # fmt: skip
        # cache_write.input_tokens: no server the sidecar reads reports cache writes; not created.


class RequestTelemetry:
    """One sidecar's OpenTelemetry: the proxy's tracer and a finishing recorder.

    ``tracer_provider``/``meter_provider`` may each be None (that signal is off).
    ``model_label`` is the sidecar's bounded model labeler: span names and metric attributes
    use the bounded name, so a client cannot mint unbounded span names or series; the raw
    requested model (truncated) is still the ``gen_ai.request.model`` span attribute.
    ``provider_name`` (the ``otel_provider_name`` setting) replaces the per-route
    ``gen_ai.provider.name`` (:data:`PROVIDER_BY_ROUTE`) on spans and metrics alike.
    """

    def __init__(
        self,
        upstream: str,
        *,
        tracer_provider=None,
        meter_provider=None,
        model_label: Callable[[str | None], str] | None = None,
        provider_name: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
        latest_genai_names: bool | None = None,
        objectives: ObjectiveDefaults | None = None,
    ) -> None:
        self._provider_name = provider_name
        self._objectives = objectives or ObjectiveDefaults()
        parts = urlsplit(upstream)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._server: dict[str, Any] = {sc.SERVER_ADDRESS: parts.hostname or "", sc.SERVER_PORT: port}
        self._model_label = model_label or (lambda m: m or UNKNOWN_MODEL)
        self._clock = clock
        self._tracer = (
            tracer_provider.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__) if tracer_provider is not None else None
        )
        if latest_genai_names is None:  # OTEL_SEMCONV_STABILITY_OPT_IN, as the contrib packages
            latest_genai_names = genai_latest_names()
        self._instruments = (
            _Instruments(meter_provider, latest=latest_genai_names) if meter_provider is not None else None
        )
        self._propagator = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])

    @property
    def tracing(self) -> bool:
        return self._tracer is not None

    @property
    def metrics(self) -> bool:
        return self._instruments is not None

    # -- RequestTracer -------------------------------------------------------------------------

    def start(self, headers: Mapping[str, str], timeline: RequestTimeline) -> None:
        """Start the span in the client's trace (from ``traceparent``) at ``timeline.start``."""
        if self._tracer is None:
            return
        try:
            self._start(headers, timeline)
        except Exception:
            _log.exception("trace_start_failed")

    def _start(self, headers: Mapping[str, str], t: RequestTimeline) -> None:
        mono = self._clock()
        handle = _Trace(self._propagator.extract(headers, getter=_GETTER), time.time_ns(), mono)
        name, attributes = self._span_start(t)
        span = self._tracer.start_span(  # type: ignore[union-attr]
            name,
            context=handle.parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=handle.ns(t.start),
        )
        handle.span = span
        t.trace = handle
        ctx = span.get_span_context()
        if ctx.is_valid and ctx.trace_flags.sampled:
            # Only a sampled span is exported, so only then may an exemplar point at it.
            t.trace_id = trace_api.format_trace_id(ctx.trace_id)

    def _span_start(self, t: RequestTimeline) -> tuple[str, dict[str, Any]]:
        method = t.method  # case-sensitive (RFC 9110): "get" is not a known method
        attrs: dict[str, Any] = dict(self._server)
        if method in sc.HTTP_KNOWN_METHODS:
            attrs[sc.HTTP_REQUEST_METHOD] = method
        else:
            attrs[sc.HTTP_REQUEST_METHOD] = sc.HTTP_METHOD_OTHER
            attrs[sc.HTTP_REQUEST_METHOD_ORIGINAL] = _bounded(t.method, _MAX_METHOD)
        route = ROUTES.get(t.route)
        if route is None or route is OTHER:
            # Not a GenAI API call (e.g. the upstream's /health or /metrics): an HTTP span.
            return (method if method in sc.HTTP_KNOWN_METHODS else "HTTP"), attrs
        attrs[sc.URL_TEMPLATE] = route.template
        attrs[sc.GEN_AI_OPERATION_NAME] = route.operation
        provider = self._provider(route.template)
        if provider is not None:
            attrs[sc.GEN_AI_PROVIDER_NAME] = provider
        if t.model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = _bounded(t.model)
        if t.request_max_tokens is not None:
            attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = t.request_max_tokens
        label = self._model_label(t.model or None)
        name = route.operation if label in (UNKNOWN_MODEL, OTHER_MODEL) else f"{route.operation} {label}"
        return name, attrs

    def _response_model_known(self, name: str) -> bool:
        known = getattr(self._model_label, "known", None)
        return known(name) if known is not None else False

    def _provider(self, template: str) -> str | None:
        return self._provider_name or PROVIDER_BY_ROUTE.get(template)

    def inject(self, timeline: RequestTimeline, headers: MutableMapping[str, str]) -> None:
        """Replace the client's ``traceparent``/``tracestate`` with this span's context (the
        trace id is the client's when it sent one) and forward baggage."""
        handle = timeline.trace
        if not isinstance(handle, _Trace):
            return
        try:
            popall = getattr(headers, "popall", None)
            for name in _TRACE_HEADERS:
                if popall is not None:
                    popall(name, None)
                else:
                    headers.pop(name, None)
            ctx = trace_api.set_span_in_context(handle.span, handle.parent)
            self._propagator.inject(headers, context=ctx)
        except Exception:
            _log.exception("trace_inject_failed")

    # -- Recorder ---------------------------------------------------------------------------------

    def record(self, t: RequestTimeline, model_label: str) -> None:
        """End the span from the finished timeline, then record the OTel metrics."""
        handle = t.trace if isinstance(t.trace, _Trace) else None
        error_type = None
        try:
            error_type = _error_type(t)
            if handle is not None:
                self._end_span(t, handle, error_type, model_label)
        except Exception:
            _log.exception("trace_end_failed")
            if handle is not None:
                try:
                    handle.span.end()
                except Exception:
                    pass
        if self._instruments is not None and t.route != OTHER.template:
            try:
                self._record_metrics(t, model_label, handle, error_type)
            except Exception:
                _log.exception("otel_metrics_failed")

    def _end_span(self, t: RequestTimeline, handle: _Trace, error_type: str | None, model_label: str = "") -> None:
        span = handle.span
        end_ns = handle.ns(t.end) if t.end is not None else None
        if not span.is_recording():
            span.end(end_time=end_ns)
            return
        route = ROUTES.get(t.route)
        if route is not None and route is not OTHER and model_label not in ("", UNKNOWN_MODEL, OTHER_MODEL):
            # The model may have earned its label as the request finished (sidecar/base/labels.py).
            span.update_name(f"{route.operation} {model_label}")
        attrs: dict[str, Any] = {}
        outcome = t.outcome.value if t.outcome is not None else Outcome.ERROR.value
        attrs[sc.LLM_SIDECAR_OUTCOME] = outcome
        if t.outcome is Outcome.CANCELLED:
            attrs[sc.LLM_SIDECAR_CANCELLED] = True
        if t.status is not None:
            attrs[sc.HTTP_RESPONSE_STATUS_CODE] = t.status
        if error_type is not None:
            attrs[sc.ERROR_TYPE] = error_type
        if t.route != OTHER.template:
            self._genai_end_attributes(t, attrs)
            self._objective_attributes(t, attrs)
        span.set_attributes(attrs)
        if t.first_token is not None:
            kind = t.first_token_kind.value if t.first_token_kind is not None else "answer"
            span.add_event(sc.EVENT_FIRST_TOKEN, {sc.LLM_SIDECAR_TOKEN_KIND: kind}, timestamp=handle.ns(t.first_token))
        if t.ttfat is not None and t.first_answer_token is not None:
            span.add_event(sc.EVENT_FIRST_ANSWER_TOKEN, timestamp=handle.ns(t.first_answer_token))
        if error_type is not None:
            # The description is the sidecar's own cause; a bare HTTP status needs none.
            described = t.outcome is Outcome.ERROR and t.error_type not in (None, "upstream_status")
            span.set_status(Status(StatusCode.ERROR, t.error_type if described else None))
        span.end(end_time=end_ns)

    def _objective_attributes(self, t: RequestTimeline, attrs: dict[str, Any]) -> None:
        """The request's objectives and verdicts, its cache class and tool-call timings."""
        asked = t.objectives
        if isinstance(asked, RequestObjectives) and asked.invalid:
            attrs[sc.LLM_SIDECAR_OBJECTIVE_INVALID] = asked.invalid
        judgement = judge(t, self._objectives)
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
        if t.streamed and t.ttft is not None:
            attrs[sc.LLM_SIDECAR_CACHE_CLASS] = cache_class(t.input_tokens, t.cached_input_tokens).value
        if t.first_tool_call is not None:
            attrs[sc.LLM_SIDECAR_TTFTC] = t.time_to_first_tool_call
            attrs[sc.LLM_SIDECAR_TOOL_CALLS] = t.tool_call_count
            attrs[sc.LLM_SIDECAR_TOOL_CALL_ASSEMBLY] = tuple(t.tool_call_assembly())

    @staticmethod
    def _genai_end_attributes(t: RequestTimeline, attrs: dict[str, Any]) -> None:
        # gen_ai.request.stream is the request's own flag when its body was JSON; otherwise a
        # response read as a token stream proves the client asked for one.
        if t.request_stream is not None:
            attrs[sc.GEN_AI_REQUEST_STREAM] = t.request_stream
        elif t.streamed:
            attrs[sc.GEN_AI_REQUEST_STREAM] = True
        if t.first_byte is not None:
            attrs[sc.LLM_SIDECAR_STREAMED] = t.streamed
        if t.streamed and t.ttft is not None:
            attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = t.ttft
        if t.response_model:
            attrs[sc.GEN_AI_RESPONSE_MODEL] = _bounded(t.response_model)
        if t.response_id:
            attrs[sc.GEN_AI_RESPONSE_ID] = _bounded(t.response_id)
        if t.finish_reasons:
            attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(
                _bounded(r, 64) for r in t.finish_reasons[:_MAX_FINISH_REASONS]
            )
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
        engine = getattr(t, "engine", None)
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
        if t.stream_error is not None and t.stream_error.type:
            attrs[sc.LLM_SIDECAR_STREAM_ERROR_TYPE] = _bounded(t.stream_error.type, 64)

    def _record_metrics(self, t: RequestTimeline, label: str, handle: _Trace | None, error_type: str | None) -> None:
        """The GenAI client metrics of one finished request (gen-ai-metrics.md).

        ``operation.duration``: every request, ``error.type`` when it ended in one.
        ``time_to_first_chunk`` and ``time_per_output_chunk``: streamed responses only (the
        spec: "SHOULD NOT be reported otherwise"), whatever the outcome, since a client saw
        those chunks arrive; one ``time_per_output_chunk`` observation per chunk after the
        first. ``token.usage``: input and output counts when known.
        """
        ins = self._instruments
        assert ins is not None
        route = ROUTES.get(t.route)
        if route is None:
            return
        attrs: dict[str, Any] = {sc.GEN_AI_OPERATION_NAME: route.operation, **self._server}
        provider = self._provider(route.template)
        if provider is not None:
            attrs[sc.GEN_AI_PROVIDER_NAME] = provider
        if label != UNKNOWN_MODEL:
            attrs[sc.GEN_AI_REQUEST_MODEL] = label  # bounded: at most max_models values + "other"
            if t.response_model and self._response_model_known(t.response_model):
                # Recommended; only a name that is a model label already, so an upstream
                # can neither mint series nor use up the labeler's slots.
                attrs[sc.GEN_AI_RESPONSE_MODEL] = t.response_model
        # With the span in the context, the SDK's trace-based exemplar filter links a
        # bucket to this trace (OTEL_METRICS_EXEMPLAR_FILTER, default trace_based).
        ctx = trace_api.set_span_in_context(handle.span) if handle is not None and t.trace_id else None
        e2e = t.e2e
        if e2e is not None:
            duration_attrs = attrs if error_type is None else {**attrs, sc.ERROR_TYPE: error_type}
            ins.duration.record(e2e, duration_attrs, context=ctx)
        if t.streamed and t.ttft is not None:
            ins.ttfc.record(t.ttft, attrs, context=ctx)
            record = ins.tpoc.record
            for gap in t.chunk_gaps():
                record(gap, attrs)
        ins.own.record(t, attrs, self._objectives, ctx)
        if ins.latest:
            _record_usage_latest(ins, t, attrs, ctx)
            return
        for kind, value in ((sc.GEN_AI_TOKEN_TYPE_INPUT, t.input_tokens), (sc.GEN_AI_TOKEN_TYPE_OUTPUT, t.output_tokens)):
            if value is not None:
                ins.tokens.record(value, {**attrs, sc.GEN_AI_TOKEN_TYPE: kind}, context=ctx)


def _record_usage_latest(ins: _Instruments, t: RequestTimeline, attrs: dict[str, Any], ctx) -> None:
    """Token metrics under the current names: the per-operation histograms carry the common
    attributes; the usage counters add the required ``gen_ai.token.modality``."""
    counted = {**attrs, sc.GEN_AI_TOKEN_MODALITY: sc.GEN_AI_TOKEN_MODALITY_UNKNOWN}
    if t.input_tokens is not None:
        ins.op_input.record(t.input_tokens, attrs, context=ctx)
        ins.usage_input.add(t.input_tokens, counted, context=ctx)
    if t.output_tokens is not None:
        ins.op_output.record(t.output_tokens, attrs, context=ctx)
        ins.usage_output.add(t.output_tokens, counted, context=ctx)
    cached = t.cached_input_tokens
    if cached is not None:
        ins.usage_cache_read.add(cached, counted, context=ctx)
    reasoning = t.reasoning_tokens
    if reasoning is not None:
        ins.usage_reasoning.add(reasoning, counted, context=ctx)


# -- providers from the environment ------------------------------------------------------------

_SUPPORTED_EXPORTERS = frozenset({"otlp", "console"})
_PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PROTOCOL = "http/protobuf"  # the OTLP exporter spec's default
SHUTDOWN_TIMEOUT_SECONDS = 5.0  # the most a SIGTERM exit waits for the last export
UNHEALTHY_SHUTDOWN_SECONDS = 0.5
"""The wait when an OTLP exporter has not shown it can export (its last export failed, one
is hanging, or none succeeded yet): what is queued is lost either way, and an idle SIGTERM
exits within a second (issue 33, finding 13; sidecar/export/otlp_health.py)."""


def where_time_went_attributes(t: RequestTimeline, attrs: dict[str, Any]) -> None:
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


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def wanted_exporters(environ: Mapping[str, str], signal: str) -> set[str]:
    """Exporters for ``signal`` (``TRACES`` or ``METRICS``) from ``OTEL_<SIGNAL>_EXPORTER``.

    Unlike the SDK's own auto-configuration, an unset variable means "otlp only if an OTLP
    endpoint is configured" (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT``), so a sidecar without a collector exports
    nothing and builds no provider. ``none`` turns the signal off.
    """
    raw = environ.get(f"OTEL_{signal}_EXPORTER", "").strip()
    if raw:
        names = {n.strip().lower() for n in raw.split(",") if n.strip()}
        if "none" in names:
            return set()
        unknown = names - _SUPPORTED_EXPORTERS
        if unknown:
            _log.warning("otel_exporter_unsupported", variable=f"OTEL_{signal}_EXPORTER", ignored=sorted(unknown))
        return names & _SUPPORTED_EXPORTERS
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or environ.get(
        f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", ""
    ).strip():
        return {"otlp"}
    return set()


def otlp_protocol(environ: Mapping[str, str], signal: str) -> str:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``, else
    ``http/protobuf``. An unsupported value (e.g. ``http/json``) falls back to
    ``http/protobuf`` with a warning: same port on a Collector, and telemetry config must not
    stop the proxy."""
    for var in (f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = environ.get(var, "").strip().lower()
        if value:
            if value in _PROTOCOLS:
                return value
            _log.warning("otel_protocol_unsupported", variable=var, value=value, using=DEFAULT_PROTOCOL)
            return DEFAULT_PROTOCOL
    return DEFAULT_PROTOCOL


def _parse_resource_attributes(raw: str) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES``: ``k=v,k2=v2`` with percent-encoded values."""
    out: dict[str, str] = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            continue
        out[key] = unquote(value.strip())
    return out


def resource_attributes(environ: Mapping[str, str]) -> dict[str, str]:
    """Resource attributes, lowest precedence first: defaults (``service.name`` =
    ``llm-sidecar``, ``service.version``), Kubernetes downward-API variables
    (``K8S_POD_NAME`` -> ``k8s.pod.name``, see :data:`sidecar.export.semconv.K8S_ENV_ATTRIBUTES`),
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``."""
    attrs: dict[str, str] = {sc.SERVICE_NAME: sc.DEFAULT_SERVICE_NAME, sc.SERVICE_VERSION: __version__}
    for var, key in sc.K8S_ENV_ATTRIBUTES:
        value = environ.get(var, "").strip()
        if value:
            attrs[key] = value
    attrs.update(_parse_resource_attributes(environ.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    name = environ.get("OTEL_SERVICE_NAME", "").strip()
    if name:
        attrs[sc.SERVICE_NAME] = name
    return attrs


@dataclass
class TelemetryProviders:
    """The SDK providers ``serve`` owns; either may be None (that signal is off)."""

    tracer_provider: Any = None
    meter_provider: Any = None
    healths: list = field(default_factory=list)  # one ExportHealth per OTLP exporter

    @property
    def enabled(self) -> bool:
        return self.tracer_provider is not None or self.meter_provider is not None

    def register(self, registry) -> None:
        """``llm_sidecar_otlp_export_failures_total{signal}`` on ``registry`` (the sidecar's
        /metrics), when an OTLP exporter is configured."""
        if self.healths:
            from .otlp_health import ExportFailuresCollector  # noqa: PLC0415 - imports the SDK

            registry.register(ExportFailuresCollector(self.healths))

    def shutdown(self, timeout: float | None = None) -> bool:
        """Flush and stop the exporters, waiting at most ``timeout`` seconds; True if done.

        Blocking (call it off the event loop). The SDK's own shutdown can wait 30 s per
        provider for an unreachable collector (export retries), which would eat the pod's
        termination grace period, so it runs in a daemon thread that is abandoned after
        ``timeout``: the spans are lost either way, the exit is not delayed. By default
        (``timeout`` None) up to :data:`SHUTDOWN_TIMEOUT_SECONDS` while every OTLP exporter
        keeps showing it can export (its last export succeeded, none running for half a
        second: a collector that answers does so in milliseconds), else
        :data:`UNHEALTHY_SHUTDOWN_SECONDS`: a collector down, or gone at this moment, does not
        hold an idle exit past a second.
        """
        budget = SHUTDOWN_TIMEOUT_SECONDS if timeout is None else timeout

        def worth_waiting(elapsed: float) -> bool:
            if elapsed >= budget:
                return False
            if timeout is not None or elapsed < UNHEALTHY_SHUTDOWN_SECONDS:
                return True
            return all(h.healthy(slow_after=UNHEALTHY_SHUTDOWN_SECONDS) for h in self.healths)

        def run() -> None:
            for provider in (self.tracer_provider, self.meter_provider):
                if provider is None:
                    continue
                try:
                    provider.shutdown()
                except Exception:
                    _log.exception("otel_shutdown_failed", provider=type(provider).__name__)

        worker = threading.Thread(target=run, name="llm-sidecar-otel-shutdown", daemon=True)
        worker.start()
        started = time.monotonic()
        while worker.is_alive() and worth_waiting(time.monotonic() - started):
            worker.join(0.05)
        if worker.is_alive():
            failing = sorted({h.signal for h in self.healths if not h.healthy(slow_after=UNHEALTHY_SHUTDOWN_SECONDS)})
            _log.warning(
                "otel_flush_incomplete",
                waited_seconds=round(time.monotonic() - started, 2),
                exporters_not_healthy=failing or None,
            )
            return False
        return True


def providers_from_env(*, metrics: bool = False, environ: Mapping[str, str] | None = None) -> TelemetryProviders:
    """SDK providers configured by the standard ``OTEL_*`` variables, or none.

    Traces: on when ``OTEL_EXPORTER_OTLP_ENDPOINT``/``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
    set or ``OTEL_TRACES_EXPORTER`` names ``otlp`` (or ``console``). Metrics: additionally
    need ``metrics=True`` (the ``otel_metrics`` setting). ``OTEL_SDK_DISABLED=true`` turns
    both off. Everything else the SDK reads itself from the process environment: sampler
    (``OTEL_TRACES_SAMPLER[_ARG]``), endpoints, headers, TLS, timeouts, compression, batch
    (``OTEL_BSP_*``) and export interval (``OTEL_METRIC_EXPORT_INTERVAL``).
    A failure here is logged and leaves that signal off; it never stops the sidecar.
    """
    env = os.environ if environ is None else environ
    providers = TelemetryProviders()
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return providers
    trace_exporters = wanted_exporters(env, "TRACES")
    metric_exporters = wanted_exporters(env, "METRICS") if metrics else set()
    if metrics and not metric_exporters:
        _log.warning(
            "otel_metrics_without_exporter",
            hint="set OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    if not trace_exporters and not metric_exporters:
        return providers
    try:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415 - only when enabled

        resource = Resource.create(resource_attributes(env))
    except Exception:
        _log.exception("otel_resource_failed")
        return providers
    if trace_exporters:
        providers.tracer_provider = _tracer_provider(resource, trace_exporters, env, providers.healths)
    if metric_exporters:
        providers.meter_provider = _meter_provider(resource, metric_exporters, env, providers.healths)
    _log.info(
        "otel_enabled",
        traces=_describe(trace_exporters, env, "TRACES") if providers.tracer_provider is not None else None,
        metrics=_describe(metric_exporters, env, "METRICS") if providers.meter_provider is not None else None,
        service_name=resource.attributes.get(sc.SERVICE_NAME),
    )
    return providers


def _describe(exporters: Iterable[str], env: Mapping[str, str], signal: str) -> list[str]:
    return sorted(f"otlp ({otlp_protocol(env, signal)})" if e == "otlp" else e for e in exporters)


def _guarded(exporter, name: str, signal: str, env: Mapping[str, str], healths: list | None):
    """An OTLP exporter wrapped to report its failures (one line a minute and a counter, not
    the SDK's retry text: sidecar/export/otlp_health.py); the console one as it is."""
    if name != "otlp" or healths is None:
        return exporter
    from .otlp_health import ExportHealth, GuardedMetricExporter, GuardedSpanExporter, quiet_sdk_export_logs  # noqa: PLC0415

    quiet_sdk_export_logs()
    variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
    endpoint = env.get(variable, "").strip() or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    health = ExportHealth(signal, endpoint or str(getattr(exporter, "_endpoint", "")))
    healths.append(health)
    return (GuardedSpanExporter if signal == "traces" else GuardedMetricExporter)(exporter, health)


def _tracer_provider(resource, exporters: set[str], env: Mapping[str, str], healths: list | None = None):
    try:
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        # Sampler from OTEL_TRACES_SAMPLER. No atexit hook: serve() shuts down, bounded.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for name in sorted(exporters):
            exporter = _guarded(_span_exporter(name, env), name, "traces", env, healths)
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return provider
    except Exception:
        _log.exception("otel_traces_setup_failed")
        return None


def _span_exporter(name: str, env: Mapping[str, str]):
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # noqa: PLC0415

        return ConsoleSpanExporter()
    if otlp_protocol(env, "TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    return OTLPSpanExporter()


def _meter_provider(resource, exporters: set[str], env: Mapping[str, str], healths: list | None = None):
    try:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415

        readers = [
            PeriodicExportingMetricReader(_guarded(_metric_exporter(name, env), name, "metrics", env, healths))
            for name in sorted(exporters)
        ]
        return MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
    except Exception:
        _log.exception("otel_metrics_setup_failed")
        return None


def _metric_exporter(name: str, env: Mapping[str, str]):
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter  # noqa: PLC0415

        return ConsoleMetricExporter()
    if otlp_protocol(env, "METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter  # noqa: PLC0415
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # noqa: PLC0415
    return OTLPMetricExporter()
