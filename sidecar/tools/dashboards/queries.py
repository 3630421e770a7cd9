"""PromQL for the dashboards: one place for selectors, rates, quantiles and ratios.

The panels read recorded series where a rule records them: :func:`sum_rate`,
:func:`quantile`, :func:`mean`, :func:`sum_gauge` and :func:`max_gauge` read the records of
:mod:`sidecar.tools.slo.aggregates` (rates over 5m, summed by cluster, namespace, release,
model, route and the labels the panels split by, evaluated with the SLO rules), so a panel
reads one series per deployment, model and route instead of every pod's every bucket. Asking
for a label a record does not keep raises at generation time.

Two kinds of query read the raw series over ``$__rate_interval`` (Grafana's window that always
holds at least four scrapes) instead, when the panel is drawn, because recording them would
cost every evaluation what the panel costs when someone opens it:

- a drill-down to pods (``pod`` among the labels it keeps): every per-pod panel draws at
  most :data:`POD_LINES` pods (:func:`top_pods`), as a test checks;
- a detail view (:data:`~sidecar.tools.slo.aggregates.READ_WHEN_DRAWN`), summed by release,
  model and the labels the panel splits by, so it draws a bounded number of lines.

Anything else that no rule records raises: a new panel cannot read raw series by accident.

Every selector carries the dashboard's filter variables the series keeps (a record summed
over pods or routes ignores the pod or route filter). Recorded SLO series (``llm:*``) are
aggregated by the SLO spec's grouping labels and carry ``slo``; they take the filters of the
grouping labels that are variables (cluster, namespace, model by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..slo import aggregates
from ..slo.promql import promql_string

__all__ = [
    "RATE_INTERVAL",
    "TARGET_LABELS",
    "ENGINE_LABELS",
    "on_release_pods",
    "FILTER_LABELS",
    "Matcher",
    "selector",
    "rate",
    "POD_LINES",
    "top_pods",
    "raw_sum_rate",
    "sum_rate",
    "sum_gauge",
    "max_gauge",
    "quantile",
    "mean",
    "ratio_or_zero",
    "zero_if_absent",
    "recorded",
]

RATE_INTERVAL = "$__rate_interval"

TARGET_LABELS: tuple[str, ...] = ("cluster", "namespace", "llm_release", "pod")
"""Labels Prometheus adds to each scraped series (kube-prometheus-stack's ServiceMonitor and
PodMonitor add ``namespace`` and ``pod``, the chart's monitors ``llm_release`` (the release:
``<its namespace>/<its name>``; not ``deployment``, kube-state-metrics' Deployment name);
``cluster`` comes from an external label or a
Thanos/Mimir setup); the sidecar itself does not export them."""

ENGINE_LABELS: tuple[str, ...] = tuple(label for label in TARGET_LABELS if label != "llm_release")
"""The target labels an engine's own series (``vllm:*``) can be filtered by: a team's own
scrape of its server (monitoring-only, where the chart's engine scrape is off by default)
gives them ``namespace`` and ``pod`` but no ``llm_release``; :func:`on_release_pods` keeps
the release's pods instead."""


def on_release_pods(expr: str) -> str:
    """``expr`` (one series per namespace and pod) kept for the pods of the selected releases,
    known by the sidecar's ``llm_sidecar_build_info`` (one per scraped sidecar, from its start),
    so an engine series counts wherever it was scraped, with or without ``llm_release``."""
    pods = selector("llm_sidecar_build_info", labels=TARGET_LABELS)
    return f"({expr}) and on (namespace, pod) count by (namespace, pod) ({pods})"


FILTER_LABELS: tuple[str, ...] = (*TARGET_LABELS, "model", "route")
"""Each is a dashboard variable of the same name, used as ``label=~"$label"``."""

Matcher = tuple[str, str, str]
"""(label, operator, value), e.g. ``("outcome", "=", "error")``."""


def _matchers(labels: Iterable[str], extra: Sequence[Matcher]) -> list[str]:
    out = [f'{label}=~"${label}"' for label in labels]
    out += [f"{k}{op}{promql_string(v)}" for k, op, v in extra]
    return out


def selector(
    metric: str, extra: Sequence[Matcher] = (), labels: Iterable[str] = FILTER_LABELS
) -> str:
    """``metric{namespace=~"$namespace", ..., extra}``."""
    return f"{metric}{{{', '.join(_matchers(labels, extra))}}}"


def rate(metric: str, extra: Sequence[Matcher] = (), labels: Iterable[str] = FILTER_LABELS) -> str:
    return f"rate({selector(metric, extra, labels)}[{RATE_INTERVAL}])"


def raw_sum_rate(
    metric: str,
    by: Sequence[str] = (),
    extra: Sequence[Matcher] = (),
    labels: Iterable[str] = FILTER_LABELS,
) -> str:
    """``sum by (by) (rate(metric{filters}[$__rate_interval]))`` over the raw series: for a
    drill-down to pods only (bound it with :func:`top_pods`)."""
    grouping = f" by ({', '.join(by)})" if by else ""
    return f"sum{grouping} ({rate(metric, extra, labels)})"


POD_LINES = 10
"""A per-pod panel draws this many pods at most (the top ones at each step), never one line
per pod of a fleet."""


def top_pods(expr: str) -> str:
    """``expr`` (one series per pod) bounded to the :data:`POD_LINES` highest at each step."""
    return f"topk({POD_LINES}, {expr})"


def _raw_sum(
    series: str, by: Sequence[str], extra: Sequence[Matcher], labels: Iterable[str], how: str
) -> str:
    """The raw series, summed (``how="rate"``: their rates over the rate window; ``sum`` or
    ``max``: a gauge) by ``by``, with the filter variables the series has (the target
    labels and its own)."""
    own = aggregates.own_labels(series) | set(TARGET_LABELS)
    missing = [label for label in (*by, *(k for k, _, _ in extra)) if label not in own]
    if missing:
        raise ValueError(f"{series} has no {missing}")
    filters = [label for label in labels if label in own]
    if how == "rate":
        return raw_sum_rate(series, by, extra, filters)
    grouping = f" by ({', '.join(by)})" if by else ""
    return f"{how}{grouping} ({selector(series, extra, filters)})"


def _recorded_sum(
    series: str,
    by: Sequence[str],
    extra: Sequence[Matcher],
    labels: Iterable[str],
    how: str = "rate",
) -> str:
    """``series`` summed by ``by`` (``how``: ``rate``, or a gauge's ``sum`` or ``max``): its
    record, or the raw series per pod and for a detail view."""
    if "pod" in by or aggregates.read_when_drawn(series):
        return _raw_sum(series, by, extra, labels, how)
    record = aggregates.find(series)
    kept = set(record.kept)
    missing = [label for label in (*by, *(k for k, _, _ in extra)) if label not in kept]
    if missing:
        raise ValueError(
            f"{record.record} does not keep {missing}: add them to sidecar/tools/slo/aggregates.py"
        )
    grouping = f" by ({', '.join(by)})" if by else ""
    filters = [label for label in labels if label in kept]
    op = "max" if how == "max" else "sum"
    return f"{op}{grouping} ({selector(record.record, extra, filters)})"


def sum_rate(
    metric: str,
    by: Sequence[str] = (),
    extra: Sequence[Matcher] = (),
    labels: Iterable[str] = FILTER_LABELS,
) -> str:
    """Per second, summed by ``by`` (``sum (...)`` without): the recorded 5m rate of
    ``metric`` (a counter or a histogram's part); the raw rate per pod when ``by`` has
    ``pod``, or for a detail view."""
    return _recorded_sum(metric, by, extra, labels)


def sum_gauge(metric: str, by: Sequence[str] = (), labels: Iterable[str] = FILTER_LABELS) -> str:
    """A gauge summed by ``by``: its recorded sum, or the raw gauge per pod and for a gauge
    read when drawn (:data:`~sidecar.tools.slo.aggregates.READ_WHEN_DRAWN`)."""
    return _recorded_sum(metric, by, (), labels, how="sum")


def max_gauge(metric: str, by: Sequence[str] = (), labels: Iterable[str] = FILTER_LABELS) -> str:
    """A gauge's largest value by ``by``: its recorded maximum, or the raw gauge per pod and
    for a gauge read when drawn."""
    return _recorded_sum(metric, by, (), labels, how="max")


def quantile(
    q: float,
    histogram: str,
    by: Sequence[str] = (),
    extra: Sequence[Matcher] = (),
    labels: Iterable[str] = FILTER_LABELS,
) -> str:
    """The q-quantile of a histogram from its recorded bucket rates; per pod, or for a detail
    view, from its raw buckets over the rate window (no rule records every pod's buckets: a
    rule would write and read them every evaluation, the panel reads them when it is drawn).
    Bound a per-pod quantile with :func:`top_pods`."""
    buckets = (*by, "le")
    return f"histogram_quantile({q:g}, {sum_rate(histogram + '_bucket', buckets, extra, labels)})"


def mean(
    histogram: str,
    by: Sequence[str] = (),
    extra: Sequence[Matcher] = (),
    labels: Iterable[str] = FILTER_LABELS,
) -> str:
    """Average observation: recorded rate of the sum / recorded rate of the count."""
    return f"{sum_rate(histogram + '_sum', by, extra, labels)} / {sum_rate(histogram + '_count', by, extra, labels)}"


def ratio_or_zero(numerator: str, denominator: str) -> str:
    """numerator / denominator, 0 (not "no data") where the numerator has no series yet.

    A counter such as ``llm_requests_total{outcome="error"}`` only exists after the first
    error; ``or 0 * denominator`` keeps a ratio of 0 for every group that has traffic, the
    same device the SLO rules use. Both sides must be summed by the same labels.
    """
    return f"({numerator} or 0 * {denominator}) / {denominator}"


def zero_if_absent(expr: str, label: str | None = None) -> str:
    """``expr``, or a single 0 when it has no series at all (a counter that never moved),
    labelled ``label="(none)"`` when given, so a legend of ``{{label}}`` still reads."""
    zero = (
        "vector(0)" if label is None else f'label_replace(vector(0), "{label}", "(none)", "", "")'
    )
    return f"{expr} or on () {zero}"


def recorded(
    record: str,
    extra: Sequence[Matcher] = (),
    grouping: Iterable[str] = ("cluster", "namespace", "model"),
) -> str:
    """A recorded SLO series, filtered by the variables among the rules' grouping labels (the
    rules sum over everything else, e.g. pods and routes)."""
    # The Helm chart's rules also carry ``llm_release`` (its release); plain rules match All.
    labels = [label for label in grouping if label in FILTER_LABELS]
    if "llm_release" not in labels:
        labels.append("llm_release")
    return selector(record, extra, labels=labels)
