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
from typing import Any, TypedDict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from ..base.finish_reason import MAX_FINISH_REASONS_PER_REQUEST, finish_reason_label
from ..base.labels import UNKNOWN, ModelLabeler, SeriesBudget
from ..base.outcomes import Outcome
from ..base.prompt_class import PromptClasses
from ..base.routes import ROUTES
from ..base.speedups import IN_C
from ..measure.cache_class import CacheClass
from ..measure.summary import RequestSummary
from .capacity import CapacityMetrics
from .families import FAMILIES, OWN_FAMILIES, family_row
from .prometheus_internals import (
    Children,
    Count,
    Observed,
    Row,
    SeriesGate,
    Slot,
    count_of,
    drop_label_value,
    is_labelled_parent,
    label_names,
)

__all__ = [
    "SidecarMetrics",
    "SLOThresholds",
    "method_label",
    "SERIES_REFUSED_FATES",
    "LABELS",
]

SERIES_REFUSED_FATES = ("other", "dropped")
"""What became of an update whose series the budget refused (``llm_series_refused_total``)."""

RowKey = tuple[str, str, str, str, str, str, str, str, str, bool | None, bool | None, bool | None]
"""A request's label values, as :meth:`SidecarMetrics.record` keys its row: model, route,
code, outcome, error type, tenant, prompt class, cache class, token count source, and the
objectives' verdicts (ttft, tpot, all; None: not judged)."""

_ITL_SLOT = 10
"""The ITL histogram's slot in a request's row (:meth:`SidecarMetrics._row`)."""
_ROWS_KEPT = 4096
"""Rows kept at most (each a combination of label values seen); past it they start afresh."""
_FINISH_LABELS_KEPT = 256
"""Finish reasons, as the upstream spells them, whose label is kept once worked out."""

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    """The bounded ``method`` label of ``llm_non_api_requests_total`` (anything else: ``other``)."""
    return method if method in _METHODS else "other"


# The label values of each family, by name: the type checker holds every call to its family's
# names, and tests/unit/export/test_metrics_labels.py holds these to the table (families.py); the
# families marked ``tenant`` carry it here always, read only when the option is on.
class RequestLabels(TypedDict):
    model: str
    route: str
    code: str
    outcome: str
    error_type: str
    tenant: str


class FinishReasonLabels(TypedDict):
    model: str
    route: str
    finish_reason: str


class NonApiLabels(TypedDict):
    method: str
    code: str
    outcome: str


class ModelRouteLabels(TypedDict):
    model: str
    route: str


class ModelTenantLabels(TypedDict):
    model: str
    tenant: str


class DurationLabels(TypedDict):
    model: str
    outcome: str


class ModelOnly(TypedDict):
    model: str


class TtftLabels(TypedDict):
    model: str
    prompt_class: str
    tenant: str


class TokenLabels(TypedDict):
    model: str
    route: str
    type: str
    tenant: str


class RequestTokenLabels(TypedDict):
    model: str
    type: str


class ObjectiveLabels(TypedDict):
    model: str
    objective: str
    result: str
    tenant: str


class ObjectiveInvalidLabels(TypedDict):
    route: str
    objective: str


class CacheLabels(TypedDict):
    model: str
    cache: str


class DirectionLabels(TypedDict):
    direction: str


class RouteOnly(TypedDict):
    route: str


class SourceLabels(TypedDict):
    model: str
    route: str
    source: str


class OverflowLabels(TypedDict):
    label: str
    reason: str


class FateLabels(TypedDict):
    fate: str


