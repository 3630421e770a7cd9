"""Bounded label values that a client cannot squat: ``model`` and ``tenant``.

A label value costs series for as long as the process lives, and every client chooses the
model name and tenant header it sends. Admitted first come, first served, a client that
sends 60 made-up model names (each answered 404) would take all 50 slots, and the model the
server really serves would be counted as ``other`` until restart. The rules here:

- **Allowlist** (``--model-allowlist``): when set, only its names, nothing else.
- **Vouched**: the names the upstream says it serves (``/v1/models``, Ollama ``/api/tags``,
  TGI ``/info``; :mod:`sidecar.relay.control.model_discovery` refreshes them in the background,
  never on a request's path). Once the upstream has listed its models, that list is the
  authority: a name it does not list is ``other`` however the server answered it (llama.cpp
  and TGI answer any model name with 200, so a 2xx alone proves nothing there).
  A list longer than ``max_values`` (vLLM lists every LoRA adapter) gives its slots in the
  server's order, which lists the served model first; a listed name without a slot that the
  server then answers takes the slot of a listed name that was never requested (never one
  in use). Names that keep their series keep their slots at the next refresh.
- **Earned**: where no list can be had (the upstream serves none of those paths, or is down;
  tenants, which no server lists), a value is admitted once a request with it got an answer
  that is not a 4xx (a 2xx; also a 5xx, the server's failure, and the sidecar's own 502/504
  while the upstream is down, so an outage is still counted per model), as long as there is
  room (``max_values``) and the process-wide series budget allows. A request answered 4xx (a
  typo'd model, an unknown tenant) or left before any answer never takes a slot. A request
  is labelled once it has finished, so the first answered request of a new value carries it;
  the in-flight gauge, set at the start, counts it under ``other``.
- **One bound, whatever the listing does**: vouched and earned values together never exceed
  ``max_values``. A name the new list drops stays (earned, to age out) only while there is
  room; otherwise the least recently seen give their slots and series back at once, so a
  listing that names ten new models every refresh does not keep every name it ever listed.
- **The series budget counts before series exist**: a value's first request (a listed name's
  too) is labelled with it only if one series in each family that carries the label still
  fits (:class:`SeriesBudget`, counted from the registry by
  :class:`~sidecar.export.prometheus_internals.SeriesGate`, which also refuses any single
  series past the budget).
- **Idle values give their slot back**: an earned value unseen for ``idle_seconds`` is
  forgotten and its series are removed (counters restart from zero if it comes back, which
  ``rate()`` handles as a reset). **Never while a request holds it** (:meth:`hold`, from the
  request's start to its end): the in-flight gauge of a dropped value went to -1 when its
  request ended, and the stream's decode seconds were lost. Idle time counts from when the
  last request holding the value ended.

Every request whose value fell into ``other`` for lack of room, budget or vouching is counted
in ``llm_label_overflow_total{label, reason}``, so "why is my model under other?" has an
answer on the page itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypedDict, Unpack

__all__ = [
    "BoundedLabel",
    "ModelLabeler",
    "SeriesBudget",
    "OTHER",
    "UNKNOWN",
    "MAX_LABEL_CHARS",
    "OVERFLOW_REASONS",
]

OTHER = "other"
UNKNOWN = "unknown"
MAX_LABEL_CHARS = 200
OVERFLOW_REASONS = ("not_listed", "max_values", "series_budget")
"""Why a value that a request named was filed under ``other`` (``llm_label_overflow_total``)."""


class SeriesBudget:
    """The process's one series budget (``--max-series``), as label admission sees it: a new
    value is admitted only while one series in each family that carries its label still
    fits under ``max_series - reserve`` (the last ``reserve`` samples are for the ``other``
    rows). ``count`` (samples on the page now) and ``cost`` (label -> samples of one new
    value) come from whoever owns the registry
    (:class:`~sidecar.export.prometheus_internals.SeriesGate`); asked only at an admission,
    which is rare (at most ``max_models`` + ``max_tenants`` per idle period)."""

    __slots__ = ("max_series", "count", "cost", "reserve")

    def __init__(
        self, max_series: int, count: Callable[[], int], cost: Callable[[str], int], reserve: int
    ) -> None:
        self.max_series = max_series
        self.count = count
        self.cost = cost
        self.reserve = reserve

    def fits(self, label: str) -> bool:
        """Whether a new value of ``label`` may have its series."""
        return self.count() + self.cost(label) <= self.max_series - self.reserve


class LabelOptions(TypedDict, total=False):
    """:class:`BoundedLabel`'s keyword arguments, for the labelers that pass them on."""

    idle_seconds: float
    budget: SeriesBudget | None
    clock: Callable[[], float]
    name: str
    on_overflow: Callable[[str], None] | None
    on_forget: Callable[[str], object] | None  # its result is not used


