"""How many of this sidecar's streams are decoding right now, by model.

A stream is *decoding* from its first token until it finishes. Each gap between tokens is
labelled with the number decoding when the gap ended, as a band named by its upper bound
(``band(3) == "4"``): the hot path reads one integer per token (``DecodeConcurrency.n``),
nothing more. Wall time is accounted at transitions only (a stream entering or leaving
decode): the time since the previous transition is added to the band that held over it,
through the ``sink`` the exporter provides. Sans-I/O: the caller passes the clock's ``now``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["BANDS", "band", "DecodeConcurrency", "DecodeTrackers", "NO_TRACKER"]

#: Band upper bounds; a count above the last finite one falls in ``+Inf``.
BANDS: tuple[str, ...] = ("1", "2", "4", "8", "16", "32", "64", "128", "+Inf")


def _band(n: int) -> str:
    if n <= 1:
        return "1"
    if n > 128:
        return "+Inf"
    return str(1 << (n - 1).bit_length())


_BAND_OF: tuple[str, ...] = tuple(_band(n) for n in range(130))


def band(n: int) -> str:
    """The band of ``n`` (>= 1) concurrent streams: the smallest upper bound >= n (read from
    a table of every count up to the last finite bound)."""
    return _BAND_OF[n] if 0 <= n < 130 else _band(n)


class DecodeConcurrency:
    """The decoding streams of one model label, and the wall time spent at each band."""

    __slots__ = ("n", "_since", "_sink")

    def __init__(self, sink: Callable[[str, float], None] | None = None) -> None:
        self.n = 0
        self._since = 0.0
        self._sink = sink

    def _transition(self, now: float, delta: int) -> None:
        if self.n > 0 and self._sink is not None:
            elapsed = now - self._since
            if elapsed > 0:
                n = self.n
                try:
                    self._sink(_BAND_OF[n] if n < 130 else _band(n), elapsed)  # band(n), n > 0
                except Exception:  # measuring never breaks the relay
                    pass
        self.n += delta
        self._since = now

    def enter(self, now: float) -> None:
        """A stream's first token arrived."""
        self._transition(now, 1)

    def leave(self, now: float) -> None:
        """A stream that had entered finished (any outcome)."""
        if self.n > 0:
            self._transition(now, -1)


class _NoTracker(DecodeConcurrency):
    """Stands in when nothing tracks concurrency: ``n`` stays 0, transitions are free."""

    def enter(self, now: float) -> None:
        pass

    def leave(self, now: float) -> None:
        pass


NO_TRACKER: DecodeConcurrency = _NoTracker()


class DecodeTrackers:
    """One :class:`DecodeConcurrency` per model label, created on first use."""

    def __init__(
        self, sink_for: Callable[[str], Callable[[str, float], None]] | None = None
    ) -> None:
        self._by_label: dict[str, DecodeConcurrency] = {}
        self._sink_for = sink_for

    def forget(self, label: str) -> None:
        """Drop ``label``'s tracker (the label went idle: no stream of it is decoding)."""
        self._by_label.pop(label, None)

    def __call__(self, label: str) -> DecodeConcurrency:
        tracker = self._by_label.get(label)
        if tracker is None:
            sink = self._sink_for(label) if self._sink_for is not None else None
            tracker = self._by_label[label] = DecodeConcurrency(sink)
        return tracker
