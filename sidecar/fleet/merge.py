"""The pod's one page from its workers' registries: sans-I/O (families in, families out).

Each worker keeps its own prometheus_client registry, whole (exemplars, custom collectors,
process metrics), and hands the supervisor what its ``collect()`` yields
(:mod:`sidecar.fleet.worker`). :class:`PodPage` sums them into one page:

* counters and histograms (buckets, ``_count``, ``_sum``) are summed over the workers, and
  the newest exemplar of a series is kept;
* gauges by their meaning (:data:`GAUGE_MERGE`): summed (requests in flight, memory, open
  files), the largest (a limit, an info gauge's 1), the smallest (the start time);
* a worker that exits or is killed leaves its last counts in the pod's totals
  (:meth:`PodPage.retire`): what it counted is never taken back, and its replacement's counts
  add to them, so no merged counter or bucket ever decreases (not even by a float sum's last
  place: :meth:`PodPage._hold_up`), and ``rate()`` never reads a false reset. A gauge of a
  gone worker goes with it (nothing of it is in flight any more). What the worker's
  requests in flight at its end were is given as ``lost``: each is counted once, as an
  error of the sidecar's own (:data:`LOST_REQUEST`).

``_created`` samples are left out, as the single process's page leaves them out
(sidecar/export/prometheus_internals.py, ``WithoutCreated``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from prometheus_client import Metric
from prometheus_client.samples import Exemplar, Sample

from ..base.outcomes import Verdict
from ..export.families import FAMILIES, NAMESPACE

__all__ = ["GAUGE_MERGE", "LOST_REQUEST", "PodPage", "lost_request_labels"]

GaugeMerge = Literal["sum", "max", "min"]

GAUGE_MERGE: Mapping[str, GaugeMerge] = {
    "process_start_time_seconds": "min",  # the pod's oldest process: when it started
    "process_max_fds": "max",  # a limit, the same in each process
    "llm_sidecar_build_info": "max",  # an info gauge: 1 for each build running
}
"""How a gauge family is merged over the workers where summing would be wrong; every other
gauge (``llm_requests_in_flight``, resident memory, open files) is summed."""

LOST_REQUEST = Verdict.INTERNAL
"""The verdict on a request in flight in a worker that died: the sidecar's own failure, code
500 (the status the client may have had was the dead worker's to know)."""

_REQUESTS = next(f for f in FAMILIES if f.attr == "requests")
_REQUESTS_NAME = f"{NAMESPACE}_{_REQUESTS.name}"

_SUMMED_TYPES = frozenset(("counter", "histogram", "summary"))
"""Families whose samples only grow: summed, and kept from a gone worker."""

_Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(sample: Sample) -> _Key:
    return sample.name, tuple(sorted(sample.labels.items()))


def _newer(a: Exemplar | None, b: Exemplar | None) -> Exemplar | None:
    if a is None:
        return b
    if b is None:
        return a
    return b if _at(b) >= _at(a) else a


def _at(exemplar: Exemplar) -> float:
    return 0.0 if exemplar.timestamp is None else float(exemplar.timestamp)


class _Series:
    """One series being merged: its labels, its value so far, its newest exemplar."""

    __slots__ = ("labels", "value", "exemplar")

    def __init__(self, labels: dict[str, str], value: float, exemplar: Exemplar | None) -> None:
        self.labels = labels
        self.value = value
        self.exemplar = exemplar

    def copy(self) -> _Series:
        return _Series(self.labels, self.value, self.exemplar)


class _Family:
    """One family being merged: its head and its series, in the order first seen."""

    __slots__ = ("name", "documentation", "typ", "unit", "series")

    def __init__(self, name: str, documentation: str, typ: str, unit: str) -> None:
        self.name = name
        self.documentation = documentation
        self.typ = typ
        self.unit = unit
        self.series: dict[_Key, _Series] = {}

    @classmethod
    def like(cls, metric: Metric | _Family) -> _Family:
        typ = metric.typ if isinstance(metric, _Family) else metric.type
        return cls(metric.name, metric.documentation, typ, metric.unit)

    def add(self, sample: Sample, merge: GaugeMerge) -> None:
        if sample.name.endswith("_created"):
            return
        key = _key(sample)
        got = self.series.get(key)
        if got is None:
            self.series[key] = _Series(dict(sample.labels), sample.value, sample.exemplar)
            return
        if merge == "sum":
            got.value += sample.value
        elif merge == "max":
            got.value = max(got.value, sample.value)
        else:
            got.value = min(got.value, sample.value)
        got.exemplar = _newer(got.exemplar, sample.exemplar)

    def copy(self) -> _Family:
        out = _Family.like(self)
        out.series = {key: series.copy() for key, series in self.series.items()}
        return out

    def metric(self) -> Metric:
        metric = Metric(self.name, self.documentation, self.typ, self.unit)
        for (name, _labels), series in self.series.items():
            metric.samples.append(Sample(name, series.labels, series.value, None, series.exemplar))
        return metric


def _merge_of(family: _Family) -> GaugeMerge:
    if family.typ in _SUMMED_TYPES:
        return "sum"
    return GAUGE_MERGE.get(family.name, "sum")


def lost_request_labels(
    model: str, route: str, tenant: str | None, *, tenants: bool
) -> dict[str, str]:
    """The ``llm_requests_total`` labels of a request lost with its worker."""
    labels = {
        "model": model,
        "route": route,
        "code": LOST_REQUEST.code(None),
        "outcome": LOST_REQUEST.outcome.value,
        "error_type": LOST_REQUEST.error_type,
    }
    if tenants:
        labels["tenant"] = tenant or ""
    return labels


class PodPage:
    """The pod's totals (the module doc): :meth:`retire` a gone worker's last families into
    them, :meth:`merged` them with the live workers' families."""

    def __init__(self) -> None:
        self._retired: dict[str, _Family] = {}
        self._published: dict[tuple[str, _Key], float] = {}

    def retire(
        self, families: Iterable[Metric], lost: Iterable[tuple[Mapping[str, str], float]] = ()
    ) -> None:
        """A worker is gone: its last counters and histograms stay in the pod's totals, and
        each of its ``lost`` requests in flight (their ``llm_requests_total`` labels, how many)
        is counted once."""
        for metric in families:
            if metric.type not in _SUMMED_TYPES:
                continue
            family = self._retired.get(metric.name)
            if family is None:
                family = self._retired[metric.name] = _Family.like(metric)
            for sample in metric.samples:
                family.add(sample, "sum")
        for labels, count in lost:
            if count <= 0:
                continue
            family = self._retired.get(_REQUESTS_NAME)
            if family is None:
                family = self._retired[_REQUESTS_NAME] = _Family(
                    _REQUESTS_NAME, _REQUESTS.help, "counter", ""
                )
            sample = Sample(f"{_REQUESTS_NAME}_total", dict(labels), float(count), None, None)
            family.add(sample, "sum")

    def merged(self, live: Sequence[Iterable[Metric]]) -> list[Metric]:
        """The pod's page: the retired totals and every live worker's families, merged; the
        families in the order the first worker gives them (a family only the retired totals
        hold comes after)."""
        out: dict[str, _Family] = {}
        for families in live:
            for metric in families:
                family = out.get(metric.name)
                if family is None:
                    retired = self._retired.get(metric.name)
                    family = out[metric.name] = (
                        retired.copy() if retired is not None else _Family.like(metric)
                    )
                merge = _merge_of(family)
                for sample in metric.samples:
                    family.add(sample, merge)
        for name, retired in self._retired.items():
            if name not in out:
                out[name] = retired.copy()
        self._hold_up(out.values())
        return [family.metric() for family in out.values()]

    def _hold_up(self, families: Iterable[_Family]) -> None:
        """Never below what was published: a float sum taken in another order (a worker's
        counts moved into the retired totals) may come out one unit in the last place lower,
        and a counter one ulp lower is a counter reset to Prometheus (``rate()`` would read the
        whole total as new). A series no family holds any more is forgotten, as the single
        process forgets it."""
        published: dict[tuple[str, _Key], float] = {}
        for family in families:
            if family.typ not in _SUMMED_TYPES:
                continue
            for key, series in family.series.items():
                before = self._published.get((family.name, key))
                if before is not None and series.value < before:
                    series.value = before
                published[family.name, key] = series.value
        self._published = published