LABELS: dict[str, type] = {
    "requests": RequestLabels,
    "finish_reasons": FinishReasonLabels,
    "non_api": NonApiLabels,
    "in_flight": ModelRouteLabels,
    "duration": DurationLabels,
    "ttfb": ModelOnly,
    "ttft": TtftLabels,
    "ttfat": ModelOnly,
    "itl": ModelOnly,
    "tpot": ModelOnly,
    "tps": ModelOnly,
    "tokens": TokenLabels,
    "request_tokens": RequestTokenLabels,
    "within_slo": ModelTenantLabels,
    "request_objectives": ObjectiveLabels,
    "request_objective_invalid": ObjectiveInvalidLabels,
    "ttft_by_cache": CacheLabels,
    "time_to_first_tool_call": ModelOnly,
    "tool_call_assembly": ModelOnly,
    "tool_calls_per_response": ModelOnly,
    "upstream_load": ModelOnly,
    "upstream_prefill": ModelOnly,
    "upstream_decode": ModelOnly,
    "upstream_queue": ModelOnly,
    "overhead": DirectionLabels,
    "parse_errors": RouteOnly,
    "token_count_source": SourceLabels,
    "label_overflow": OverflowLabels,
    "series_refused": FateLabels,
}
"""Each family's label values by name (the attribute it is held under, as in the table)."""


