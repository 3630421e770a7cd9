"""The request's span and its W3C context: a GenAI CLIENT span per proxied request, started
in the client's trace, ended from the finished request's summary, and the opt-in GenAI metrics recorded
beside it.

:class:`RequestTelemetry` is the proxy's :class:`~sidecar.measure.record.RequestTracer` (``start``
and ``inject``) and a :data:`~sidecar.measure.record.Recorder` (``record``). Providers are
injected, never taken from the global API state, so tests hand in in-memory ones; where they
come from in production is :mod:`sidecar.export.otel_setup`. What the span says at its end is
:mod:`sidecar.export.span_attributes`; the metric instruments are
:mod:`sidecar.export.otel_genai_metrics`.

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

import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import structlog
from opentelemetry import trace as trace_api
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ..base.labels import OTHER as OTHER_MODEL, UNKNOWN as UNKNOWN_MODEL
from ..base.outcomes import Outcome
from ..base.routes import OTHER, ROUTES
from ..measure.summary import RequestSummary
from ..measure.timeline import RequestTimeline
from . import semconv as sc
from .otel_env import genai_latest_names
from .otel_genai_metrics import GenAIInstruments
from .span_attributes import (
    MAX_METHOD,
    bounded,
    error_type_of,
    genai_end_attributes,
    objective_attributes,
)

__all__ = ["PROVIDER_BY_ROUTE", "RequestTelemetry"]

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


# -- propagation ------------------------------------------------------------------------------


class _HeaderGetter(Getter[Any]):
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
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        model_label: Callable[[str | None], str] | None = None,
        provider_name: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
        latest_genai_names: bool | None = None,
    ) -> None:
        self._provider_name = provider_name
        parts = urlsplit(upstream)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._server: dict[str, Any] = {
            sc.SERVER_ADDRESS: parts.hostname or "",
            sc.SERVER_PORT: port,
        }
        self._model_label = model_label or (lambda m: m or UNKNOWN_MODEL)
        self._clock = clock
        self._tracer = (
            tracer_provider.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__)
            if tracer_provider is not None
            else None
        )
        if latest_genai_names is None:  # OTEL_SEMCONV_STABILITY_OPT_IN, as the contrib packages
            latest_genai_names = genai_latest_names()
        self._instruments = (
            GenAIInstruments(meter_provider, latest=latest_genai_names)
            if meter_provider is not None
            else None
        )
        self._propagator = CompositePropagator(
            [TraceContextTextMapPropagator(), W3CBaggagePropagator()]
        )

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
        span = self._tracer.start_span(  # type: ignore[union-attr]  # start() checked it
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
            attrs[sc.HTTP_REQUEST_METHOD_ORIGINAL] = bounded(t.method, MAX_METHOD)
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
            attrs[sc.GEN_AI_REQUEST_MODEL] = bounded(t.model)
        if t.request_max_tokens is not None:
            attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = t.request_max_tokens
        label = self._model_label(t.model or None)
        name = (
            route.operation
            if label in (UNKNOWN_MODEL, OTHER_MODEL)
            else f"{route.operation} {label}"
        )
        return name, attrs

    def _response_model_known(self, name: str) -> bool:
        known = getattr(self._model_label, "known", None)
        return known(name) if known is not None else False

    def _provider(self, template: str) -> str | None:
        return self._provider_name or PROVIDER_BY_ROUTE.get(template)

    def stalled(
        self, timeline: RequestTimeline, since: float, phase: str, threshold: float
    ) -> None:
        """The event ``llm_sidecar.stalled`` on a stream's open span, stamped at ``since``
        (its last byte): where the stream stopped (sidecar/export/in_flight.py, ``StallWatch``)."""
        handle = timeline.trace
        if not isinstance(handle, _Trace):
            return
        try:
            span = handle.span
            if span.is_recording():
                span.add_event(
                    sc.EVENT_STALLED,
                    {sc.LLM_SIDECAR_STALL_PHASE: phase, sc.LLM_SIDECAR_STALL_SECONDS: threshold},
                    timestamp=handle.ns(since),
                )
        except Exception:  # telemetry never breaks the relay
            _log.exception("stall_event_failed")

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

    def record(self, t: RequestSummary) -> None:
        """End the span from the finished request's summary, then record the OTel metrics."""
        handle = t.trace if isinstance(t.trace, _Trace) else None
        model_label = t.model_label
        error_type = None
        try:
            error_type = error_type_of(t)
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

    def _end_span(
        self, t: RequestSummary, handle: _Trace, error_type: str | None, model_label: str = ""
    ) -> None:
        span = handle.span
        end_ns = handle.ns(t.end)
        if not span.is_recording():
            span.end(end_time=end_ns)
            return
        route = ROUTES.get(t.route)
        if (
            route is not None
            and route is not OTHER
            and model_label not in ("", UNKNOWN_MODEL, OTHER_MODEL)
        ):
            # The model may have earned its label as the request finished (sidecar/base/labels.py).
            span.update_name(f"{route.operation} {model_label}")
        attrs: dict[str, Any] = {}
        attrs[sc.LLM_SIDECAR_OUTCOME] = t.outcome.value
        if t.outcome is Outcome.CANCELLED:
            attrs[sc.LLM_SIDECAR_CANCELLED] = True
        if t.status is not None:
            attrs[sc.HTTP_RESPONSE_STATUS_CODE] = t.status
        if error_type is not None:
            attrs[sc.ERROR_TYPE] = error_type
        if t.route != OTHER.template:
            genai_end_attributes(t, attrs)
            objective_attributes(t, attrs)
        span.set_attributes(attrs)
        if t.first_token is not None:
            kind = t.first_token_kind.value if t.first_token_kind is not None else "answer"
            span.add_event(
                sc.EVENT_FIRST_TOKEN,
                {sc.LLM_SIDECAR_TOKEN_KIND: kind},
                timestamp=handle.ns(t.first_token),
            )
        if t.ttfat is not None and t.first_answer_token is not None:
            span.add_event(sc.EVENT_FIRST_ANSWER_TOKEN, timestamp=handle.ns(t.first_answer_token))
        if error_type is not None:
            # The description is the sidecar's own cause; a bare HTTP status needs none.
            described = t.outcome is Outcome.ERROR and t.error_type != "upstream_status"
            span.set_status(Status(StatusCode.ERROR, t.error_type if described else None))
        span.end(end_time=end_ns)

    def _record_metrics(
        self, t: RequestSummary, label: str, handle: _Trace | None, error_type: str | None
    ) -> None:
        """The GenAI metrics' attributes of one finished request, then its measurements
        (:meth:`~sidecar.export.otel_genai_metrics.GenAIInstruments.record`)."""
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
        ctx = (
            trace_api.set_span_in_context(handle.span)
            if handle is not None and t.trace_id
            else None
        )
        ins.record(t, attrs, error_type, ctx)
