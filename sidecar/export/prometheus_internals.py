"""The one module that reads prometheus_client's private state.

prometheus_client has no public API for what the sidecar needs on its hot path and for its
series budget: observing many values into a histogram at once (a request's ITL has one value
per token), listing a metric's children, removing every child with one label value, counting
the samples a registry exposes and refusing a child that would take the page past its budget
(:class:`SeriesGate`), a page without ``_created`` samples (:class:`WithoutCreated`). Each
private name used is read here and nowhere else; ``tests/unit/export/test_prometheus_internals.py``
pins them on the installed version, and pyproject caps the dependency at the next minor
version not yet checked (``CHECKED_PROMETHEUS_CLIENT``).
"""

from __future__ import annotations

import copy
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import reduce
from math import isfinite, isinf
from operator import add, itemgetter
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric, Summary
from prometheus_client.metrics import Enum, MetricWrapperBase
from prometheus_client.registry import Collector
from prometheus_client.values import MutexValue

__all__ = [
    "CHECKED_PROMETHEUS_CLIENT",
    "observe_many",
    "observe_one",
    "observe_repeated",
    "Count",
    "Observed",
    "count_of",
    "samples_per_child",
    "label_children",
    "label_names",
    "is_labelled_parent",
    "drop_label_value",
    "has_child",
    "Children",
    "Slot",
    "Row",
    "SMALL_BATCH",
    "SeriesGate",
    "WithoutCreated",
    "page_samples",
]

CHECKED_PROMETHEUS_CLIENT = "0.26.0"
"""The version these private reads were last checked on (pyproject: ``<0.27``)."""


def label_names(metric: MetricWrapperBase) -> tuple[str, ...]:
    """The label names ``metric`` was declared with."""
    names: tuple[str, ...] = metric._labelnames
    return names