class SLOThresholds:
    """The latency objectives a request must meet at once to count as goodput."""

    __slots__ = ("ttft", "tpot", "e2e")

    def __init__(self, ttft: float, tpot: float, e2e: float) -> None:
        self.ttft, self.tpot, self.e2e = ttft, tpot, e2e

    def met_by(self, t: RequestSummary) -> bool:
        # A 4xx is outcome ok (the server did its job) but served the user nothing: a fast
        # 429 must not look like good service.
        if not t.served or t.e2e > self.e2e:
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
        self.prompt_class = prompt_classes or PromptClasses()
        # The request figures' families, from the table (sidecar/export/families.py).
        for family in FAMILIES:
            setattr(self, family.attr, family.make(registry, tenants))
        self._children_of()
        self._rows: dict[RowKey, Row] = {}  # a request's cells by its label values (record)
        self._finish_labels: dict[str, str] = {}  # finish_reason_label's, by the raw reason
        self._overhead_request = Observed(self.overhead.labels("request"))
        self._overhead_response = Observed(self.overhead.labels("response"))
        # Made now, at 0, and never removed: counting a refusal must not itself need a
        # series when the budget is full (and the rate of it counts the first refusal).
        self._refused_children = {
            fate: self.series_refused.labels(fate) for fate in SERIES_REFUSED_FATES
        }
        # In-flight gauge children a request started under when its own series was refused
        # (the gate gave the 'other' row): the request ends on the same child.
        self._in_flight_folded: dict[tuple[str, str], list[Count]] = {}
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

    def _children_of(self) -> None:
        """Each family's children, resolved once per label set (:class:`Children`)."""
        self.c_requests: Children[RequestLabels, Count] = Children(self.requests, count_of)
        self.c_finish_reasons: Children[FinishReasonLabels, Count] = Children(
            self.finish_reasons, count_of
        )
        self.c_non_api: Children[NonApiLabels, Count] = Children(self.non_api, count_of)
        self.c_in_flight: Children[ModelRouteLabels, Count] = Children(self.in_flight, count_of)
        self.c_duration: Children[DurationLabels, Observed] = Children(self.duration, Observed)
        self.c_ttfb: Children[ModelOnly, Observed] = Children(self.ttfb, Observed)
        self.c_ttft: Children[TtftLabels, Observed] = Children(self.ttft, Observed)
        self.c_ttfat: Children[ModelOnly, Observed] = Children(self.ttfat, Observed)
        self.c_itl: Children[ModelOnly, Observed] = Children(self.itl, Observed)
        self.c_tpot: Children[ModelOnly, Observed] = Children(self.tpot, Observed)
        self.c_tps: Children[ModelOnly, Observed] = Children(self.tps, Observed)
        self.c_tokens: Children[TokenLabels, Count] = Children(self.tokens, count_of)
        self.c_request_tokens: Children[RequestTokenLabels, Observed] = Children(
            self.request_tokens, Observed
        )
        self.c_within_slo: Children[ModelTenantLabels, Count] = Children(self.within_slo, count_of)
        self.c_request_objectives: Children[ObjectiveLabels, Count] = Children(
            self.request_objectives, count_of
        )
        self.c_request_objective_invalid: Children[ObjectiveInvalidLabels, Count] = Children(
            self.request_objective_invalid, count_of
        )
        self.c_ttft_by_cache: Children[CacheLabels, Observed] = Children(
            self.ttft_by_cache, Observed
        )
        self.c_time_to_first_tool_call: Children[ModelOnly, Observed] = Children(
            self.time_to_first_tool_call, Observed
        )
        self.c_tool_call_assembly: Children[ModelOnly, Observed] = Children(
            self.tool_call_assembly, Observed
        )
        self.c_tool_calls_per_response: Children[ModelOnly, Observed] = Children(
            self.tool_calls_per_response, Observed
        )
        self.c_upstream_load: Children[ModelOnly, Observed] = Children(self.upstream_load, Observed)
        self.c_upstream_prefill: Children[ModelOnly, Observed] = Children(
            self.upstream_prefill, Observed
        )
        self.c_upstream_decode: Children[ModelOnly, Observed] = Children(
            self.upstream_decode, Observed
        )
        self.c_upstream_queue: Children[ModelOnly, Observed] = Children(
            self.upstream_queue, Observed
        )
        self.c_parse_errors: Children[RouteOnly, Count] = Children(self.parse_errors, count_of)
        self.c_token_count_source: Children[SourceLabels, Count] = Children(
            self.token_count_source, count_of
        )
        self.c_label_overflow: Children[OverflowLabels, Count] = Children(
            self.label_overflow, count_of
        )
        self._children: tuple[Children[Any, Any], ...] = tuple(
            v for v in vars(self).values() if isinstance(v, Children)
        )

    def _own_health(self, registry: CollectorRegistry, version: str | None) -> None:
        """The sidecar's own process (``process_*``: CPU seconds, resident memory, open and
        max file descriptors, from /proc) and what is running: ``llm_sidecar_build_info``,
        whose ``speedups`` says whether the C byte checks loaded (docs/performance.md says
        what a build without them costs)."""
        if version is None:
            from .. import __version__ as version
        try:
            ProcessCollector(registry=registry)
        except ValueError:  # the registry has process_* already (a second SidecarMetrics on it)
            pass
        build_info = family_row(OWN_FAMILIES, "build_info").make(registry, False)
        assert isinstance(build_info, Gauge), "the table's kind"
        self.build_info = build_info
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
            self.c_label_overflow.get({"label": label, "reason": reason}).add(1)

        return count

    def forget(self, label: str, value: str) -> int:
        """Remove every series whose ``label`` is ``value`` (an idle value gave its slot back),
        and the children kept for it."""
        for children in self._children:
            children.forget(label, value)
        self._rows.clear()  # some rows hold a removed child
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
            children = self.c_in_flight
            child = children.kept.get(key)
            if child is None:
                child = children.at(key)
                if key not in children.kept:  # the series gate gave another row
                    self._in_flight_folded.setdefault(key, []).append(child)
            child.add(1)

    def ended(self, model_label: str, route: str) -> None:
        """The in-flight gauge ends under the label the request started with (the record's
        label may differ: a value can earn its slot as the request finishes), on the very
        child it started on; then the label is released."""
        if route in ROUTES:
            key = (model_label, route)
            folded = self._in_flight_folded.get(key) if self._in_flight_folded else None
            if folded:
                child = folded.pop()
                if not folded:
                    del self._in_flight_folded[key]
            else:
                child = self.c_in_flight.at(key)
            child.add(-1)
        self.model_label.release(model_label)

    def record(self, t: RequestSummary) -> None:
        """Observe one finished request (its summary). Called exactly once per request.

        The families a request moves are one :class:`Row` per combination of its label
        values, made at the combination's first request: recording is one lookup of the row
        and one write of the request's figures into it (:meth:`_row` says which slot is
        which). Finish reasons, a request's few, are counted apart, each by its label."""
        model, route = t.model_label, t.route
        outcome = t.outcome._value_
        code = t.code
        k: tuple[str, ...]  # a family's key: its label values in their by-name order
        if not t.api:
            # Not an API request (a health check, the server's own /metrics, a model listing
            # through the proxy port): one count apart, so it never forms an SLO of its own
            # (model "unknown", route "other") nor dilutes the real requests' error ratio.
            method = method_label(t.method)
            non_api = self.c_non_api
            k = (method, code, outcome)
            (
                non_api.memo.get(k)
                or non_api.remember(k, {"method": method, "code": code, "outcome": outcome})
            ).add(1)
            self._record_overhead(t)  # the sidecar's own cost, whatever it relayed
            return
        tenant = (t.tenant or UNKNOWN) if self.tenants else UNKNOWN
        streamed = t.streamed
        ttft = t.ttft if streamed else None
        prompt_class = cache = ""
        if ttft is not None:
            prompt_class = self.prompt_class(t.input_tokens)
            if t.cache is not None and t.cache is not CacheClass.UNKNOWN:
                cache = t.cache._value_  # unknown: the TTFT histogram already has it
        judged = t.judgement
        ttft_met = tpot_met = met = None
        if judged is not None:
            ttft_met, tpot_met, met = judged.ttft_met, judged.tpot_met, judged.met
        key: RowKey = (
            model, route, code, outcome, t.error_type, tenant, prompt_class, cache,
            t.token_count_source._value_, ttft_met, tpot_met, met,
        )  # fmt: skip
        row = self._rows.get(key)
        if row is None:
            row = self._row(key)
        ok = t.outcome is Outcome.OK
        inputs, outputs = t.input_tokens, t.output_tokens
        engine = t.engine
        first_call = t.time_to_first_tool_call if streamed else None
        gaps = t.gaps if streamed else None
        # The slots, in the order of _row. A cancelled request's duration is when its client
        # chose to leave, not how the server did: llm_requests_total counts it, no
        # distribution holds it. A token count of 0 moves no counter (no series for it).
        row.write(
            (
                1,
                None if t.outcome is Outcome.CANCELLED else t.e2e,
                t.ttfb,
                t.parse_errors or None,
                ttft,
                ttft if cache else None,
                t.ttfat if streamed else None,
                first_call,
                None if first_call is None else t.tool_call_assembly,
                None if first_call is None else t.tool_call_count,
                gaps or None,
                t.tpot if streamed else None,
                t.tokens_per_second if streamed else None,
                inputs or None,
                inputs if ok else None,
                outputs or None,
                outputs if ok else None,
                t.reasoning_tokens or None,
                t.cached_input_tokens or None,
                1,
                None if engine is None else engine.load_seconds,
                None if engine is None else engine.prefill_seconds,
                None if engine is None else engine.decode_seconds,
                None if engine is None else engine.queue_seconds,
                t.request_overhead,
                t.response_overhead,
                1 if self.slo is not None and self.slo.met_by(t) else None,
                None if ttft_met is None else 1,
                None if tpot_met is None else 1,
                None if met is None else 1,
            ),
            {"trace_id": t.trace_id} if t.trace_id else None,  # an exemplar: the bucket's trace
        )
        if gaps and t.gap_runs:
            itl = row.cell(_ITL_SLOT)
            for index, count in t.gap_runs:  # k tokens of one event: k gaps, one entry
                itl.observe_repeated(gaps[index], count - 1)
        reasons = t.finish_reasons
        if reasons:
            finish = self.c_finish_reasons
            labels = self._finish_labels
            for raw in reasons[:MAX_FINISH_REASONS_PER_REQUEST]:
                reason = labels[raw] if raw in labels else None
                if reason is None:
                    reason = finish_reason_label(raw)
                    if len(labels) < _FINISH_LABELS_KEPT:
                        labels[raw] = reason
                k = (model, route, reason)
                (
                    finish.memo.get(k)
                    or finish.remember(k, {"model": model, "route": route, "finish_reason": reason})
                ).add(1)
        if t.objectives_invalid:
            for name in t.objectives_invalid:
                self.c_request_objective_invalid.get({"route": route, "objective": name}).add(1)

    def _row(self, key: RowKey) -> Row:
        """The row for ``key`` (:meth:`record`'s label values), kept: one slot per family
        update a request may make, in the order :meth:`record` writes them (so a new label
        combination makes its series in the same order, family by family, as always)."""
        model, route, code, outcome, error_type, tenant, prompt_class, cache, source = key[:9]
        ttft_met, tpot_met, met = key[9:]
        m: ModelOnly = {"model": model}

        def result(judged: bool | None) -> str:
            return "met" if judged else "missed"

        slots = [
            self.c_requests.slot(
                {
                    "model": model,
                    "route": route,
                    "code": code,
                    "outcome": outcome,
                    "error_type": error_type,
                    "tenant": tenant,
                }
            ),
            self.c_duration.slot({"model": model, "outcome": outcome}, exemplar=True),
            self.c_ttfb.slot(m, exemplar=True),
            self.c_parse_errors.slot({"route": route}),
            self.c_ttft.slot(
                {"model": model, "prompt_class": prompt_class, "tenant": tenant}, exemplar=True
            ),
            self.c_ttft_by_cache.slot({"model": model, "cache": cache}, exemplar=True),
            self.c_ttfat.slot(m, exemplar=True),
            self.c_time_to_first_tool_call.slot(m, exemplar=True),
            self.c_tool_call_assembly.slot(m, many=True),
            self.c_tool_calls_per_response.slot(m),
            self.c_itl.slot(m, many=True),
            self.c_tpot.slot(m, exemplar=True),
            self.c_tps.slot(m),
            self.c_tokens.slot({"model": model, "route": route, "type": "input", "tenant": tenant}),
            self.c_request_tokens.slot({"model": model, "type": "input"}),
            self.c_tokens.slot(
                {"model": model, "route": route, "type": "output", "tenant": tenant}
            ),
            self.c_request_tokens.slot({"model": model, "type": "output"}),
            self.c_tokens.slot(
                {"model": model, "route": route, "type": "reasoning", "tenant": tenant}
            ),
            self.c_tokens.slot(
                {"model": model, "route": route, "type": "cached_input", "tenant": tenant}
            ),
            self.c_token_count_source.slot({"model": model, "route": route, "source": source}),
            self.c_upstream_load.slot(m),
            self.c_upstream_prefill.slot(m),
            self.c_upstream_decode.slot(m),
            self.c_upstream_queue.slot(m),
            Slot.ready(self._overhead_request),
            Slot.ready(self._overhead_response),
            self.c_within_slo.slot({"model": model, "tenant": tenant}),
            self.c_request_objectives.slot(
                {"model": model, "objective": "ttft", "result": result(ttft_met), "tenant": tenant}
            ),
            self.c_request_objectives.slot(
                {"model": model, "objective": "tpot", "result": result(tpot_met), "tenant": tenant}
            ),
            self.c_request_objectives.slot(
                {"model": model, "objective": "all", "result": result(met), "tenant": tenant}
            ),
        ]
        if len(self._rows) >= _ROWS_KEPT:
            self._rows.clear()  # a bound on what combinations cost; they are made again
        assert slots[_ITL_SLOT].children is self.c_itl, "record reads the ITL's cell there"
        row = self._rows[key] = Row(slots)
        return row

    def _record_overhead(self, t: RequestSummary) -> None:
        overhead = t.request_overhead
        if overhead is not None:
            self._overhead_request.observe(overhead)
        overhead = t.response_overhead
        if overhead is not None:
            self._overhead_response.observe(overhead)
