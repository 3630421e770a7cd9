"""Every Prometheus instrument the sidecar exports, and how a finished timeline feeds them.

Names, labels and meanings are the contract in docs/design.md. The registry is injected (tests
build a fresh ``CollectorRegistry()``); nothing here is a module global. Label values are
bounded here: ``model`` through :class:`ModelLabeler`, ``route`` by the fixed route table,
``outcome`` by :class:`~sidecar.measure.timeline.Outcome`, ``code`` by HTTP itself.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from ..base.finish_reason import MAX_FINISH_REASONS_PER_REQUEST, finish_reason_label
from ..base.labels import UNKNOWN, ModelLabeler, SeriesBudget
from ..base.outcomes import Outcome, Verdict
from ..base.prompt_class import PromptClasses
from ..base.routes import ROUTES
from ..base.speedups import IN_C
from ..measure.cache_class import CacheClass, cache_class
from ..measure.objectives import ObjectiveDefaults, RequestObjectives, judge
from ..measure.timeline import RequestTimeline
from .capacity import CapacityMetrics
from .families import FAMILIES
from .prometheus_internals import (
    SeriesGate,
    drop_label_value,
    has_child,
    is_labelled_parent,
    label_names,
    observe_many,
    observe_one,
    observe_repeated,
)

__all__ = ["SidecarMetrics", "SLOThresholds", "method_label", "SERIES_REFUSED_FATES"]

SERIES_REFUSED_FATES = ("other", "dropped")
"""What became of an update whose series the budget refused (``llm_series_refused_total``)."""

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    """The bounded ``method`` label of ``llm_non_api_requests_total`` (anything else: ``other``)."""
    return method if method in _METHODS else "other"


class SLOThresholds:
    """The latency objectives a request must meet at once to count as goodput."""

    __slots__ = ("ttft", "tpot", "e2e")

    def __init__(self, ttft: float, tpot: float, e2e: float) -> None:
        self.ttft, self.tpot, self.e2e = ttft, tpot, e2e

    def met_by(self, t: RequestTimeline) -> bool:
        # A 4xx is outcome ok (the server did its job) but served the user nothing: a fast
        # 429 must not look like good service.
        if t.outcome is not Outcome.OK or t.status is None or not 200 <= t.status < 300:
            return False
        e2e = t.e2e
        if e2e is None or e2e > self.e2e:
            return False
        if t.streamed:
            ttft, tpot = t.ttft, t.tpot
            if ttft is None or ttft > self.ttft:
                return False
            if tpot is not None and tpot > self.tpot:
                return False
        return True


class SidecarMetrics:
    """Owns the instruments; :meth:`record` is the only way figures reach them.

    It also makes what reports to them, each complete when made: with ``capacity``, the
    load-conditioned decode metrics (:class:`~sidecar.export.capacity.CapacityMetrics`,
    registered after these, so the page keeps its order); with ``max_series``, the page's
    one series budget (:class:`~sidecar.export.prometheus_internals.SeriesGate`, whose
    ``guard()`` the caller runs once every family is registered, and :attr:`budget`, the
    same count as label admission asks it); and the ``model`` label
    (:class:`~sidecar.base.labels.ModelLabeler`, bounded by ``model_allowlist``,
    ``max_models`` and ``label_idle_seconds``), which counts its overflows here and, when a
    value goes idle, drops its series here and in the capacity metrics."""

    # The request figures' families (set from FAMILIES, sidecar/export/families.py).
    requests: Counter
    finish_reasons: Counter
    non_api: Counter
    in_flight: Gauge
    duration: Histogram
    ttfb: Histogram
    ttft: Histogram
    ttfat: Histogram
    itl: Histogram
    tpot: Histogram
    tps: Histogram
    tokens: Counter
    request_tokens: Histogram
    within_slo: Counter
    request_objectives: Counter
    request_objective_invalid: Counter
    ttft_by_cache: Histogram
    time_to_first_tool_call: Histogram
    tool_call_assembly: Histogram
    tool_calls_per_response: Histogram
    upstream_load: Histogram
    upstream_prefill: Histogram
    upstream_decode: Histogram
    upstream_queue: Histogram
    overhead: Histogram
    parse_errors: Counter
    token_count_source: Counter
    label_overflow: Counter
    series_refused: Counter

    def __init__(
        self,
        registry: CollectorRegistry,
        slo: SLOThresholds | None = None,
        prompt_classes: PromptClasses | None = None,
        tenants: bool = False,
        version: str | None = None,
        objectives: ObjectiveDefaults | None = None,
        *,
        model_allowlist: Iterable[str] = (),
        max_models: int = 50,
        label_idle_seconds: float = 3600.0,
        max_series: int | None = None,
        capacity: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.tenants = tenants  # the opt-in tenant label (sidecar/export/families.py)
        self.slo = slo
        self.objectives = objectives or ObjectiveDefaults()
        self.prompt_class = prompt_classes or PromptClasses()
        # The request figures' families, from the table (sidecar/export/families.py).
        for family in FAMILIES:
            setattr(self, family.attr, family.make(registry, tenants))
        self._overhead_request = self.overhead.labels("request")
        self._overhead_response = self.overhead.labels("response")
        self._overflow_children: dict[tuple[str, str], Counter] = {}
        # Made now, at 0, and never removed: counting a refusal must not itself need a
        # series when the budget is full (and the rate of it counts the first refusal).
        self._refused_children = {
            fate: self.series_refused.labels(fate) for fate in SERIES_REFUSED_FATES
        }
        # In-flight gauge children a request started under when its own series was refused
        # (the gate gave the 'other' row): the request ends on the same child.
        self._in_flight_folded: dict[tuple[str, str], list[Gauge]] = {}
        self._own_health(registry, version)
        self.capacity = CapacityMetrics(registry) if capacity else None
        self.gate: SeriesGate | None = None
        self.budget: SeriesBudget | None = None
        if max_series is not None:
            self.gate = SeriesGate(registry, max_series, on_refused=self.refused)
            self.budget = SeriesBudget(
                max_series, self.gate.count, self.gate.first_cost, self.gate.reserve
            )
        self.model_label = ModelLabeler(
            model_allowlist,
            max_models,
            idle_seconds=label_idle_seconds,
            budget=self.budget,
            clock=clock,
            on_overflow=self.overflow_counter("model"),
            on_forget=self._forget_model,
        )

    def _own_health(self, registry: CollectorRegistry, version: str | None) -> None:
        """The sidecar's own process (``process_*``: CPU seconds, resident memory, open and
        max file descriptors, from /proc) and what is running: ``llm_sidecar_build_info``,
        whose ``speedups`` says whether the C byte checks loaded (without them the relay
        costs about twice the CPU per token, docs/performance.md)."""
        if version is None:
            from .. import __version__ as version
        try:
            ProcessCollector(registry=registry)
        except ValueError:  # the registry has process_* already (a second SidecarMetrics on it)
            pass
        self.build_info = Gauge(
            "sidecar_build_info",
            "Always 1: the running sidecar's version, Python version, and speedups 'on' when its "
            "C byte checks are loaded ('off': a build without a C compiler, about 2x the CPU per token).",
            ("version", "python", "speedups"), registry=registry, namespace="llm",
        )  # fmt: skip
        self.build_info.labels(version, platform.python_version(), "on" if IN_C else "off").set(1)

    def _labelled(self) -> list[Counter | Gauge | Histogram]:
        """The labelled instruments (parents, not the children some attributes cache)."""
        return [
            m
            for m in vars(self).values()
            if isinstance(m, (Counter, Gauge, Histogram)) and is_labelled_parent(m)
        ]

    def refused(self, fate: str) -> None:
        """The series gate refused a series: count it by what became of the update."""
        self._refused_children[fate].inc()

    def overflow_counter(self, label: str) -> Callable[[str], None]:
        """``count(reason)`` for ``label``'s admission (its ``on_overflow``): a reason's series
        is made at its first overflow (no rule alerts on it; the page's count is the answer
        to "why is my model under other?"), a family without ``model`` or ``tenant`` that
        may use the series budget's reserve."""

        def count(reason: str) -> None:
            child = self._overflow_children.get((label, reason))
            if child is None:
                child = self._overflow_children[(label, reason)] = self.label_overflow.labels(
                    label, reason
                )
            child.inc()

        return count

    def forget(self, label: str, value: str) -> int:
        """Remove every series whose ``label`` is ``value`` (an idle value gave its slot back)."""
        return sum(
            drop_label_value(m, label, value) for m in self._labelled() if label in label_names(m)
        )

    def _forget_model(self, value: str) -> None:
        """An idle model label: every metric lets it go (the capacity metrics its tracker too)."""
        self.forget("model", value)
        if self.capacity is not None:
            self.capacity.forget(value)

    # -- lifecycle hooks, called by the proxy -------------------------------------------

    def started(self, model_label: str, route: str) -> None:
        """A request began: its model label is held (never forgotten, its series never
        removed, until :meth:`ended`), and it counts in flight."""
        self.model_label.hold(model_label)
        if route in ROUTES:  # non-API traffic has no in-flight series (see record)
            key = (model_label, route)
            child = self.in_flight.labels(*key)
            if not has_child(self.in_flight, key):  # the series gate gave another row
                self._in_flight_folded.setdefault(key, []).append(child)
            child.inc()

    def ended(self, model_label: str, route: str) -> None:
        """The in-flight gauge ends under the label the request started with (the record's
        label may differ: a value can earn its slot as the request finishes), on the very
        child it started on; then the label is released."""
        if route in ROUTES:
            key = (model_label, route)
            folded = self._in_flight_folded.get(key)
            if folded:
                child = folded.pop()
                if not folded:
                    del self._in_flight_folded[key]
            else:
                child = self.in_flight.labels(*key)
            child.dec()
        self.model_label.release(model_label)

    def record(self, t: RequestTimeline, model_label: str) -> None:
        """Observe one finished request. Called exactly once per request."""
        route = t.route
        mr = (model_label, route)
        verdict = t.verdict or Verdict.INTERNAL  # (recorded once finished: a guard)
        outcome = verdict.outcome.value
        code = verdict.code(t.status)
        if route not in ROUTES:
            # Not an API request (a health check, the server's own /metrics, a model listing
            # through the proxy port): one count apart, so it never forms an SLO of its own
            # (model "unknown", route "other") nor dilutes the real requests' error ratio.
            self.non_api.labels(method_label(t.method), code, outcome).inc()
            self._record_overhead(t)  # the sidecar's own cost, whatever it relayed
            return
        tenant = self._tenant(t)
        self.requests.labels(model_label, route, code, outcome, verdict.error_type, *tenant).inc()
        reasons = t.finish_reasons
        if reasons:
            for raw in reasons[:MAX_FINISH_REASONS_PER_REQUEST]:
                self.finish_reasons.labels(*mr, finish_reason_label(raw)).inc()
        # The trace id as an exemplar links a slow bucket to its trace (OpenMetrics only).
        ex = {"trace_id": t.trace_id} if t.trace_id else None
        e2e = t.e2e
        # A cancelled request's duration is when its client chose to leave, not how the
        # server did: llm_requests_total counts it, no distribution holds it.
        if e2e is not None and verdict.outcome is not Outcome.CANCELLED:
            observe_one(self.duration.labels(model_label, outcome), e2e, ex)
        if t.ttfb is not None:
            observe_one(self.ttfb.labels(model_label), t.ttfb, ex)
        if t.parse_errors:
            self.parse_errors.labels(route).inc(t.parse_errors)
        if t.streamed:
            self._record_stream(t, model_label, ex, tenant)
        self._record_tokens(t, mr, tenant)
        self.token_count_source.labels(model_label, route, t.token_count_source.value).inc()
        engine = t.engine
        if engine is not None:
            for hist, value in (
                (self.upstream_load, engine.load_seconds),
                (self.upstream_prefill, engine.prefill_seconds),
                (self.upstream_decode, engine.decode_seconds),
                (self.upstream_queue, engine.queue_seconds),
            ):
                if value is not None:
                    observe_one(hist.labels(model_label), value)
        self._record_overhead(t)
        if self.slo is not None and self.slo.met_by(t):
            self.within_slo.labels(*mr, *tenant).inc()
        self._record_objectives(t, mr, tenant)

    def _record_objectives(
        self, t: RequestTimeline, mr: tuple[str, str], tenant: tuple[str, ...]
    ) -> None:
        """The request's own objectives (sidecar/measure/objectives.py): bad headers counted,
        each judged objective counted met or missed."""
        asked = t.objectives
        if isinstance(asked, RequestObjectives) and asked.invalid:
            for name in asked.invalid:
                self.request_objective_invalid.labels(mr[1], name).inc()
        judgement = judge(t, self.objectives)
        if judgement is not None:
            for name, met in judgement.verdicts():
                self.request_objectives.labels(*mr, name, "met" if met else "missed", *tenant).inc()

    def _record_overhead(self, t: RequestTimeline) -> None:
        overhead = t.request_overhead
        if overhead is not None:
            observe_one(self._overhead_request, overhead)
        overhead = t.response_overhead
        if overhead is not None:
            observe_one(self._overhead_response, overhead)

    def _tenant(self, t: RequestTimeline) -> tuple[str, ...]:
        """The tenant label value as a 0- or 1-tuple to splat after the other labels."""
        return (t.tenant or UNKNOWN,) if self.tenants else ()

    def _record_stream(
        self,
        t: RequestTimeline,
        model: str,
        ex: dict[str, str] | None,
        tenant: tuple[str, ...] = (),
    ) -> None:
        """The stream's distributions, per model: a model's latencies are its engine's,
        whichever API route asked (the route is on the counters)."""
        if t.ttft is not None:
            observe_one(
                self.ttft.labels(model, self.prompt_class(t.input_tokens), *tenant), t.ttft, ex
            )
            cache = cache_class(t.input_tokens, t.cached_input_tokens)
            if cache is not CacheClass.UNKNOWN:  # unknown: the TTFT histogram already has it
                observe_one(self.ttft_by_cache.labels(model, cache.value), t.ttft, ex)
        if t.ttfat is not None:
            observe_one(self.ttfat.labels(model), t.ttfat, ex)
        if t.first_tool_call is not None:
            self._record_tool_calls(t, model, ex)
        gaps = t.gaps
        if gaps:
            itl = self.itl.labels(model)
            observe_many(itl, gaps)
            for index, count in t.gap_runs():  # k tokens of one event: k gaps, one entry
                observe_repeated(itl, gaps[index], count - 1)
        tpot = t.tpot
        if tpot is not None:
            observe_one(self.tpot.labels(model), tpot, ex)
        tps = t.tokens_per_second
        if tps is not None:
            observe_one(self.tps.labels(model), tps)

    def _record_tool_calls(self, t: RequestTimeline, model: str, ex: dict[str, str] | None) -> None:
        # Called for a response with a tool call: its time is a float.
        observe_one(self.time_to_first_tool_call.labels(model), t.time_to_first_tool_call, ex)  # type: ignore[arg-type]
        observe_many(self.tool_call_assembly.labels(model), t.tool_call_assembly())
        observe_one(self.tool_calls_per_response.labels(model), t.tool_call_count)

    def _record_tokens(
        self, t: RequestTimeline, mr: tuple[str, str], tenant: tuple[str, ...] = ()
    ) -> None:
        model, route = mr
        for kind, value, distribution in (
            ("input", t.input_tokens, True),
            ("output", t.output_tokens, True),
            ("reasoning", t.reasoning_tokens, False),
            ("cached_input", t.cached_input_tokens, False),
        ):
            if value is None:
                continue
            if value:
                self.tokens.labels(model, route, kind, *tenant).inc(value)
            if distribution and t.outcome is Outcome.OK:
                observe_one(self.request_tokens.labels(model, kind), value)
