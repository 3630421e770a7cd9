"""PromQL's maths over two scrapes, by hand: ``increase()`` of counters and buckets,
``histogram_quantile()``, the sliding window and the figures the table shows. Pure: tested
by hand-computed values."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .exposition import ITL, TPOT, TTFT, Buckets, Snapshot

__all__ = [
    "WINDOW_SECONDS",
    "WindowFigures",
    "bucket_deltas",
    "counter_delta",
    "histogram_quantile",
    "window_baseline",
    "window_figures",
]

WINDOW_SECONDS = 10.0
"""Sliding window over which rates and percentiles are computed."""


def counter_delta(new: float, old: float) -> float:
    """Increase of a counter between two scrapes; a drop means it reset, as in ``increase()``."""
    return new - old if new >= old else new


def bucket_deltas(new: Buckets, old: Buckets) -> Buckets:
    """Per-bound increase of cumulative buckets between two scrapes (``increase(x_bucket)``).

    Bounds absent from ``old`` (the series did not exist yet) count from zero.
    """
    before = dict(old)
    return tuple((le, counter_delta(count, before.get(le, 0.0))) for le, count in new)


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q``-quantile of cumulative ``buckets``, as Prometheus's ``histogram_quantile``.

    Finds the first bucket whose cumulative count reaches ``q * total`` and interpolates
    linearly inside it, the lowest bucket starting at 0. A rank that lands in the +Inf
    bucket returns the highest finite bound. ``None`` when there are no observations (where
    Prometheus returns NaN) or no +Inf bucket.

    >>> round(histogram_quantile(0.5, ((0.1, 2.0), (0.2, 6.0), (float("inf"), 8.0))), 6)
    0.15
    """
    if not buckets or not math.isinf(buckets[-1][0]):
        return None
    total = buckets[-1][1]
    if total <= 0 or math.isnan(q):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    rank = q * total
    finite = len(buckets) - 1
    b = next((i for i in range(finite) if buckets[i][1] >= rank), finite)
    if b == finite:
        return buckets[finite - 1][0] if finite else None
    upper, count = buckets[b]
    if b == 0 and upper <= 0:
        return upper
    lower = 0.0
    if b > 0:
        lower, below = buckets[b - 1]
        count -= below
        rank -= below
    if count <= 0:
        return lower
    return lower + (upper - lower) * (rank / count)


def window_baseline(history: Sequence[Snapshot], now: float, window: float) -> Snapshot:
    """The scrape to subtract from the newest one: the oldest not older than ``window``.

    Before a whole window has passed, that is the first scrape (taken before any load),
    so early figures cover everything seen so far. ``history`` is oldest first, non-empty.
    """
    for snap in history:
        if snap.at >= now - window - 1e-6:
            return snap
    return history[-1]


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """What the live table shows; rates per second, latencies in seconds, None = no data."""

    seconds: float
    requests_per_s: float
    in_flight: float
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    tpot_p50: float | None
    output_tokens_per_s: float
    requests: float
    errors: float

    @property
    def error_ratio(self) -> float | None:
        return self.errors / self.requests if self.requests else None


def window_figures(new: Snapshot, old: Snapshot) -> WindowFigures:
    """Figures for the interval between two scrapes, as PromQL over that range would give:
    ``rate()`` of counters, ``histogram_quantile()`` of bucket increases, and the gauge now.
    """
    seconds = max(new.at - old.at, 1e-9)

    def quantile(q: float, name: str) -> float | None:
        return histogram_quantile(
            q, bucket_deltas(new.histograms.get(name, ()), old.histograms.get(name, ()))
        )

    requests = counter_delta(new.requests, old.requests)
    return WindowFigures(
        seconds=seconds,
        requests_per_s=requests / seconds,
        in_flight=new.in_flight,
        ttft_p50=quantile(0.5, TTFT),
        ttft_p99=quantile(0.99, TTFT),
        itl_p50=quantile(0.5, ITL),
        itl_p99=quantile(0.99, ITL),
        tpot_p50=quantile(0.5, TPOT),
        output_tokens_per_s=counter_delta(new.output_tokens, old.output_tokens) / seconds,
        requests=requests,
        errors=counter_delta(new.errors, old.errors),
    )
