"""The pod's own bound on a label's values (``model``, ``tenant``): at most ``--max-models`` and
``--max-tenants`` values on the pod's page, whatever each worker admitted and however often
workers were replaced.

Each worker bounds its labels as the single process does (sidecar/base/labels.py), but
admission is first come, first served in each worker, and the kernel hands a worker whichever
connections hash to it: two workers that each admit 10 tenants admit 20 between them, and a
worker's replacement admits 10 more while the totals its predecessor left still name its 10.
So the pod's page bounds the values once more, where every worker's figures meet
(:class:`~sidecar.fleet.merge.PodPage`), and folds a value past the bound into ``other``,
the overflow value the workers use.

Why there, and not by splitting the bound between workers as ``--max-series`` is, or by a
ledger the workers share:

* Split, each worker would get ``max / N`` values; but every client reaches every worker, so
  the workers admit the same values and the pod shows ``max / N`` of them. And a split does
  not hold across a restart: a replacement earns its share again beside the values its
  predecessor's totals still carry.
* A shared ledger would put a claim across processes (a lock, or an atomic slot in shared
  memory) on the request path, where the values are admitted, and it would still have to
  count the values only the page holds: those of the totals a killed worker left.
* On the page the figures stay right, which is the point of the bound. A value's fate is
  decided once, when the pod first sees it (on the page, or among a worker's values at a
  sync): it is the pod's own value while there is room, else ``other``; and that fate holds
  while any count of it is on the page. So ``other`` only ever grows by counts made since
  the page last read them (no jump of a value's whole history into it, which an SLO ratio
  over ``other`` would show as a burst); every family of
  a value folds the same way at once, so a ratio of two families (goodput over requests)
  stays a ratio of the same requests; histograms fold bucket by bucket, so the buckets stay
  cumulative and ``_count`` stays the ``+Inf`` bucket; and counts a worker stops exporting
  (a value it forgot, a worker killed) are carried in the page's totals, so no counter goes
  back. What the page folded is counted in ``llm_label_overflow_total{reason="max_values"}``.

The workers are then steered to the pod's values at each sync (sidecar/fleet/supervisor.py):
they adopt the pod's own values, and give back a value the pod folded (unless a request holds
it), so a value the pod counts as its own is counted under its name by every worker.

A value of the pod that no worker exports any more and whose counts have not moved for
``--label-idle-seconds`` gives its slot back and its carried series go, as the single
process forgets an idle value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from ..base.labels import OTHER, UNKNOWN

__all__ = ["LabelBook", "PodLabels"]

_FREE = frozenset((OTHER, UNKNOWN, ""))
"""Values every label may carry, never counted against a bound and never folded."""


class LabelBook:
    """One label's values on the pod's page: its own values (at most ``max_values``) and those
    folded into ``other``, each decided once and kept while the value is on the page."""

    __slots__ = ("name", "max_values", "own", "folded", "moved", "totals")

    def __init__(self, name: str, max_values: int) -> None:
        self.name = name
        self.max_values = max_values
        self.own: dict[str, None] = {}  # in the order admitted
        self.folded: set[str] = set()
        self.moved: dict[str, float] = {}  # own value -> when its counts last moved
        self.totals: dict[str, float] = {}  # own value -> the sum of its counts then

    def admit(self, value: str, now: float) -> str:
        """The page's value for ``value``: itself while it is (or can become) one of the pod's
        own values, else ``other``."""
        if value in self.own or value in _FREE:
            return value
        if value in self.folded:
            return OTHER
        if len(self.own) < self.max_values:
            self.own[value] = None
            self.moved[value] = now
            return value
        self.folded.add(value)
        return OTHER

    def forget(self, value: str) -> None:
        self.own.pop(value, None)
        self.moved.pop(value, None)
        self.totals.pop(value, None)


class PodLabels:
    """Every bounded label of the pod (the module doc). ``bounds``: label name -> its bound;
    a label without one (an allowlist bounds it) is passed through."""

    def __init__(
        self,
        bounds: Mapping[str, int],
        idle_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.books = {name: LabelBook(name, bound) for name, bound in bounds.items()}
        self.idle_seconds = idle_seconds
        self.clock = clock

    def begin(self) -> dict[str, set[str]]:
        """Where a merge notes which values the workers export (:meth:`map`'s ``exported``)."""
        return {name: set() for name in self.books}

    def map(
        self,
        labels: Mapping[str, str],
        now: float,
        exported: Mapping[str, set[str]] | None = None,
    ) -> Mapping[str, str]:
        """The page's labels for a series' ``labels``: the same mapping when nothing folds.
        A worker's series notes its values in ``exported``."""
        out: dict[str, str] | None = None
        for name, book in self.books.items():
            value = labels.get(name)
            if value is None:
                continue
            if exported is not None:
                exported[name].add(value)
            mapped = book.admit(value, now)
            if mapped != value:
                if out is None:
                    out = dict(labels)
                out[name] = mapped
        return labels if out is None else out

    def admit(self, name: str, value: str, now: float) -> str:
        """The page's value for ``value`` of label ``name``, deciding it if new (a worker
        admitted it); a label without a bound passes it through."""
        book = self.books.get(name)
        return value if book is None else book.admit(value, now)

    def values_in(self, labels_seen: Iterable[Mapping[str, str]]) -> dict[str, set[str]]:
        """Which values of each bounded label ``labels_seen`` hold."""
        found: dict[str, set[str]] = {name: set() for name in self.books}
        for labels in labels_seen:
            for name, values in found.items():
                value = labels.get(name)
                if value is not None:
                    values.add(value)
        return found

    def expire(
        self, live: Mapping[str, set[str]], carried: Mapping[str, set[str]], now: float
    ) -> dict[str, set[str]]:
        """Forget what is no longer on the page: a folded value no worker exports (its counts
        are ``other``'s now), an own value nothing holds; and an own value only the carried
        totals hold whose counts have not moved for ``idle_seconds``. Returns those last ones,
        whose carried series are to go."""
        gone: dict[str, set[str]] = {}
        for name, book in self.books.items():
            exported = live.get(name, set())
            book.folded &= exported
            kept = carried.get(name, set())
            for value in list(book.own):
                if value in exported:
                    continue
                if value not in kept:
                    book.forget(value)
                elif now - book.moved.get(value, now) >= self.idle_seconds:
                    book.forget(value)
                    gone.setdefault(name, set()).add(value)
        return gone

    def note_totals(self, totals: Mapping[str, Mapping[str, float]], now: float) -> None:
        """The sum of each own value's counts on the page now: a change is a use."""
        for name, book in self.books.items():
            seen = totals.get(name, {})
            for value in book.own:
                total = seen.get(value, 0.0)
                if book.totals.get(value) != total:
                    book.totals[value] = total
                    book.moved[value] = now
