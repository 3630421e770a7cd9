"""``observe_many`` must leave a histogram exactly as one ``observe`` per value would.

Compared on the exposition itself (text and OpenMetrics), so buckets, count and sum (down
to float rounding) all count, for values on bucket bounds, 0, -0.0, negatives, infinities
and NaN, and for batches landing on a histogram that already holds observations.
"""

from __future__ import annotations

import math
from array import array

import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from sidecar.base.buckets import ITL_BUCKETS, TOKEN_COUNT_BUCKETS
from sidecar.base.outcomes import Outcome
from sidecar.export.metrics import SidecarMetrics
from sidecar.export.prometheus_internals import observe_many, observe_one, observe_repeated
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.events import TokenKind, Tokens
from tests.support.timelines import per_token_gaps

FAST = settings(max_examples=300, deadline=None)
LABELS = ("m", "/v1/chat/completions")


def exposition(reg: CollectorRegistry) -> list[str]:
    """Both formats, minus ``_created`` (a wall-clock timestamp that differs per histogram)."""
    lines = (
        generate_latest(reg).decode().splitlines() + generate_openmetrics(reg).decode().splitlines()
    )
    return [line for line in lines if "_created" not in line]


FINE = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 1.0, 2.5, 5.0)
"""Bounds close enough together that each value of the examples lands in a bucket of its own."""


def pair(buckets=FINE):
    regs, children = [], []
    for _ in range(2):
        reg = CollectorRegistry()
        h = Histogram("x_seconds", "x", ("model", "route"), buckets=buckets, registry=reg)
        regs.append(reg)
        children.append(h.labels(*LABELS))
    return regs, children


def on_bounds(buckets):
    bounds = [float(b) for b in buckets]
    return (
        bounds
        + [math.nextafter(b, math.inf) for b in bounds]
        + [math.nextafter(b, -math.inf) for b in bounds]
    )


def values(buckets):
    return st.one_of(
        st.sampled_from(
            on_bounds(buckets) + [0.0, -0.0, math.inf, -math.inf, math.nan, -1.0, 1e300]
        ),
        st.floats(min_value=-1.0, max_value=2 * float(buckets[-1])),
        st.floats(allow_nan=True, allow_infinity=True),
    )


@FAST
@given(st.data())
def test_observe_one_is_observe(data):
    """``observe_one`` (a request's end observes ~10 histograms through it) against
    ``observe`` itself, value by value, exemplars included (OpenMetrics shows them)."""
    buckets = data.draw(
        st.sampled_from([ITL_BUCKETS, TOKEN_COUNT_BUCKETS, (0.5,), (-1.0, 0.0, 1.0)])
    )
    (reg_one, reg_fast), (one, fast) = pair(buckets)
    for v in data.draw(st.lists(values(buckets), min_size=1, max_size=40)):
        ex = data.draw(st.sampled_from([None, None, {}, {"trace_id": "abc"}]))
        one.observe(v, ex)
        observe_one(fast, v, ex)
    # An exemplar carries the wall-clock time it was set: compared without it.
    assert untimed(exposition(reg_fast)) == untimed(exposition(reg_one))


