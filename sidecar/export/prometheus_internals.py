"""The one module that reads prometheus_client's private state.

prometheus_client has no public API for what the sidecar needs on its hot path and for its
series budget: observing many values into a histogram at once (a request's ITL has one value
per token), listing a metric's children, removing every child with one label value. Each
private name used is read here and nowhere else; ``tests/unit/test_prometheus_internals.py``
pins them on the installed version, and pyproject caps the dependency at the next minor
version not yet checked (``CHECKED_PROMETHEUS_CLIENT``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from functools import reduce
from operator import add

from prometheus_client import Counter, Histogram
from prometheus_client.values import MutexValue

__all__ = [
    "CHECKED_PROMETHEUS_CLIENT",
    "observe_many",
    "samples_per_child",
    "label_children",
    "label_names",
    "is_labelled_parent",
    "drop_label_value",
]

CHECKED_PROMETHEUS_CLIENT = "0.26.0"
"""The version these private reads were last checked on (pyproject: ``<0.27``)."""


def label_names(metric) -> tuple[str, ...]:
    """The label names ``metric`` was declared with."""
    return metric._labelnames


def is_labelled_parent(metric) -> bool:
    """``metric`` has labels and is the parent (not a child ``.labels(...)`` returned)."""
    return bool(metric._labelnames) and not metric._labelvalues


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for every ``v`` in ``values``, with the same result, at a
    fraction of the cost: one lock per touched bucket and one for the sum, instead of two
    locks and a bucket search per value. A request's ITL has one value per token.

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
    histogram._raise_if_not_observable()  # a labelled parent refuses, as observe() does
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
    for bound, bucket in zip(histogram._upper_bounds, histogram._buckets):
        upto = bisect_right(ordered, bound, done)
        if upto > done:
            bucket.inc(upto - done)
            if upto == end:
                break
            done = upto


def samples_per_child(metric) -> int:
    """Samples one child of ``metric`` exposes: a histogram's buckets, ``+Inf``, ``_sum``,
    ``_count`` and ``_created``; a counter's total and ``_created``; a gauge's value."""
    if isinstance(metric, Histogram):
        return len(metric._upper_bounds) + 3
    return 2 if isinstance(metric, Counter) else 1


def label_children(metric) -> list[tuple[str, ...]]:
    """The label-value tuples of ``metric``'s children. prometheus_client lists them only in
    the private ``_metrics`` dict (read under the metric's ``_lock``, as ``remove`` itself
    does)."""
    with metric._lock:
        return list(metric._metrics)


def drop_label_value(metric, label: str, value: str) -> int:
    """Remove ``metric``'s children whose ``label`` is ``value``; how many were removed
    (prometheus_client removes a child only by its full tuple of label values)."""
    index = label_names(metric).index(label)
    doomed = [key for key in label_children(metric) if key[index] == value]
    for key in doomed:
        try:
            metric.remove(*key)
        except KeyError:  # removed meanwhile
            pass
    return len(doomed)
