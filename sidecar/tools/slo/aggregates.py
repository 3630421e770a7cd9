"""The recorded series the dashboards read: every raw series a panel needs, summed once per
evaluation by (cluster, namespace, llm_release), the series' own ``model`` and ``route``
where its family has them, and the few labels its panels split or filter by, over a short
window.

Why: a panel over raw series reads every pod's every series (each bucket, each prompt class)
over the rate window at every step, and does so again for every viewer and every refresh. A
rule reads them once per evaluation and writes one series per deployment, model and route;
the panels then read those. The pod is summed away: the per-pod records (``per_pod``) keep
it but not ``route``, and only the per-pod drill-down panels read them, each bounded by
``topk``. A record whose per-pod record keeps every label it keeps is the sum of that
record, written just before it in the same evaluation: one raw read, not two, and no delay.

What an evaluation costs is the series it reads and writes, far more than their samples (a
series read over the window costs about as much over 1m as over 5m): so no histogram's
buckets are recorded per pod (a per-pod quantile reads the raw buckets, bounded by ``topk``,
when someone opens the panel, instead of every evaluation writing every pod's buckets and
reading them again), and a histogram's ``_count`` rate whose ``_bucket`` rate is recorded
with the same labels is that record's ``le="+Inf"`` series, written just before it (the
same number: a classic histogram's count is its ``+Inf`` bucket), not a second raw read.

Names follow ``level:metric:operations``: ``llm:<series without llm_ and _total>:rate2m``
(``llm:requests:rate2m``, ``llm:time_to_first_token_seconds_bucket:rate2m``), ``_per_pod``
after the metric for the per-pod records, ``:sum`` (or ``:max``) for a gauge and ``:count``
for a count of series. ``le`` is kept on every ``_bucket`` record, so any quantile or
heatmap of the selected releases and models is ``histogram_quantile`` over the recorded
bucket rates.

The window is 2m: four scrapes at the 30s interval kube-prometheus-stack scrapes at, so a
missed scrape leaves a rate rather than a gap. The panels read the recorded rates as they
are: what a panel shows at time t is the rate over [t-2m, t] as of the group's last
evaluation (at most one evaluation interval old).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...export.families import FAMILIES, NAMESPACE
from .rules import Group, Matcher, Rule, _spec_matchers, selector
from .spec import SLOSpec
from .windows import format_duration

__all__ = [
    "GROUP",
    "WINDOW",
    "BASE_LABELS",
    "POD_LABELS",
    "Aggregate",
    "AGGREGATES",
    "find",
    "aggregates_group",
]

GROUP = "llm-sidecar-dashboards"
WINDOW = 2 * 60
BASE_LABELS: tuple[str, ...] = ("cluster", "namespace", "llm_release", "model", "route")
"""What a record keeps: the target labels, and ``model`` and ``route`` where the series has
them (:data:`~sidecar.export.families.FAMILIES` says which)."""
POD_LABELS: tuple[str, ...] = ("cluster", "namespace", "llm_release", "pod", "model")
"""What a per-pod record keeps: the pod, not the route (a pod serves its model on every route),
unless the record names it among its own labels (the requests and tokens, whose release records
are summed from them)."""
OWN_LABELS = frozenset({"model", "route"})
"""The sidecar's own labels among those: kept only on the series that have them."""
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
_FAMILY_LABELS: dict[str, frozenset[str]] = {
    f"{NAMESPACE}_{f.name}": frozenset(f.labels) for f in FAMILIES
}


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One recorded series: ``series`` (a counter, a histogram's ``_bucket``, ``_sum`` or
    ``_count``, or a gauge) summed by the base labels and ``labels``."""

    series: str
    labels: tuple[str, ...] = ()
    how: str = "rate"
    """``rate`` (a counter), ``sum`` or ``max`` (a gauge) or ``count`` (series counted)."""
    per_pod: bool = False
    own: tuple[str, ...] | None = None
    """Which of ``model`` and ``route`` the series has, for a series no family declares (the
    in-flight collector's, the build info); None: its family's labels say."""

    def _own(self) -> frozenset[str]:
        if self.own is not None:
            return frozenset(self.own)
        name = self.series
        for suffix in _SUFFIXES:
            name = name.removesuffix(suffix)
        labels = _FAMILY_LABELS.get(name)
        if labels is None:
            raise KeyError(f"{self.series}: no family declares it; say its labels with own=")
        return labels

    @property
    def kept(self) -> tuple[str, ...]:
        """The target labels, the series' own ``model`` and ``route`` (the histograms are per
        model, not per route), ``labels`` and ``le`` for buckets."""
        base = POD_LABELS if self.per_pod else BASE_LABELS
        own = self._own()
        base = tuple(label for label in base if label not in OWN_LABELS or label in own)
        le = ("le",) if self.series.endswith("_bucket") else ()
        return (*base, *self.labels, *le)

    @property
    def record(self) -> str:
        stem = self.series.removeprefix("llm_").removesuffix("_total")
        if self.per_pod:
            stem += "_per_pod"
        op = f"rate{format_duration(WINDOW)}" if self.how == "rate" else self.how
        return f"llm:{stem}:{op}"

    def labels_kept(self, grouping: Sequence[str] = ()) -> list[str]:
        """What the rule sums by: :attr:`kept` and the spec's other grouping labels (not a
        ``model`` or ``route`` the series lacks)."""
        extra = (g for g in grouping if g not in self.kept and g not in OWN_LABELS)
        return [*self.kept, *extra]

    def expr(self, matchers: Sequence[Matcher], grouping: Sequence[str] = ()) -> str:
        kept = self.labels_kept(grouping)
        raw = selector(self.series, matchers)
        inner = f"rate({raw}[{format_duration(WINDOW)}])" if self.how == "rate" else raw
        return f"{self.how if self.how != 'rate' else 'sum'} by ({', '.join(kept)}) ({inner})"


def _histogram(name: str, *labels: str, parts: str = "bucket") -> list[Aggregate]:
    """The named parts (``bucket``, ``sum``, ``count``) of one histogram."""
    return [Aggregate(f"{name}_{part}", labels) for part in parts.split()]


def _per_pod(name: str, *labels: str, parts: str) -> list[Aggregate]:
    return [Aggregate(f"{name}_{part}", labels, per_pod=True) for part in parts.split()]


_IN_FLIGHT = ("model", "route")  # sidecar/export/in_flight.py

AGGREGATES: tuple[Aggregate, ...] = (
    # The per-pod drill-downs (the overview's "Per pod" row, "Where the time goes"), first:
    # the records below that keep no label they lack are summed from them. The requests and
    # tokens per pod keep every label of their release records (route, code, error type), so
    # those are sums of these and each raw counter is read once an evaluation, not twice.
    Aggregate("llm_requests_total", ("route", "outcome", "code", "error_type"), per_pod=True),
    Aggregate("llm_requests_in_flight", how="sum", per_pod=True),
    Aggregate("llm_streams_stalled", ("phase",), how="sum", per_pod=True, own=_IN_FLIGHT),
    Aggregate("llm_tokens_total", ("route", "type"), per_pod=True),
    *_per_pod("llm_time_to_first_token_seconds", parts="sum count"),
    *_per_pod("llm_request_duration_seconds", "outcome", parts="sum count"),
    *_per_pod("llm_upstream_queue_seconds", parts="sum count"),
    *_per_pod("llm_upstream_prefill_seconds", parts="sum count"),
    *_per_pod("llm_upstream_decode_seconds", parts="sum count"),
    Aggregate("llm_requests_total", ("outcome", "code", "error_type")),
    Aggregate("llm_finish_reasons_total", ("finish_reason",)),
    Aggregate("llm_non_api_requests_total", ("method", "code")),
    Aggregate("llm_requests_in_flight", how="sum"),
    Aggregate("llm_requests_in_phase", ("phase",), how="sum", own=_IN_FLIGHT),
    Aggregate("llm_requests_in_phase_oldest_seconds", ("phase",), how="max", own=_IN_FLIGHT),
    Aggregate("llm_requests_within_slo_total"),
    Aggregate("llm_stream_parse_errors_total"),
    Aggregate("llm_tokens_total", ("type",)),
    Aggregate("llm_request_objectives_total", ("objective", "result")),
    Aggregate("llm_request_objective_invalid_total", ("objective",)),
    Aggregate("llm_token_count_source_total", ("source",)),
    Aggregate("llm_label_overflow_total", ("label", "reason")),
    Aggregate("llm_series_refused_total", ("fate",)),
    Aggregate("llm_sidecar_build_info", ("version", "speedups"), how="count", own=()),
    *_histogram("llm_time_to_first_token_seconds", parts="bucket sum count"),
    *_histogram("llm_time_to_first_answer_token_seconds"),
    *_histogram("llm_inter_token_latency_seconds"),
    *_histogram("llm_time_per_output_token_seconds"),
    *_histogram("llm_request_duration_seconds", "outcome"),
    *_histogram("llm_time_to_first_byte_seconds"),
    *_histogram("llm_time_to_first_token_by_cache_seconds", "cache", parts="bucket count"),
    *_histogram("llm_time_to_first_tool_call_seconds"),
    *_histogram("llm_tool_call_assembly_seconds"),
    *_histogram("llm_tool_calls_per_response", parts="sum count"),
    *_histogram("llm_output_tokens_per_second", parts="bucket sum count"),
    *_histogram("llm_request_tokens", "type", parts="bucket sum count"),
    *_histogram("llm_upstream_load_seconds", parts="bucket sum count"),
    *_histogram("llm_upstream_prefill_seconds", parts="bucket sum count"),
    *_histogram("llm_upstream_decode_seconds", parts="bucket"),
    *_histogram("llm_sidecar_overhead_seconds", "direction", parts="bucket sum count"),
)

_BY_SERIES = {(a.series, a.per_pod): a for a in AGGREGATES}
assert len(_BY_SERIES) == len(AGGREGATES), "one record per series and kind"


def find(series: str, per_pod: bool = False) -> Aggregate:
    """The record of ``series`` (per pod or not); KeyError names what is missing."""
    try:
        return _BY_SERIES[(series, per_pod)]
    except KeyError:
        kind = "per-pod " if per_pod else ""
        raise KeyError(
            f"no {kind}record of {series}: add it to sidecar/tools/slo/aggregates.py"
        ) from None


def _per_pod_source(a: Aggregate, grouping: Sequence[str]) -> Aggregate | None:
    """The per-pod record ``a`` can be summed from: the same series and kind, keeping every
    label ``a`` keeps (so the sum is exactly ``a``'s own)."""
    source = None if a.per_pod else _BY_SERIES.get((a.series, True))
    if source is None or source.how not in ("rate", "sum") or source.how != a.how:
        return None
    return source if set(a.labels_kept(grouping)) <= set(source.labels_kept(grouping)) else None


def _inf_bucket_source(a: Aggregate, grouping: Sequence[str]) -> Aggregate | None:
    """The bucket record whose ``le="+Inf"`` series is ``a`` (a histogram's ``_count`` rate):
    the same histogram and kind, keeping every label ``a`` keeps."""
    if a.how != "rate" or not a.series.endswith("_count"):
        return None
    source = _BY_SERIES.get((a.series.removesuffix("_count") + "_bucket", a.per_pod))
    if source is None:
        return None
    return source if set(a.labels_kept(grouping)) <= set(source.labels_kept(grouping)) else None


def aggregates_group(spec: SLOSpec) -> Group:
    """Every record, each reading only the spec's selector (a release's own series). A
    ``_count`` rate whose bucket rate is recorded is that record's ``+Inf`` series; a record
    whose per-pod sibling keeps all its labels sums that record. Both sources are written
    earlier in the same evaluation, so neither reads the raw series a second time."""
    sel = _spec_matchers(spec)
    by = spec.grouping
    rules = []
    for a in AGGREGATES:
        kept = ", ".join(a.labels_kept(by))
        inf = _inf_bucket_source(a, by)
        source = _per_pod_source(a, by)
        if inf is not None:
            expr = f"sum by ({kept}) ({selector(inf.record, [*sel, ('le', '=', '+Inf')])})"
        elif source is not None:
            expr = f"sum by ({kept}) ({selector(source.record, sel)})"
        else:
            expr = a.expr(sel, by)
        rules.append(Rule(expr, record=a.record))
    return Group(GROUP, tuple(rules))