def untimed(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        sample, hashed, exemplar = line.partition(" # ")
        out.append(sample + hashed + exemplar.rpartition(" ")[0] if exemplar else line)
    return out


@FAST
@given(st.data())
def test_same_exposition_as_one_observe_per_value(data):
    buckets = data.draw(
        st.sampled_from([ITL_BUCKETS, TOKEN_COUNT_BUCKETS, (0.5,), (-1.0, 0.0, 1.0)])
    )
    batches = data.draw(st.lists(st.lists(values(buckets), max_size=60), min_size=1, max_size=4))
    (reg_one, reg_many), (one, many) = pair(buckets)
    for batch in batches:
        for v in batch:
            one.observe(v)
        as_array = data.draw(st.booleans())  # the timeline hands over an array('d')
        observe_many(many, array("d", batch) if as_array else batch)
    assert exposition(reg_many) == exposition(reg_one)


def same_but_the_sum(got: list[str], want: list[str], scale: float = 0.0) -> None:
    """Equal sample for sample, the ``_sum`` lines to float rounding: observing a value n
    times at once adds ``value * n``, not n additions (``scale``: the sum of the values'
    magnitudes, which bounds the rounding of the additions where they cancel out)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        name = g.split("{")[0].split(" ")[0]
        if name.endswith("_sum"):
            gv, wv = float(g.rsplit(" ", 1)[1]), float(w.rsplit(" ", 1)[1])
            close = gv == pytest.approx(wv, rel=1e-9, abs=1e-12 * scale)
            assert (gv != gv and wv != wv) or close, (g, w)
        else:
            assert g == w


@FAST
@given(st.data())
def test_observe_repeated_is_observe_n_times(data):
    buckets = data.draw(
        st.sampled_from([ITL_BUCKETS, TOKEN_COUNT_BUCKETS, (0.5,), (-1.0, 0.0, 1.0)])
    )
    (reg_one, reg_rep), (one, rep) = pair(buckets)
    scale = 0.0
    for v, n in data.draw(
        st.lists(st.tuples(values(buckets), st.integers(0, 40)), min_size=1, max_size=6)
    ):
        for _ in range(n):
            one.observe(v)
        observe_repeated(rep, v, n)
        if math.isfinite(v):
            scale += abs(v) * n
    same_but_the_sum(exposition(reg_rep), exposition(reg_one), scale)


def test_observe_repeated_where_the_product_overflows_adds_one_by_one():
    """Found by the property above: -inf, then twice 2**1023, is -inf one by one, where the
    product (inf) would make NaN."""
    (reg_one, reg_rep), (one, rep) = pair()
    for v, n in ((-math.inf, 1), (2.0**1023, 2)):
        for _ in range(n):
            one.observe(v)
        observe_repeated(rep, v, n)
    assert exposition(reg_rep) == exposition(reg_one)


def test_observe_repeated_costs_the_same_for_millions():
    """k tokens that arrived in one event are k gaps of one value: counted at once."""
    (reg, _), (h, _) = pair()
    observe_repeated(h, 0.004, 20_000_000)
    labels = {"model": "m", "route": LABELS[1]}
    assert reg.get_sample_value("x_seconds_count", labels) == 20_000_000
    assert reg.get_sample_value("x_seconds_bucket", {**labels, "le": "0.0025"}) == 0
    assert reg.get_sample_value("x_seconds_bucket", {**labels, "le": "0.005"}) == 20_000_000
    assert reg.get_sample_value("x_seconds_sum", labels) == pytest.approx(80_000)


def test_single_values_mixed_with_batches():
    (reg_one, reg_many), (one, many) = pair()
    for v in (0.02, 0.0025, 7.0):
        one.observe(v)
        many.observe(v)
    batch = [0.001, 0.0025, 0.02, 0.02, 0.1, 5.0, 6.0, math.inf, 0.0, -0.0]
    for v in batch:
        one.observe(v)
    observe_many(many, batch)
    assert exposition(reg_many) == exposition(reg_one)
    assert (
        reg_many.get_sample_value(
            "x_seconds_bucket", {"model": "m", "route": LABELS[1], "le": "0.02"}
        )
        == 8
    )


def test_nan_is_summed_but_counted_in_no_bucket():
    (reg_one, reg_many), (one, many) = pair()
    batch = [0.01, math.nan, 0.03]
    for v in batch:
        one.observe(v)
    observe_many(many, batch)
    assert exposition(reg_many) == exposition(reg_one)
    assert reg_many.get_sample_value("x_seconds_count", {"model": "m", "route": LABELS[1]}) == 2
    # Once the sum is NaN every later batch takes the NaN-filtering path: still exact.
    for v in (0.5, 0.25):
        one.observe(v)
    observe_many(many, [0.5, 0.25])
    assert exposition(reg_many) == exposition(reg_one)


def test_empty_batch_changes_nothing():
    (reg_one, reg_many), (_, many) = pair()
    observe_many(many, [])
    assert exposition(reg_many) == exposition(reg_one)


def test_parent_with_labels_refuses_like_observe():
    reg = CollectorRegistry()
    h = Histogram("x_seconds", "x", ("model",), registry=reg)
    with pytest.raises(ValueError):
        h.observe(1.0)
    with pytest.raises(ValueError):
        observe_many(h, [1.0])


def test_record_itl_matches_per_gap_observe():
    """End to end: the ITL histogram after ``record`` equals observing every gap alone."""
    t = RequestTimeline(100.0, "POST", LABELS[1], "m")
    t.response_started(100.01, 200, streamed=True)
    at = 100.1
    for i in range(50):
        at += (0.001, 0.0025, 0.013, 0.02, 0.3)[i % 5]
        t.events([Tokens(TokenKind.ANSWER, 1 + i % 3)], at)
    t.finish(Outcome.OK, at)
    reg = CollectorRegistry()
    SidecarMetrics(reg).record(summarize(t, "m"))
    ref_reg = CollectorRegistry()
    ref = Histogram(
        "inter_token_latency_seconds",
        "itl",
        ("model",),
        namespace="llm",
        buckets=ITL_BUCKETS,
        registry=ref_reg,
    )
    child = ref.labels("m")  # the distributions are per model
    for gap in per_token_gaps(t):
        child.observe(gap)
    assert t.gap_runs()  # events of 2 and 3 tokens: their gaps are runs
    itl = [line for line in exposition(reg) if line.startswith("llm_inter_token_latency_seconds")]
    assert itl
    same_but_the_sum(
        itl, [line for line in exposition(ref_reg) if line.startswith("llm_")]
    )  # samples, not HELP
