"""The aggregates group: the raw series an SLO, an alert or a headline panel needs, summed
once per evaluation by (cluster, namespace, llm_release), the series' own ``model`` and
``route`` where its family has them, and the few labels its panels split or filter by, over
the SLOs' base window (5m).

Why: a panel over raw series reads every pod's every series (each bucket, each prompt class)
over the rate window at every step, and does so again for every viewer and every refresh. A
rule reads them once per evaluation and writes one series per deployment, model and route;
the panels then read those, and so do the SLO, error and goodput rules
(:func:`recorded_rate`): each raw series is read once an evaluation, not once per reader.

What a rule costs is paid at every evaluation, whether or not anyone looks, and what an
evaluation costs is the series it reads and writes, far more than their samples (a series
read over the window costs about as much over 1m as over 5m; docs/performance.md, "What a
rule evaluation costs"). So records are kept for what is read all the time, and nothing else
is recorded:

- **No per-pod records.** A drill-down to pods reads the raw series over
  ``$__rate_interval`` when someone opens it, bounded by ``topk``, instead of every
  evaluation writing every pod's series and reading them again.
- **The detail views are read when drawn** (:data:`READ_WHEN_DRAWN`): time to first byte,
  the tool-call times, decode speed, request sizes, the engine's phases, TTFT by prefix-cache
  class, finish reasons, token count sources, the requests' own objectives, the sidecar's
  own overhead, and the in-flight and phase gauges (a gauge drawn raw is an instant read, as
  cheap a series as its record). No alert or capacity figure reads them, and a panel summed
  by release and model draws a bounded number of lines from them; recording them cost the
  fleet more every 15 seconds than opening them costs once.
- A histogram's ``_count`` rate whose ``_bucket`` rate is recorded with the same labels is
  that record's ``le="+Inf"`` series, written just before it (the same number: a classic
  histogram's count is its ``+Inf`` bucket), not a second raw read.

Names follow ``level:metric:operations``: ``llm:<series without llm_ and _total>:rate5m``
(``llm:requests:rate5m``, ``llm:time_to_first_token_seconds_bucket:rate5m``), ``:sum`` (or
``:max``) for a gauge and ``:count`` for a count of series. ``le`` is kept on every
``_bucket`` record, so any quantile or heatmap of the selected releases and models is
``histogram_quantile`` over the recorded bucket rates.

The window is 5m, the SLOs' base window, so the SLOs' events are these records' sums: the
same rate a raw read would give, and a headline panel shows what the SLO's short window
judges. The group comes first in the rules file; Prometheus runs groups apart, so a later
group reads its records as of their last evaluation (at most one interval old), and a panel
shows the rate over [t-5m, t] as of that evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...export import in_flight
from ...export.families import FAMILIES, NAMESPACE, OWN_FAMILIES
from .promql import Group, Matcher, Rule, selector, spec_matchers
from .spec import SLOSpec
from .windows import format_duration

__all__ = [
    "GROUP",
    "WINDOW",
    "BASE_LABELS",
    "READ_WHEN_DRAWN",
    "Aggregate",
    "AGGREGATES",
    "find",
    "own_labels",
    "read_when_drawn",
    "recorded_rate",
    "aggregates_group",
]

GROUP = "llm-sidecar-aggregates"
WINDOW = 5 * 60
BASE_LABELS: tuple[str, ...] = ("cluster", "namespace", "llm_release", "model", "route")
"""What a record keeps: the target labels, and ``model`` and ``route`` where the series has
them (:data:`~sidecar.export.families.FAMILIES` says which)."""
OWN_LABELS = frozenset({"model", "route"})
"""The sidecar's own labels among those: kept only on the series that have them."""
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
_FAMILY_LABELS: dict[str, frozenset[str]] = {
    **{f"{NAMESPACE}_{f.name}": frozenset(f.labels) for f in (*FAMILIES, *OWN_FAMILIES)},
    # The in-flight collector's gauges, read at scrape time (no family row declares them).
    **{
        name: frozenset(in_flight.LABELS)
        for name in (in_flight.IN_PHASE, in_flight.OLDEST, in_flight.STALLED)
    },
}

READ_WHEN_DRAWN: frozenset[str] = frozenset(
    {
        "llm_time_to_first_byte_seconds",
        "llm_time_to_first_token_by_cache_seconds",
        "llm_time_to_first_tool_call_seconds",
        "llm_tool_call_assembly_seconds",
        "llm_tool_calls_per_response",
        "llm_output_tokens_per_second",
        "llm_request_tokens",
        "llm_upstream_load_seconds",
        "llm_upstream_queue_seconds",
        "llm_upstream_prefill_seconds",
        "llm_upstream_decode_seconds",
        "llm_sidecar_overhead_seconds",
        "llm_token_count_source",
        "llm_finish_reasons",
        "llm_request_objectives",
        # Gauges: a panel's read of the raw gauge is an instant read, no rate window, so
        # drawing it costs about what reading a record of it would, and no rule reads them.
        "llm_requests_in_flight",
        "llm_requests_in_phase",
        "llm_requests_in_phase_oldest_seconds",
    }
)
"""The families whose panels read the raw series when drawn, summed by release and model (or
bounded by ``topk`` per pod): detail views, and the in-flight gauges, that no SLO, alert or
capacity figure reads."""


def _family(series: str) -> str:
    name = series
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in _FAMILY_LABELS:
            return name.removesuffix(suffix)
    return name


