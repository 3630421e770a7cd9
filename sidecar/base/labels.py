"""Bounded label values that a client cannot squat: ``model`` and ``tenant``.

A label value costs series for as long as the process lives, and every client chooses the
model name and tenant header it sends. Admitting values first come, first served let a client
that sent 60 made-up model names (each answered 404) take all 50 slots, so the model the
server really serves was counted as ``other`` until restart. The rules here:

- **Allowlist** (``--model-allowlist``): when set, only its names, nothing else.
- **Vouched**: the names the upstream says it serves (``/v1/models``, Ollama ``/api/tags``,
  TGI ``/info``; :mod:`sidecar.relay.model_discovery` refreshes them in the background,
  never on a request's path). Once the upstream has listed its models, that list is the
  authority: a name it does not list is ``other`` however the server answered it (llama.cpp
  and TGI answer any model name with 200, so a 2xx alone proves nothing there).
- **Earned**: where no list can be had (the upstream serves none of those paths, or is down;
  tenants, which no server lists), a value is admitted once a request with it got an answer
  that is not a 4xx (a 2xx; also a 5xx, the server's failure, and the sidecar's own 502/504
  while the upstream is down, so an outage is still counted per model), as long as there is
  room (``max_values``) and the process-wide series budget allows. A request answered 4xx (a
  typo'd model, an unknown tenant) or left before any answer never takes a slot. A request
  is labelled once it has finished, so the first answered request of a new value carries it;
  the in-flight gauge, set at the start, counts it under ``other``.
- **Idle values give their slot back**: an earned value unseen for ``idle_seconds`` is
  forgotten and its series are removed from the registry (counters restart from zero if it
  comes back, which ``rate()`` handles as a reset).

Every request whose value fell into ``other`` for lack of room, budget or vouching is counted
in ``llm_label_overflow_total{label, reason}``, so "why is my model under other?" has an
answer on the page itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

__all__ = ["BoundedLabel", "ModelLabeler", "SeriesBudget", "OTHER", "UNKNOWN", "MAX_LABEL_CHARS", "OVERFLOW_REASONS"]

OTHER = "other"
UNKNOWN = "unknown"
MAX_LABEL_CHARS = 200
OVERFLOW_REASONS = ("not_listed", "max_values", "series_budget")
"""Why a value that a request named was filed under ``other`` (``llm_label_overflow_total``)."""


class SeriesBudget:
    """The process's total series budget: a new label value is admitted only while the
    registry holds fewer than ``max_series`` samples. ``count`` (set by the metrics owner)
    counts them from the registry's own bookkeeping, cheaply enough to ask at each admission,
    which is rare (at most ``max_models`` + ``max_tenants`` per idle period)."""

    __slots__ = ("max_series", "count")

    def __init__(self, max_series: int = 12_000, count: Callable[[], int] | None = None) -> None:
        self.max_series = max_series
        self.count = count

    @property
    def room(self) -> bool:
        return self.count is None or self.count() < self.max_series


class BoundedLabel:
    """Raw value -> bounded label value, with the rules in the module doc.

    ``__call__`` labels a request as it starts (no admission); :meth:`settle` labels it as it
    finishes, admitting an unvouched value after an answer that is not a 4xx. ``on_overflow(reason)`` is told each
    time a value falls into ``other``; ``on_forget(value)`` each time an idle value is dropped.
    """

    def __init__(
        self,
        allowlist: Iterable[str] = (),
        max_values: int = 50,
        *,
        idle_seconds: float = 3600.0,
        budget: SeriesBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._allow = frozenset(allowlist)
        self._max = max_values
        self._idle = idle_seconds
        self.budget = budget
        self._clock = clock
        self._vouched: frozenset[str] = frozenset()
        self.authoritative = False  # the upstream listed its values: only those pass
        self._earned: dict[str, float] = {}  # value -> last seen (monotonic)
        self.on_overflow: Callable[[str], None] | None = None
        self.on_forget: Callable[[str], None] | None = None

    # -- the request path -------------------------------------------------------------

    def __call__(self, value: str | None) -> str:
        """The label for a request starting now; never admits."""
        if not value:
            return UNKNOWN
        if self.known(value):
            if value in self._earned:
                self._earned[value] = self._clock()
            return value
        return OTHER

    def settle(self, value: str | None, status: int | None) -> str:
        """The label for a finished request that got ``status``: admits ``value`` when it
        earned a slot (not a 4xx, room, budget, no allowlist or upstream list that excludes it)."""
        label = self(value)
        if label != OTHER or not value:
            return label
        if self._allow or self.authoritative:
            return self._overflow("not_listed")
        if status is None or 400 <= status < 500 or len(value) > MAX_LABEL_CHARS:
            return OTHER  # not earned (yet): nothing to count, a 4xx is the client's
        if len(self._earned) + len(self._vouched) >= self._max:
            return self._overflow("max_values")
        if self.budget is not None and not self.budget.room:
            return self._overflow("series_budget")
        self._earned[value] = self._clock()
        return value

    def known(self, value: str | None) -> bool:
        """Whether ``value`` is a label value now, without admitting it."""
        if not value:
            return False
        if self._allow:
            return value in self._allow
        return value in self._vouched or value in self._earned

    def _overflow(self, reason: str) -> str:
        if self.on_overflow is not None:
            self.on_overflow(reason)
        return OTHER

    # -- the background refresh -------------------------------------------------------

    def vouch(self, values: Iterable[str]) -> None:
        """The upstream's own list of what it serves, replacing the previous one. A value it
        no longer lists stays as earned, so it ages out like any idle value."""
        listed = frozenset(v for v in values if v and len(v) <= MAX_LABEL_CHARS)
        listed = frozenset(sorted(listed)[: self._max])
        now = self._clock()
        for gone in self._vouched - listed:
            self._earned.setdefault(gone, now)
        for value in listed:
            self._earned.pop(value, None)
        self._vouched, self.authoritative = listed, bool(listed)

    def expire(self) -> list[str]:
        """Forget earned values unseen for ``idle_seconds``; returns them."""
        cutoff = self._clock() - self._idle
        gone = [v for v, seen in self._earned.items() if seen < cutoff]
        for value in gone:
            del self._earned[value]
            if self.on_forget is not None:
                self.on_forget(value)
        return gone

    @property
    def values(self) -> frozenset[str]:
        return self._allow or (self._vouched | self._earned.keys())


class ModelLabeler(BoundedLabel):
    """The ``model`` label: the allowlist, else the names the upstream serves, else names
    that earned a slot with an answer that was not a 4xx (sidecar/base/labels.py has the rules)."""

    def __init__(self, allowlist: Iterable[str] = (), max_models: int = 50, **kwargs) -> None:
        super().__init__(allowlist, max_models, **kwargs)