def is_labelled_parent(metric: MetricWrapperBase) -> bool:
    """``metric`` has labels and is the parent (not a child ``.labels(...)`` returned)."""
    return bool(metric._labelnames) and not metric._labelvalues


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for every ``v`` in ``values``, with the same result, with
    one lock per touched bucket and one for the sum, instead of two locks and a bucket search
    per value. A request's ITL has one value per token.

    ``histogram`` is a labelled child (or an unlabelled histogram). Exactly equal, sample
    for sample, to observing one by one:

    - the sum is accumulated in the same order, one value at a time, starting from the
      current sum (so even float rounding is the same);
    - each value counts in the first bucket whose upper bound it does not exceed, as
      ``observe`` does; in a sorted copy the values up to a bound are ``bisect_right`` of
      it. NaN, which exceeds no bound and so is counted in no bucket (yet is added to the
      sum), is the one value sorting mishandles: it is taken out first when present, which
      a NaN sum gives away cheaply;
    - a bucket count is a float, and adding n once equals adding 1 n times below 2**53.

    No exemplars (the ITL histogram records none). This reads prometheus_client's histogram
    internals (``_sum``, ``_buckets``, ``_upper_bounds``, the value's ``_lock``); where the
    values are not plain in-process ones (multiprocess mode) it observes one by one.
    """
    histogram._raise_if_not_observable()  # type: ignore[no-untyped-call]  # private, unannotated; a labelled parent refuses, as observe() does
    total = histogram._sum
    if type(total) is not MutexValue:
        for value in values:
            histogram.observe(value)
        return
    with total._lock:
        total._value = reduce(add, values, total._value)
        has_nan = total._value != total._value  # NaN in, NaN out (also an earlier NaN)
    ordered = sorted([v for v in values if v == v] if has_nan else values)
    done, end = 0, len(ordered)
    for bound, bucket in zip(histogram._upper_bounds, histogram._buckets, strict=True):
        upto = bisect_right(ordered, bound, done)
        if upto > done:
            bucket.inc(upto - done)
            if upto == end:
                break
            done = upto


def observe_one(histogram: Histogram, value: float, exemplar: dict[str, str] | None = None) -> None:
    """``histogram.observe(value, exemplar)``, with the same result, where there is no
    exemplar without the library's steps: the bucket found by bisection, not a Python loop
    over the bounds, and no check that ``histogram`` is a child (the callers pass children
    they just took with ``labels()``).

    The bucket is the first whose upper bound ``value`` does not exceed, as ``observe``
    finds it: ``bisect_left`` of the sorted bounds (the last is ``+Inf``). NaN, which
    exceeds no bound and is counted in no bucket, and values that are not plain in-process
    ones (multiprocess mode) go through ``observe`` itself, as does any exemplar.
    """
    total = histogram._sum
    if exemplar or value != value or type(total) is not MutexValue:
        histogram.observe(value, exemplar)
        return
    total.inc(value)  # type: ignore[no-untyped-call]  # MutexValue.inc is unannotated
    histogram._buckets[bisect_left(histogram._upper_bounds, value)].inc(1)


def observe_repeated(histogram: Histogram, value: float, times: int) -> None:
    """``histogram.observe(value)`` ``times`` times, in O(1): the value's bucket gains
    ``times`` and the sum ``value * times``. k tokens that arrived in one event are k gaps
    of one value (sidecar/measure/timeline.py), and an upstream may claim millions of them
    in one event: the bucket counts are those of observing one by one, the sum is the
    product (equal to the repeated addition up to float rounding). NaN, a product that
    overflows where the value does not (a value near the largest float, never a gap: the
    repeated additions may stay finite, or leave an infinite sum as it is) and values that
    are not plain in-process ones (multiprocess mode) take the one-by-one way, as in
    :func:`observe_many`, whose checks it shares."""
    if times <= 0:
        return
    histogram._raise_if_not_observable()  # type: ignore[no-untyped-call]  # private, unannotated
    total = histogram._sum
    step = value * times
    if value != value or type(total) is not MutexValue or (isinf(step) and isfinite(value)):
        for _ in range(times):
            histogram.observe(value)
        return
    total.inc(step)  # type: ignore[no-untyped-call]  # MutexValue.inc is unannotated
    histogram._buckets[bisect_left(histogram._upper_bounds, value)].inc(times)


def samples_per_child(metric: MetricWrapperBase) -> int:
    """Samples one child of ``metric`` puts on the page (served through
    :class:`WithoutCreated`, so never a ``_created``): a histogram's buckets, ``+Inf``,
    ``_sum`` and ``_count``; a summary's ``_sum`` and ``_count``; an enum's states; a
    counter's total, a gauge's or an info's value."""
    if isinstance(metric, Histogram):
        return len(metric._upper_bounds) + 2
    if isinstance(metric, Summary):
        return 2
    if isinstance(metric, Enum):
        return len(metric._states)
    return 1


def has_child(metric: MetricWrapperBase, values: tuple[str, ...]) -> bool:
    """Whether ``metric`` has the child ``values`` now (without making it)."""
    return values in metric._metrics


def label_children(metric: MetricWrapperBase) -> list[tuple[str, ...]]:
    """The label-value tuples of ``metric``'s children. prometheus_client lists them only in
    the private ``_metrics`` dict (read under the metric's ``_lock``, as ``remove`` itself
    does)."""
    with metric._lock:
        return list(metric._metrics)  # type: ignore[arg-type]  # typed Sequence[str]: tuples


def drop_label_value(metric: MetricWrapperBase, label: str, value: str) -> int:
    """Remove ``metric``'s children whose ``label`` is ``value`` (client_python's
    ``remove_by_labels``); how many there were."""
    index = label_names(metric).index(label)
    with metric._lock:
        doomed = sum(1 for key in metric._metrics if key[index] == value)
    if doomed:
        metric.remove_by_labels({label: value})
    return doomed


class Count:
    """A counter's or gauge's child as the request path moves it: ``add(amount)`` is
    ``inc(amount)`` with the same result, one attribute update.

    The request families have one writer, the event loop's thread (every recorder, the
    lifecycle hooks and the label admissions run on it); the page is rendered on another
    thread (sidecar/export/scrape.py), which only reads, each value under its lock as
    before. With one writer the lock adds nothing but its cost: a float attribute is read
    and written whole, so the page sees the value before or after an update, as with the
    lock. A value that is not a plain in-process one (multiprocess mode) takes its own
    ``inc``. A counter is never given a negative amount here (the callers count tokens,
    requests and errors)."""

    __slots__ = ("_value",)

    def __init__(self, child: Counter | Gauge) -> None:
        self._value = child._value

    def add(self, amount: float) -> None:
        self._value._value += amount


class _LockedCount(Count):
    """:class:`Count` for a value that is not a plain in-process one: its own ``inc``."""

    __slots__ = ()

    def add(self, amount: float) -> None:
        self._value.inc(amount)


def count_of(child: Counter | Gauge) -> Count:
    """The :class:`Count` that moves ``child``."""
    return Count(child) if type(child._value) is MutexValue else _LockedCount(child)


class Observed:
    """A histogram's child as the request path observes it, with the same result as its
    ``observe``: the value's bucket found by bisection and the bucket and the sum updated,
    one writer as for :class:`Count`. An exemplar, NaN and a value that is not a plain
    in-process one go through ``observe`` itself; many values at once through
    :func:`observe_many` and :func:`observe_repeated`."""

    __slots__ = ("child", "_sum", "_buckets", "_bounds", "_plain")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self._sum = child._sum
        self._buckets = child._buckets
        self._bounds = child._upper_bounds
        self._plain = type(child._sum) is MutexValue

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar or value != value or not self._plain:
            self.child.observe(value, exemplar)
            return
        self._sum._value += value
        self._buckets[bisect_left(self._bounds, value)]._value += 1

    def observe_many(self, values: Sequence[float]) -> None:
        """:func:`observe_many`; a short batch one value at a time, as :meth:`observe`."""
        if self._plain and len(values) <= SMALL_BATCH:
            total, buckets, bounds = self._sum, self._buckets, self._bounds
            for value in values:
                if value == value:
                    total._value += value
                    buckets[bisect_left(bounds, value)]._value += 1
                else:  # NaN: summed, in no bucket (observe's own way)
                    self.child.observe(value)
        else:
            observe_many(self.child, values)

    def observe_repeated(self, value: float, times: int) -> None:
        observe_repeated(self.child, value, times)


SMALL_BATCH = 8
"""Up to this many values are observed one by one (one bisection each) rather than by
:func:`observe_many` (a sort, a sum and a bisection per touched bucket): the same result
either way, and fewer steps for a short stream's gaps."""

L = TypeVar("L", bound=Mapping[str, object])
C = TypeVar("C", Count, Observed)


class Children(Generic[L, C]):
    """A labelled family's children, each resolved once per label set and kept, as the
    :class:`Count` or :class:`Observed` that moves it (``cell``).

    ``get(labels)`` takes the label values by name (a TypedDict per family, which the type
    checker holds each call to) and returns the child's cell (:meth:`remember` keeps it under
    the caller's own key as well, for a one-step lookup): a dict lookup where
    prometheus_client's ``labels()`` converts, checks and locks on every call (and the
    series gate, where one guards the family, counts). ``names`` orders the values as the
    family declares its labels.

    Only a child that is the family's own for those values is kept: one the series gate
    refused (folded into ``other``, or on no page) is asked for again next time, so it gets
    its own series once there is room. :meth:`forget` drops the kept children a removal
    made stale (:meth:`SidecarMetrics.forget` removes an idle label value's series)."""

    __slots__ = ("family", "names", "_key", "_cell", "kept", "memo")

    def __init__(self, family: MetricWrapperBase, cell: Callable[[Any], C]) -> None:
        self.family = family
        self.names = label_names(family)
        self._cell: Callable[[Any], C] = cell
        # One C call turns the named values into the tuple prometheus_client keys by.
        if len(self.names) == 1:
            name = self.names[0]
            self._key: Callable[[L], tuple[Any, ...]] = lambda labels: (labels[name],)
        else:
            self._key = itemgetter(*self.names)
        self.kept: dict[tuple[str, ...], C] = {}
        self.memo: dict[tuple[Any, ...], C] = {}

    def get(self, labels: L) -> C:
        """The cell of the child for ``labels``."""
        key = self._key(labels)
        cell = self.kept.get(key)
        if cell is None:
            cell = self.at(key)
        return cell

    def remember(self, key: tuple[Any, ...], labels: L) -> C:
        """The cell for ``labels``, kept in :attr:`memo` under ``key`` too: the same values
        in the order ``labels`` gives them, which a hot caller builds to look the cell up in
        one step (``memo.get(key) or remember(key, labels)``). Held to it here, so a key that
        left a value out (and would stand for two label sets) fails at its first use."""
        if key != tuple(labels.values()):
            raise ValueError(f"{key} is not the values of {labels}")
        cell = self.get(labels)
        if self._key(labels) in self.kept:
            self.memo[key] = cell
        return cell

    def slot(self, labels: L, *, exemplar: bool = False, many: bool = False) -> Slot:
        """The child for ``labels`` as one slot of a :class:`Row`, not resolved yet: it is
        made at the row's first update of it (a request with no such figure makes no
        series). ``exemplar``: its observations carry the row's exemplar; ``many``: its
        update is a sequence of values, each observed."""
        return Slot(self, labels, exemplar, many)

    def resolve(self, labels: L) -> tuple[C, bool]:
        """The cell for ``labels``, and whether it is kept (its own series: see the class doc)."""
        key = self._key(labels)
        cell = self.kept.get(key)
        if cell is not None:
            return cell, True
        cell = self.at(key)
        return cell, key in self.kept

    def at(self, key: tuple[str, ...]) -> C:
        """The cell of the child for label values ``key``, in the family's order."""
        kept: C | None = self.kept.get(key)
        if kept is not None:
            return kept
        family = self.family
        child = family.labels(*key)  # the family's own type (or the gate's stand-in)
        cell = self._cell(child)
        if family._metrics.get(key) is child:  # its own series (the gate may fold it)
            self.kept[key] = cell
        return cell

    def forget(self, label: str | None = None, value: str | None = None) -> None:
        """Drop the kept children whose ``label`` is ``value`` (all, without a label), and
        every remembered one."""
        self.memo.clear()
        if label is None:
            self.kept.clear()
            return
        if label not in self.names:
            return
        index = self.names.index(label)
        for key in [k for k in self.kept if k[index] == value]:
            del self.kept[key]


class Slot:
    """One family's child for one label set, named when a :class:`Row` is made (its
    :class:`Children` and label values) or given ready (``cell``, a child made ahead)."""

    __slots__ = ("children", "labels", "exemplar", "many", "cell")

    def __init__(
        self,
        children: Children[Any, Any] | None,
        labels: Mapping[str, object] | None,
        exemplar: bool = False,
        many: bool = False,
        cell: Count | Observed | None = None,
    ) -> None:
        self.children = children
        self.labels = labels
        self.exemplar = exemplar
        self.many = many
        self.cell = cell

    @classmethod
    def ready(cls, cell: Count | Observed) -> Slot:
        """A slot for a child made ahead (a family whose few children exist from the start)."""
        return cls(None, None, cell=cell)


class Row:
    """The cells one request's figures move, for one combination of its label values: each
    slot's child resolved once (at its first update) and kept, so recording a request is
    one lookup of its row and one :meth:`write`, with no call per family.

    ``write(amounts, exemplar)`` updates slot ``i`` by ``amounts[i]`` (None: the request has
    no such figure, and the slot is left as it is): a counter's or gauge's cell gains the
    amount (as :meth:`Count.add`), a histogram's cell observes it (as
    :meth:`Observed.observe`, the row's ``exemplar`` on the slots that take one), a
    ``many`` slot observes each value of its sequence (as :meth:`Observed.observe_many`).
    The same result as those methods, whose steps it repeats inline (the test holds the two
    to the library's ``inc`` and ``observe``). One writer, as for :class:`Count`: the event
    loop's thread makes and writes every row; the page's renderer only reads the values.

    A slot whose child is not the family's own (the series gate folded it) is resolved
    again at its next update, as :meth:`Children.get` does; a row is dropped whole when a
    removal made any of its children stale (the caller's :meth:`Children.forget`)."""

    __slots__ = ("slots", "cells")

    def __init__(self, slots: Sequence[Slot]) -> None:
        self.slots = tuple(slots)
        self.cells: list[Count | Observed | None] = [slot.cell for slot in self.slots]

    def cell(self, i: int) -> Any:
        """Slot ``i``'s cell, resolved (and kept, when it is its family's own) now if not yet."""
        cell = self.cells[i]
        if cell is None:
            slot = self.slots[i]
            assert slot.children is not None and slot.labels is not None, "a slot names a child"
            cell, kept = slot.children.resolve(slot.labels)
            if kept:
                self.cells[i] = cell
        return cell

    def write(self, amounts: Sequence[Any], exemplar: dict[str, str] | None = None) -> None:
        cells: list[Any] = self.cells  # a Count, an Observed, a _LockedCount or None
        cell: Any
        i = -1
        for amount in amounts:
            i += 1
            if amount is None:
                continue
            cell = cells[i]
            if cell is None:
                cell = self.cell(i)
            kind = type(cell)
            if kind is Count:
                cell._value._value += amount  # Count.add
            elif kind is Observed:
                slot = self.slots[i]
                if slot.many:
                    cell.observe_many(amount)
                elif amount == amount and cell._plain and not (exemplar and slot.exemplar):
                    cell._sum._value += amount  # Observed.observe without an exemplar
                    cell._buckets[bisect_left(cell._bounds, amount)]._value += 1
                else:
                    cell.child.observe(amount, exemplar if slot.exemplar else None)
            else:  # a value that is not a plain in-process one: its own inc
                cell.add(amount)


_HAS_CREATED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


def _without_created(family: Metric) -> Metric:
    """``family`` minus its ``_created`` samples (a copy when it had any)."""
    if family.type not in _HAS_CREATED:
        return family
    created = family.name + "_created"
    samples = [s for s in family.samples if s.name != created]
    if len(samples) == len(family.samples):
        return family
    kept = copy.copy(family)
    kept.samples = samples
    return kept


def page_samples(families: Iterable[Metric]) -> int:
    """Samples ``families`` (a collector's ``collect()``) put on a page without ``_created``."""
    return sum(len(_without_created(f).samples) for f in families)


class WithoutCreated:
    """A registry as /metrics serves it: every family without its ``_created`` samples.

    prometheus_client exposes, for every counter, histogram and summary child, a
    ``_created`` sample (the child's creation time): a share of the sidecar's page
    (docs/performance.md, "Figures behind the code") which no query, rule or dashboard
    reads (``rate()`` copes with resets by itself). The library's switch,
    ``disable_created_metrics()``, is a module global: flipping it changes the page of every
    registry in the process, and every test that builds a sidecar would change it
    for the tests after it (the mutable module global the team's style guide asks us to
    avoid). This view drops them from one registry's page instead, whoever embeds the
    sidecar; the registry itself is unchanged (``get_sample_value`` still answers for them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            yield _without_created(family)

    def restricted_registry(self, names: Iterable[str]) -> WithoutCreated:
        # A restricted view is not a CollectorRegistry, but collect() is all it is asked.
        return WithoutCreated(self._registry.restricted_registry(list(names)))  # type: ignore[arg-type]


class SeriesGate:
    """The page's one series budget, enforced where a series is made: no child of any
    labelled family in the registry is created when its samples would take the page past
    ``max_series``.

    Counting at label admission alone could not bound the page: a value admitted with a
    little room left then made a few hundred samples across the families, the names the
    server listed were never counted at all, and a family that pre-creates series (the
    capacity bands) spent the budget before any request. Here every family registered when
    :meth:`guard` runs, whoever added it, has its ``labels()`` checked (the instance's own
    attribute shadows the class method; prometheus_client calls ``labels`` only from user
    code), and the page is counted from the registry: labelled families by children times
    :func:`samples_per_child`, unlabelled ones by the same, any other collector (the process
    collector) once by its samples.

    A child whose ``fold`` labels (``model``, ``tenant``) name a real value may fill the page
    up to ``max_series - reserve``; past that it is recorded under ``other`` for those labels
    instead (fate ``other``): the last ``reserve`` samples are kept for those rows, and for
    families without such labels. When even that does not fit, the update goes to a child
    that is on no page (fate ``dropped``). ``on_refused(fate)`` is told each time.

    The check costs one dict lookup per ``labels()`` call for an existing child (cheaper
    than prometheus_client's own ``labels``, which converts and locks); only making a child
    counts the page (a sum of ``len`` over the families).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        max_series: int,
        *,
        fold: Iterable[str] = ("model", "tenant"),
        fold_to: str = "other",
        unvalued: Iterable[str] = ("other", "unknown"),
        reserve: int | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self._registry = registry
        self.max_series = max_series
        self.reserve = max_series // 5 if reserve is None else reserve
        self._fold = frozenset(fold)
        self._fold_to = fold_to
        self._unvalued = frozenset(unvalued)
        self.on_refused = on_refused
        self._fixed: dict[object, int] = {}  # collectors that are not prometheus_client metrics
        self._planned: tuple[int, tuple[int, list[tuple[MetricWrapperBase, int]]]] | None = None
        self._guarded: set[int] = set()

    # -- counting ---------------------------------------------------------------------

    def _collectors(self) -> list[Collector]:
        with self._registry._lock:
            return list(self._registry._collector_to_names)

    def _plan(self) -> tuple[int, list[tuple[MetricWrapperBase, int]]]:
        """(samples of the fixed collectors, [(a labelled family's children, samples per
        child)]), worked out again only when the registry's collectors change: counting is
        then a sum over the families."""
        registry = self._registry
        with registry._lock:
            key = len(registry._collector_to_names)
        if self._planned is not None and self._planned[0] == key:
            return self._planned[1]
        fixed = 0
        labelled: list[tuple[MetricWrapperBase, int]] = []
        for collector in self._collectors():
            if isinstance(collector, MetricWrapperBase):
                per = samples_per_child(collector)
                if is_labelled_parent(collector):
                    labelled.append((collector, per))
                else:
                    fixed += per
            else:
                n = self._fixed.get(collector)
                if n is None:
                    n = self._fixed[collector] = page_samples(collector.collect())
                fixed += n
        self._planned = (key, (fixed, labelled))
        return fixed, labelled

    def count(self) -> int:
        """Samples the registry's page holds now (without ``_created``)."""
        fixed, labelled = self._plan()
        return fixed + sum(per * len(metric._metrics) for metric, per in labelled)

    def fits(self, samples: int, *, valued: bool = True) -> bool:
        """Whether ``samples`` more fit: up to ``max_series - reserve`` for series that carry
        a real model or tenant value, up to ``max_series`` for the rest."""
        ceiling = self.max_series - (self.reserve if valued else 0)
        return self.count() + samples <= ceiling

    def first_cost(self, label: str) -> int:
        """Samples a new value of ``label`` takes at its first request: one child in each
        family that carries the label (a generic estimate; the gate bounds the rest)."""
        return sum(
            samples_per_child(c)
            for c in self._collectors()
            if isinstance(c, MetricWrapperBase) and is_labelled_parent(c) and label in c._labelnames
        )

    # -- guarding ---------------------------------------------------------------------

    def guard(self) -> int:
        """Check every labelled family registered now at child creation; how many."""
        n = 0
        for collector in self._collectors():
            if isinstance(collector, MetricWrapperBase) and is_labelled_parent(collector):
                if id(collector) not in self._guarded:
                    collector.labels = self._gated(collector)  # type: ignore[method-assign]  # the gate: see the class doc
                    self._guarded.add(id(collector))
                n += 1
        return n

    def _gated(self, metric: MetricWrapperBase) -> Callable[..., Any]:
        make = type(metric).labels.__get__(metric)  # prometheus_client's own labels()
        names = metric._labelnames
        fold_at = frozenset(i for i, name in enumerate(names) if name in self._fold)
        per = samples_per_child(metric)
        unvalued, fold_to = self._unvalued, self._fold_to
        detached: list[MetricWrapperBase] = []

        def refuse(fate: str) -> None:
            if self.on_refused is not None:
                try:
                    self.on_refused(fate)
                except Exception:  # counting a refusal never breaks the caller
                    pass

        def labels(*values: object, **by_name: object) -> Any:
            if by_name and not values and sorted(by_name) == sorted(names):
                values = tuple(by_name[name] for name in names)
            elif by_name or len(values) != len(names):
                return make(*values, **by_name)  # prometheus_client's own error
            child = metric._metrics.get(values)  # type: ignore[arg-type]  # a miss: str() below
            if child is not None:
                return child
            key = tuple(str(v) for v in values)
            child = metric._metrics.get(key)
            if child is not None:
                return child
            valued = any(key[i] not in unvalued for i in fold_at)
            room = self.max_series - self.count() - per
            if room >= (self.reserve if valued else 0):
                return make(*key)
            if valued:
                folded = tuple(fold_to if i in fold_at else v for i, v in enumerate(key))
                child = metric._metrics.get(folded)
                if child is not None or room >= 0:
                    refuse("other")
                    return child if child is not None else make(*folded)
            refuse("dropped")
            if not detached:  # one child on no page, for every update that found no room
                kwargs = dict(metric._kwargs)
                for k in ("namespace", "subsystem", "unit"):
                    kwargs.pop(k, None)
                detached.append(type(metric)(
                    metric._original_name, documentation=metric._documentation, labelnames=names,
                    namespace=metric._namespace, subsystem=metric._subsystem, unit=metric._unit,
                    _labelvalues=tuple("" for _ in names), **kwargs,
                ))  # fmt: skip
            return detached[0]

        return labels