class BoundedLabel:
    """Raw value -> bounded label value, with the rules in the module doc.

    ``__call__`` labels a request as it starts (no admission); :meth:`settle` labels it as it
    finishes, admitting an unvouched value after an answer that is not a 4xx. ``name`` is the
    label's name (``model``, ``tenant``), for the budget's cost of a new value. The owner of
    the label's series gives, with the label: ``on_overflow(reason)``, told each time a value
    falls into ``other``; ``on_forget(value)``, each time a value gives its slot back (its
    series are to go); and the ``budget`` a new value must fit in (none: only ``max_values``).
    """

    def __init__(
        self,
        allowlist: Iterable[str] = (),
        max_values: int = 50,
        *,
        idle_seconds: float = 3600.0,
        budget: SeriesBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "value",
        on_overflow: Callable[[str], None] | None = None,
        on_forget: Callable[[str], object] | None = None,
    ) -> None:
        self._allow = frozenset(allowlist)
        self._max = max_values
        self._idle = idle_seconds
        self.budget = budget
        self.name = name
        self._clock = clock
        self._listed: frozenset[str] = frozenset()  # everything the upstream listed: the authority
        self._vouched: dict[str, None] = {}  # listed names holding a slot, in the server's order
        self._used: dict[str, float] = {}  # vouched names a request was labelled with -> last seen
        self.authoritative = False  # the upstream listed its values: only those pass
        self._earned: dict[str, float] = {}  # value -> last seen (monotonic)
        self._held: dict[str, int] = {}  # value -> requests in flight under it
        self._starting: set[str] = set()  # listed names labelled at a start, not yet used
        self.on_overflow = on_overflow
        self.on_forget = on_forget

    # -- the request path -------------------------------------------------------------

    def __call__(self, value: str | None) -> str:
        """The label for a request starting now; never admits."""
        if not value:
            return UNKNOWN
        if self.known(value):
            if value in self._earned:
                self._earned[value] = self._clock()
            elif value in self._used:
                self._used[value] = self._clock()
            elif value in self._vouched:
                if not self._fits():
                    return OTHER  # a listed name whose series would not fit: settle counts it
                self._starting.add(value)  # its start may make series before settle decides
            return value
        return OTHER

    def settle(self, value: str | None, status: int | None) -> str:
        """The label for a finished request that got ``status``: admits ``value`` when it
        earned a slot (not a 4xx, room, budget, no allowlist or upstream list that excludes it)."""
        if not value:
            return UNKNOWN
        if self._allow:
            return value if value in self._allow else self._overflow("not_listed")
        if value in self._vouched:
            if value not in self._used:  # its first request: its series must fit
                if not self._fits():
                    if value in self._starting and value not in self._held:
                        self._starting.discard(value)  # what its start made (in flight, bands) goes
                        self._forget(value)
                    return self._overflow("series_budget")
                self._starting.discard(value)
            self._used[value] = self._clock()
            return value
        if value in self._earned:
            self._earned[value] = self._clock()
            return value
        if self.authoritative:
            if value not in self._listed:
                return self._overflow("not_listed")
            if status is None or 400 <= status < 500:
                return OTHER
            return self._answered(value)
        if status is None or 400 <= status < 500 or len(value) > MAX_LABEL_CHARS:
            return OTHER  # not earned (yet): nothing to count, a 4xx is the client's
        if len(self._earned) + len(self._vouched) >= self._max:
            return self._overflow("max_values")
        if not self._fits():
            return self._overflow("series_budget")
        self._earned[value] = self._clock()
        return value

    def _answered(self, value: str) -> str:
        """A listed name without a slot that the server answered: it takes the slot of the
        last listed name never requested, if any (the served model ahead of adapters nobody
        asked for, whatever order the server lists them in)."""
        if len(self._earned) + len(self._vouched) >= self._max:
            # A name the list no longer has (earned, aging out) goes first, then a listed one
            # never requested; never one a request holds.
            delisted = [v for v in self._earned if v not in self._held]
            idle = next(
                (v for v in reversed(self._vouched) if v not in self._used and v not in self._held),
                None,
            )
            if not delisted and idle is None:
                return self._overflow("max_values")
            if not self._fits():
                return self._overflow("series_budget")
            if delisted:
                oldest = min(delisted, key=self._earned.__getitem__)
                del self._earned[oldest]
                self._forget(oldest)
            else:
                assert idle is not None  # `not delisted and idle is None` returned above
                del self._vouched[idle]
                self._forget(idle)
        elif not self._fits():
            return self._overflow("series_budget")
        self._vouched[value] = None
        self._used[value] = self._clock()
        return value

    def _fits(self) -> bool:
        return self.budget is None or self.budget.fits(self.name)

    def known(self, value: str | None) -> bool:
        """Whether ``value`` is a label value now, without admitting it."""
        if not value:
            return False
        if self._allow:
            return value in self._allow
        return value in self._vouched or value in self._earned

    def hold(self, value: str) -> None:
        """A request labelled ``value`` started: the value keeps its slot and series until
        the matching :meth:`release`."""
        if value and value != OTHER and value != UNKNOWN:
            self._held[value] = self._held.get(value, 0) + 1

    def release(self, value: str) -> None:
        """The request that held ``value`` ended; its idle time starts now."""
        n = self._held.get(value)
        if n is None:
            return
        if n > 1:
            self._held[value] = n - 1
        else:
            del self._held[value]
        if value in self._earned:
            self._earned[value] = self._clock()
        elif value in self._used:
            self._used[value] = self._clock()

    def _overflow(self, reason: str) -> str:
        if self.on_overflow is not None:
            self.on_overflow(reason)
        return OTHER

    def _forget(self, value: str) -> None:
        self._used.pop(value, None)
        self._starting.discard(value)
        if self.on_forget is not None:
            self.on_forget(value)

    # -- the background refresh -------------------------------------------------------

    def vouch(self, values: Iterable[str]) -> None:
        """The upstream's own list of what it serves (in its order), replacing the previous
        one. At most ``max_values`` listed names hold slots: first those a request was
        labelled with, then the rest in the server's order. A value the list no longer has
        stays as earned, to age out like any idle value, while there is room."""
        order = list(dict.fromkeys(v for v in values if v and len(v) <= MAX_LABEL_CHARS))
        listed = frozenset(order)
        in_use = [v for v in order if v in self._used or v in self._earned or v in self._held]
        slots = list(dict.fromkeys(in_use[: self._max] + order))[: self._max]
        vouched = dict.fromkeys(slots)
        now = self._clock()
        for value in self._vouched:
            if value in vouched:
                continue
            if value in self._used or value in self._held:
                self._earned.setdefault(
                    value, self._used.get(value, now)
                )  # it has series: they age out
            else:
                self._forget(value)  # never requested (it may have an in-flight series at 0)
        for value in vouched:
            seen = self._earned.pop(value, None)
            if seen is not None:
                self._used[value] = seen
        self._used = {v: seen for v, seen in self._used.items() if v in vouched}
        self._listed, self._vouched, self.authoritative = listed, vouched, bool(listed)
        self._trim()

    def adopt(self, values: Iterable[str]) -> list[str]:
        """Values another process of the pod admitted (sidecar/fleet: its workers share one
        admission): each becomes a value here too, as if it had earned its slot, while there
        is room and budget, so a name is one label across the pod rather than its own in one
        worker and ``other`` in the next. What the allowlist or the server's list excludes is
        not adopted; a value adopted and never seen here ages out as an idle earned one does.
        Returns what was adopted."""
        if self._allow:
            return []
        adopted = []
        now = self._clock()
        for value in values:
            if not value or value in (OTHER, UNKNOWN) or len(value) > MAX_LABEL_CHARS:
                continue
            if self.known(value) or (self.authoritative and value not in self._listed):
                continue
            if len(self._earned) + len(self._vouched) >= self._max or not self._fits():
                break
            self._earned[value] = now
            adopted.append(value)
        return adopted

    def returnable(self, values: Iterable[str]) -> list[str]:
        """Which of ``values`` :meth:`give_back` would give back now (its owner copies their
        series' counts first, in the same step)."""
        return [v for v in dict.fromkeys(values) if v in self._earned and v not in self._held]

    def give_back(self, values: Iterable[str]) -> list[str]:
        """Earned values the rest of the pod files under ``other`` (sidecar/fleet: the pod's
        page holds the pod's bound): each gives its slot and series back now, so the slot can
        take one of the pod's own values; never one a request holds or the server lists.
        Returns them."""
        gone = self.returnable(values)
        for value in gone:
            del self._earned[value]
            self._forget(value)
        return gone

    def _trim(self) -> list[str]:
        """Give back the least recently seen earned values while vouched and earned exceed
        ``max_values`` (never one a request holds); returns them."""
        excess = len(self._vouched) + len(self._earned) - self._max
        if excess <= 0:
            return []
        gone = sorted(
            (v for v in self._earned if v not in self._held), key=self._earned.__getitem__
        )[:excess]
        for value in gone:
            del self._earned[value]
            self._forget(value)
        return gone

    def expire(self) -> list[str]:
        """Forget earned values unseen for ``idle_seconds`` (none a request holds), and any
        beyond ``max_values`` that a request held past a refresh; returns them."""
        cutoff = self._clock() - self._idle
        gone = [v for v, seen in self._earned.items() if seen < cutoff and v not in self._held]
        for value in gone:
            del self._earned[value]
            self._forget(value)
        return gone + self._trim()

    @property
    def values(self) -> frozenset[str]:
        return self._allow or frozenset(self._vouched.keys() | self._earned.keys())


class ModelLabeler(BoundedLabel):
    """The ``model`` label: the allowlist, else the names the upstream serves, else names
    that earned a slot with an answer that was not a 4xx (sidecar/base/labels.py has the rules)."""

    def __init__(
        self, allowlist: Iterable[str] = (), max_models: int = 50, **kwargs: Unpack[LabelOptions]
    ) -> None:
        kwargs.setdefault("name", "model")
        super().__init__(allowlist, max_models, **kwargs)
