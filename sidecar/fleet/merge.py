"""The pod's one page from its workers' registries: sans-I/O (families in, families out).

Each worker keeps its own prometheus_client registry, whole (exemplars, custom collectors,
process metrics), and hands the supervisor what its ``collect()`` yields
(:mod:`sidecar.fleet.worker`). :class:`PodPage` sums them into one page:

* counters and histograms (buckets, ``_count``, ``_sum``) are summed over the workers, and
  the newest exemplar of a series is kept;
* gauges by their meaning (:data:`GAUGE_MERGE`): summed (requests in flight, memory, open
  files), the largest (a limit, an info gauge's 1), the smallest (the start time);
* the pod's bounds on ``model`` and ``tenant`` values hold on the page, whatever each worker
  admitted: a value past them is folded into ``other`` (:mod:`sidecar.fleet.pod_labels`
  says why there and how the figures stay right);
* the page holds ``--max-series`` (``max_series``) for the pod, also across restarts, when a
  replacement makes series its predecessor's carried totals do not have: a series that first
  appears on a full page is left off it (every sample of a histogram's child together) until
  there is room, and a series once on the page stays (:meth:`PodPage._fit`);
* counts a worker stops exporting stay in the pod's totals (the carried totals): a worker
  that exits or is killed (:meth:`PodPage.retire`), a series a live worker removed (a value
  it forgot) or restarted from zero. What was counted is never taken back, and later counts
  of the same series add to it, so no merged counter or bucket ever decreases (not even by a
  float sum's last place: :meth:`PodPage._hold_up`), ``rate()`` never reads a false reset,
  and a replaced worker's series are the same series as its predecessor's, not a new set
  beside them. A gauge of a gone worker goes with it (nothing of it is in flight any more).
  What the worker's requests in flight at its end were is given as ``lost``: each is
  counted once, as an error of the sidecar's own (:data:`LOST_REQUEST`).

``_created`` samples are left out, as the single process's page leaves them out
(sidecar/export/prometheus_internals.py, ``WithoutCreated``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from prometheus_client import Metric
from prometheus_client.samples import Exemplar, Sample

from ..base.labels import OTHER
from ..base.outcomes import Verdict
from ..export.families import FAMILIES, NAMESPACE
from .pod_labels import PodLabels

__all__ = ["GAUGE_MERGE", "LOST_REQUEST", "PodPage", "Source", "lost_request_labels"]

GaugeMerge = Literal["sum", "max", "min"]

GAUGE_MERGE: Mapping[str, GaugeMerge] = {
    "process_start_time_seconds": "min",  # the pod's oldest process: when it started
    "process_max_fds": "max",  # a limit, the same in each process
    "llm_sidecar_build_info": "max",  # an info gauge: 1 for each build running
    "llm_requests_in_phase_oldest_seconds": "max",  # the pod's oldest is its oldest worker's
}
"""How a gauge family is merged over the workers where summing would be wrong; every other
gauge (``llm_requests_in_flight``, resident memory, open files) is summed."""

LOST_REQUEST = Verdict.INTERNAL
"""The verdict on a request in flight in a worker that died: the sidecar's own failure, code
500 (the status the client may have had was the dead worker's to know)."""

_REQUESTS = next(f for f in FAMILIES if f.attr == "requests")
_REQUESTS_NAME = f"{NAMESPACE}_{_REQUESTS.name}"
_REQUESTS_SAMPLE = f"{_REQUESTS_NAME}_total"
_OVERFLOW = next(f for f in FAMILIES if f.attr == "label_overflow")
_OVERFLOW_NAME = f"{NAMESPACE}_{_OVERFLOW.name}"
_FOLDED_REASON = "max_values"
"""The ``llm_label_overflow_total`` reason of a request the page folded: the pod's bound."""

_SUMMED_TYPES = frozenset(("counter", "histogram", "summary"))
"""Families whose samples only grow: summed, and carried when a worker stops exporting them."""

_Key = tuple[str, tuple[tuple[str, str], ...]]
Source = int | str
"""A live worker as the page knows it (its index), or the supervisor's own families."""
_ChildKey = tuple[str, tuple[tuple[str, str], ...]]  # family name, labels but ``le``


def _key(name: str, labels: Mapping[str, str]) -> _Key:
    return name, tuple(sorted(labels.items()))


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

    def __init__(self, labels: Mapping[str, str], value: float, exemplar: Exemplar | None) -> None:
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

    def add(
        self,
        key: _Key,
        labels: Mapping[str, str],
        value: float,
        exemplar: Exemplar | None,
        merge: GaugeMerge,
    ) -> None:
        got = self.series.get(key)
        if got is None:
            self.series[key] = _Series(labels, value, exemplar)
            return
        if merge == "sum":
            got.value += value
        elif merge == "max":
            got.value = max(got.value, value)
        else:
            got.value = min(got.value, value)
        got.exemplar = _newer(got.exemplar, exemplar)

    def copy(self) -> _Family:
        out = _Family.like(self)
        out.series = {key: series.copy() for key, series in self.series.items()}
        return out

    def metric(self) -> Metric:
        metric = Metric(self.name, self.documentation, self.typ, self.unit)
        for (name, _labels), series in self.series.items():
            labels = dict(series.labels)
            metric.samples.append(Sample(name, labels, series.value, None, series.exemplar))
        return metric


class _Read:
    """A source's families as one merge reads them, each sample's key made once: its samples
    by family, and its counters' and histograms' samples by key (what the page compares with
    the next read, to see what the source stopped exporting)."""

    __slots__ = ("entries", "summed")

    def __init__(self, families: Iterable[Metric]) -> None:
        self.entries: list[tuple[Metric, list[tuple[_Key, Sample]]]] = []
        self.summed: dict[_Key, tuple[Metric, Sample]] = {}
        summed = self.summed
        for metric in families:
            counts = metric.type in _SUMMED_TYPES
            keyed: list[tuple[_Key, Sample]] = []
            for sample in metric.samples:
                if sample.name.endswith("_created"):
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                keyed.append((key, sample))
                if counts:
                    summed[key] = (metric, sample)
            self.entries.append((metric, keyed))

    def stopped(self, before: _Read) -> list[tuple[Metric, Sample]]:
        """The samples of ``before`` whose child (a series, or a histogram child's every
        sample) is missing here or went down in any sample: the source removed it, or made it
        again from zero. A child goes whole, so its carried buckets stay consistent."""
        now = self.summed
        hit: set[_ChildKey] = set()
        for key, (metric, sample) in before.summed.items():
            got = now.get(key)
            if got is None or got[1].value < sample.value:
                hit.add(_child_key(metric, key))
        if not hit:
            return []
        return [
            (metric, sample)
            for key, (metric, sample) in before.summed.items()
            if _child_key(metric, key) in hit
        ]


def _child_key(metric: Metric, key: _Key) -> _ChildKey:
    return metric.name, tuple(x for x in key[1] if x[0] != "le")


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
    """The pod's page (the module doc): :meth:`merged` the live workers' families with the
    carried totals, :meth:`retire` a gone worker's last families into them. ``bounds``:
    the pod's bound on each label's values (``model``, ``tenant``), folded past it; a label
    an allowlist bounds has none. Each live worker is a ``source`` (its index, which stays the
    same while the worker lives), so the page can tell what one of them stopped exporting."""

    def __init__(
        self,
        bounds: Mapping[str, int] | None = None,
        *,
        max_series: int | None = None,
        idle_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.labels = PodLabels(bounds or {}, idle_seconds, clock)
        self._clock = clock
        self._carried: dict[str, _Family] = {}
        self._folded_carried: dict[str, float] = {}  # label -> folded requests carried
        self._seen: dict[Source, _Read] = {}
        self._published: dict[tuple[str, _Key], float] = {}
        self.max_series = max_series
        self._shown: dict[str, set[_Key]] = {}
        self.left_off = 0
        """Series the last page left off for want of room (``max_series``)."""

    def retire(
        self,
        source: Source,
        families: Iterable[Metric],
        lost: Iterable[tuple[Mapping[str, str], float]] = (),
    ) -> None:
        """Worker ``source`` is gone: its last counters and histograms stay in the pod's
        totals, and each of its ``lost`` requests in flight (their ``llm_requests_total``
        labels, how many) is counted once."""
        self._seen.pop(source, None)
        now = self._clock()
        self._carry(_Read(families).summed.values(), now)
        head = _Family(_REQUESTS_NAME, _REQUESTS.help, "counter", "")
        self._carry(
            (
                (head, Sample(_REQUESTS_SAMPLE, dict(labels), float(count), None, None))
                for labels, count in lost
                if count > 0
            ),
            now,
        )

    def _carry(self, samples: Iterable[tuple[Metric | _Family, Sample]], now: float) -> None:
        """Counts into the carried totals, under the page's labels."""
        for head, sample in samples:
            family = self._carried.get(head.name)
            if family is None:
                family = self._carried[head.name] = _Family.like(head)
            labels = self.labels.map(sample.labels, now)
            key = _key(sample.name, labels)
            family.add(key, labels, sample.value, sample.exemplar, "sum")
            if sample.name == _REQUESTS_SAMPLE and labels is not sample.labels:
                for name in _folded(sample.labels, labels):
                    self._folded_carried[name] = self._folded_carried.get(name, 0.0) + sample.value

    def merged(self, live: Mapping[Source, Iterable[Metric]]) -> list[Metric]:
        """The pod's page: the carried totals and every live source's families, merged; the
        families in the order the first source gives them (a family only the carried totals
        hold comes after)."""
        now = self._clock()
        sources = {source: _Read(families) for source, families in live.items()}
        for source, read in sources.items():
            before = self._seen.get(source)
            if before is not None:
                self._carry(read.stopped(before), now)
            self._seen[source] = read
        exported = self.labels.begin()
        out: dict[str, _Family] = {}
        folded: dict[str, float] = {}
        for read in sources.values():
            for metric, keyed in read.entries:
                family = out.get(metric.name)
                if family is None:
                    carried = self._carried.get(metric.name)
                    family = out[metric.name] = (
                        carried.copy() if carried is not None else _Family.like(metric)
                    )
                merge = _merge_of(family)
                for key, sample in keyed:
                    labels = self.labels.map(sample.labels, now, exported)
                    if labels is sample.labels:
                        family.add(key, labels, sample.value, sample.exemplar, merge)
                        continue
                    key = _key(sample.name, labels)
                    family.add(key, labels, sample.value, sample.exemplar, merge)
                    if sample.name == _REQUESTS_SAMPLE:
                        for name in _folded(sample.labels, labels):
                            folded[name] = folded.get(name, 0.0) + sample.value
        for name, carried in self._carried.items():
            if name not in out:
                out[name] = carried.copy()
        self._count_folded(out, folded)
        self._note_totals(out.values(), now)
        self._expire(exported, now)
        self._fit(out.values())
        self._hold_up(out.values())
        return [family.metric() for family in out.values()]

    def _expire(self, exported: Mapping[str, set[str]], now: float) -> None:
        """After a merge, the label values no longer on the page are forgotten (their slots
        free for the next), and the carried series of a value idle for ``idle_seconds`` that
        no worker exports go from the next page (sidecar/fleet/pod_labels.py)."""
        if not self.labels.books:
            return
        carried = self.labels.values_in(
            series.labels for family in self._carried.values() for series in family.series.values()
        )
        gone = self.labels.expire(exported, carried, now)
        if not gone:
            return
        for family in self._carried.values():
            family.series = {
                key: series
                for key, series in family.series.items()
                if not any(series.labels.get(name) in values for name, values in gone.items())
            }

    def _count_folded(self, out: dict[str, _Family], live: Mapping[str, float]) -> None:
        """The requests the page folded into ``other``, in ``llm_label_overflow_total``."""
        for name in self.labels.books:
            count = live.get(name, 0.0) + self._folded_carried.get(name, 0.0)
            if count <= 0:
                continue
            family = out.get(_OVERFLOW_NAME)
            if family is None:
                family = out[_OVERFLOW_NAME] = _Family(
                    _OVERFLOW_NAME, _OVERFLOW.help, "counter", ""
                )
            labels = {"label": name, "reason": _FOLDED_REASON}
            family.add(_key(f"{_OVERFLOW_NAME}_total", labels), labels, count, None, "sum")

    def _note_totals(self, families: Iterable[_Family], now: float) -> None:
        books = self.labels.books
        if not books:
            return
        totals: dict[str, dict[str, float]] = {name: {} for name in books}
        for family in families:
            if family.typ not in _SUMMED_TYPES:
                continue
            for series in family.series.values():
                for name, sums in totals.items():
                    value = series.labels.get(name)
                    if value is not None and value in books[name].own:
                        sums[value] = sums.get(value, 0.0) + series.value
        self.labels.note_totals(totals, now)

    def _fit(self, families: Iterable[_Family]) -> None:
        """At most ``max_series`` samples: past it, the children (a series, or a histogram
        child's every sample) the last page did not show are left off, the last in the page's
        order (the live workers' after the carried totals) first.
        A child on the page is never taken off (its counters would vanish and come back as a
        reset), so the page only refuses what it never showed, as each worker's series gate
        refuses a series before it is made; a child left off is shown, whole, once it fits."""
        families = list(families)
        if self.max_series is None:
            return
        count = sum(len(family.series) for family in families)
        self.left_off = 0
        if count > self.max_series:
            new: dict[tuple[_Family, tuple[tuple[str, str], ...]], list[_Key]] = {}
            for family in families:
                for key in family.series:
                    child = (family, tuple(x for x in key[1] if x[0] != "le"))
                    new.setdefault(child, []).append(key)
            for (family, _labels), keys in reversed(list(new.items())):
                if count <= self.max_series:
                    break
                shown = self._shown.get(family.name, set())
                if any(key in shown for key in keys):
                    continue
                for key in keys:
                    del family.series[key]
                count -= len(keys)
                self.left_off += len(keys)
        self._shown = {family.name: set(family.series) for family in families}

    def _hold_up(self, families: Iterable[_Family]) -> None:
        """Never below what was published: a float sum taken in another order (a worker's
        counts moved into the carried totals) may come out one unit in the last place lower,
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


def _folded(raw: Mapping[str, str], mapped: Mapping[str, str]) -> Iterable[str]:
    """The labels whose value the page folded into ``other``."""
    return (name for name, value in mapped.items() if value == OTHER and raw.get(name) != OTHER)