def own_labels(series: str) -> frozenset[str]:
    """The labels the sidecar puts on ``series`` (``model``, ``route``, ``outcome``, ``le``
    for buckets...), not the target labels; KeyError for a series nobody declares."""
    family = _family(series)
    labels = _FAMILY_LABELS.get(family)
    if labels is None:
        raise KeyError(f"{series}: no family declares it")
    return labels | ({"le"} if series.endswith("_bucket") else set())


def read_when_drawn(series: str) -> bool:
    """Whether a panel reads ``series`` raw (its family is in :data:`READ_WHEN_DRAWN`)."""
    return _family(series) in READ_WHEN_DRAWN


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One recorded series: ``series`` (a counter, a histogram's ``_bucket``, ``_sum`` or
    ``_count``, or a gauge) summed by the base labels and ``labels``."""

    series: str
    labels: tuple[str, ...] = ()
    how: str = "rate"
    """``rate`` (a counter), ``sum`` or ``max`` (a gauge) or ``count`` (series counted)."""

    @property
    def kept(self) -> tuple[str, ...]:
        """The target labels, the series' own ``model`` and ``route`` (the histograms are per
        model, not per route), ``labels`` and ``le`` for buckets."""
        own = own_labels(self.series)
        base = tuple(label for label in BASE_LABELS if label not in OWN_LABELS or label in own)
        le = ("le",) if self.series.endswith("_bucket") else ()
        return (*base, *self.labels, *le)

    @property
    def record(self) -> str:
        stem = self.series.removeprefix("llm_").removesuffix("_total")
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


AGGREGATES: tuple[Aggregate, ...] = (
    Aggregate("llm_requests_total", ("outcome", "code", "error_type")),
    Aggregate("llm_non_api_requests_total", ("method", "code")),
    Aggregate("llm_requests_within_slo_total"),
    Aggregate("llm_stream_parse_errors_total"),
    Aggregate("llm_tokens_total", ("type",)),
    Aggregate("llm_request_objective_invalid_total", ("objective",)),
    Aggregate("llm_label_overflow_total", ("label", "reason")),
    Aggregate("llm_series_refused_total", ("fate",)),
    Aggregate("llm_sidecar_build_info", ("version", "speedups"), how="count"),
    *_histogram("llm_time_to_first_token_seconds", parts="bucket sum count"),
    *_histogram("llm_time_to_first_answer_token_seconds"),
    *_histogram("llm_inter_token_latency_seconds"),
    *_histogram("llm_time_per_output_token_seconds"),
    *_histogram("llm_request_duration_seconds", "outcome"),
)

_BY_SERIES = {a.series: a for a in AGGREGATES}
assert len(_BY_SERIES) == len(AGGREGATES), "one record per series"
assert not any(read_when_drawn(a.series) for a in AGGREGATES), "recorded or read when drawn"


def find(series: str) -> Aggregate:
    """The record of ``series``; KeyError names what is missing."""
    try:
        return _BY_SERIES[series]
    except KeyError:
        raise KeyError(
            f"no record of {series}: add it to sidecar/tools/slo/aggregates.py"
        ) from None


def _inf_bucket_source(a: Aggregate, grouping: Sequence[str]) -> Aggregate | None:
    """The bucket record whose ``le="+Inf"`` series is ``a`` (a histogram's ``_count`` rate):
    the same histogram, keeping every label ``a`` keeps."""
    if a.how != "rate" or not a.series.endswith("_count"):
        return None
    source = _BY_SERIES.get(a.series.removesuffix("_count") + "_bucket")
    if source is None:
        return None
    return source if set(a.labels_kept(grouping)) <= set(source.labels_kept(grouping)) else None


def recorded_rate(
    spec: SLOSpec, series: str, matchers: Sequence[Matcher], by: Sequence[str]
) -> str | None:
    """``sum by (by) (rate(series{matchers}[WINDOW]))`` read from this group's record of
    ``series`` (a ``_count`` from its bucket record's ``le="+Inf"`` series), or None when no
    record answers it: a series not recorded, or a label the record does not keep (then the
    caller reads the raw series). The spec's own selector is already applied to every
    record (:func:`aggregates_group` reads the raw series through it), so its matchers on
    labels a record drops are left out, not failed on."""
    le: list[Matcher] = []
    source = _BY_SERIES.get(series)
    if series.endswith("_count"):
        source = _BY_SERIES.get(series.removesuffix("_count") + "_bucket")
        le = [("le", "=", "+Inf")]
    if source is None or source.how != "rate":
        return None
    kept = set(source.labels_kept(spec.grouping))
    applied = set(spec_matchers(spec))
    keep = [m for m in matchers if m[0] in kept or m not in applied]
    if any(label not in kept for label in (*by, *(m[0] for m in keep))):
        return None
    return f"sum by ({', '.join(by)}) ({selector(source.record, [*keep, *le])})"


def aggregates_group(spec: SLOSpec) -> Group:
    """Every record, each reading only the spec's selector (a release's own series). A
    ``_count`` rate whose bucket rate is recorded is that record's ``+Inf`` series, written
    earlier in the same evaluation, so it does not read the raw series a second time."""
    sel = spec_matchers(spec)
    by = spec.grouping
    rules = []
    for a in AGGREGATES:
        kept = ", ".join(a.labels_kept(by))
        inf = _inf_bucket_source(a, by)
        if inf is not None:
            expr = f"sum by ({kept}) ({selector(inf.record, [*sel, ('le', '=', '+Inf')])})"
        else:
            expr = a.expr(sel, by)
        rules.append(Rule(expr, record=a.record))
    return Group(GROUP, tuple(rules))
