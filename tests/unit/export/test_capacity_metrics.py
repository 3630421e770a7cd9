"""Decode concurrency bands and the by-concurrency instruments, from scripted
timelines on a fake clock: each phase runs n streams whose gap follows a batching model."""

from __future__ import annotations

import heapq

import pytest
from prometheus_client import CollectorRegistry

from sidecar.base.buckets import ITL_BUCKETS
from sidecar.base.outcomes import Outcome
from sidecar.export.capacity import CapacityMetrics
from sidecar.export.metrics import SidecarMetrics
from sidecar.measure.concurrency import BANDS, DecodeConcurrency, band
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.events import TokenKind, Tokens

ROUTE = "/v1/chat/completions"


@pytest.mark.parametrize(
    "n, expected",
    [
        (1, "1"),
        (2, "2"),
        (3, "4"),
        (4, "4"),
        (5, "8"),
        (8, "8"),
        (9, "16"),
        (128, "128"),
        (129, "+Inf"),
    ],
)
def test_band_is_named_by_its_upper_bound(n, expected):
    assert band(n) == expected
    assert expected in BANDS


def test_wall_time_goes_to_the_band_that_held_between_transitions():
    spent: list[tuple[str, float]] = []
    c = DecodeConcurrency(lambda b, s: spent.append((b, s)))
    c.enter(10.0)  # 1 from 10
    c.enter(11.0)  # 2 from 11
    c.enter(11.5)  # 3 from 11.5
    c.leave(13.5)  # 2 from 13.5
    c.leave(14.0)
    c.leave(16.0)
    c.leave(17.0)  # more leaves than enters: ignored, never negative
    assert c.n == 0
    assert spent == [("1", 1.0), ("2", 0.5), ("4", 2.0), ("2", 0.5), ("1", 2.0)]


def tpot_model(n: int, tpot: float = 0.02, alpha: float = 0.25) -> float:
    return tpot * (1 + alpha * (n - 1))


def run_phase(
    metrics: SidecarMetrics, capacity: CapacityMetrics, n: int, t0: float, tokens: int
) -> float:
    """n streams, first tokens within a hair of each other, then one token per tpot(n) each."""
    gap = tpot_model(n)
    heap: list[tuple[float, int, int]] = []
    timelines = []
    for i in range(n):
        t = RequestTimeline(t0, "POST", ROUTE, "m")
        t.decode = capacity.trackers("m")
        t.response_started(t0, 200, streamed=True)
        timelines.append(t)
        heapq.heappush(heap, (t0 + 0.01 + i * 1e-4, i, 0))
    end = t0
    while heap:
        at, i, k = heapq.heappop(heap)
        t = timelines[i]
        t.events([Tokens(TokenKind.ANSWER)], at)
        if k + 1 < tokens:
            heapq.heappush(heap, (at + gap, i, k + 1))
        else:
            t.finish(Outcome.OK, at)
            metrics.record(summarize(t, "m"))
            capacity.record(summarize(t, "m"))
            end = at
    return end + 1.0


def test_per_band_gap_and_throughput_follow_the_batching_model_and_counts_add_up():
    reg = CollectorRegistry()
    metrics = SidecarMetrics(reg)
    capacity = CapacityMetrics(reg)
    t0 = 1000.0
    for n in (1, 2, 4, 8):
        t0 = run_phase(metrics, capacity, n, t0, tokens=200)
    total = 0.0
    for n in (1, 2, 4, 8):
        labels = {"model": "m", "concurrency": band(n)}
        count = reg.get_sample_value("llm_inter_token_latency_by_concurrency_seconds_count", labels)
        gap_sum = reg.get_sample_value("llm_inter_token_latency_by_concurrency_seconds_sum", labels)
        assert gap_sum / count == pytest.approx(tpot_model(n), rel=0.2)
        tokens = count  # one gap per output token after a stream's first
        seconds = reg.get_sample_value("llm_decode_seconds_by_concurrency_total", labels)
        assert tokens / seconds == pytest.approx(n / tpot_model(n), rel=0.25)
    for b in BANDS:
        labels = {"model": "m", "concurrency": b}
        total += (
            reg.get_sample_value("llm_inter_token_latency_by_concurrency_seconds_count", labels)
            or 0
        )
    plain = reg.get_sample_value("llm_inter_token_latency_seconds_count", {"model": "m"})
    assert plain == total == (1 + 2 + 4 + 8) * 199
    assert capacity.trackers("m").n == 0


def test_a_stream_that_ends_before_its_first_token_never_counts_as_decoding():
    capacity = CapacityMetrics(CollectorRegistry())
    tracker = capacity.trackers("m")
    t = RequestTimeline(1.0, "POST", ROUTE, "m")
    t.decode = tracker
    t.finish(Outcome.CANCELLED, 2.0)
    assert tracker.n == 0
    u = RequestTimeline(1.0, "POST", ROUTE, "m")
    u.decode = tracker
    u.events([Tokens(TokenKind.ANSWER)], 1.5)
    assert tracker.n == 1
    u.finish(Outcome.CANCELLED, 2.0)
    assert tracker.n == 0


def test_every_band_exists_at_zero_before_the_load_can_reach_it():
    """Prometheus's rate and increase never count a series' first sample, so a band whose
    series appeared only with its first request's gaps lost them from the capacity rules'
    window (20-25 % of each band in tests/real/test_capacity_sweep.py): a band's three
    series exist at zero before the first stream that takes the load into it. Not all nine
    bands at a model's first stream, and nothing for a label none of whose requests decodes
    (a 404 filed under ``other``): the lowest three once a stream of it has decoded, then
    the band above each band the load reaches."""
    registry = CollectorRegistry()
    capacity = CapacityMetrics(registry)

    def exists(b: str) -> bool:
        labels = {"model": "m", "concurrency": b}
        return (
            registry.get_sample_value(
                "llm_inter_token_latency_by_concurrency_seconds_count", labels
            )
            == 0
            and registry.get_sample_value(
                "llm_inter_token_latency_by_concurrency_seconds_bucket", {**labels, "le": "+Inf"}
            )
            == 0
            and registry.get_sample_value(
                "llm_inter_token_latency_by_concurrency_seconds_count", labels
            )
            == 0
            and registry.get_sample_value("llm_decode_seconds_by_concurrency_total", labels)
            is not None
        )

    tracker = capacity.trackers("m")  # the proxy asks for the model's tracker as a request starts
    assert not any(exists(b) for b in BANDS) and capacity.series_count() == 0
    tracker.enter(1.0)  # the first stream's first token
    tracker.enter(2.0)  # a second stream: the first report of decode time (band 1)
    assert [b for b in BANDS if exists(b)] == ["1", "2", "4"]
    assert capacity.series_count() == 3 * (len(ITL_BUCKETS) + 1 + 2 + 1)  # ITL, seconds
    now = 2.0
    for n in range(3, 201):  # streams start one at a time: the band of n exists before the n-th
        assert exists(band(n)), n
        now += 1.0
        tracker.enter(now)
    assert all(exists(b) for b in BANDS)
    other = capacity.trackers("k")  # a load that stops at 4 streams: one band above it
    for n in range(4):
        other.enter(float(n))
    other.leave(5.0)

    def bands_of_k() -> list[str]:
        name = "llm_decode_seconds_by_concurrency_total"
        return [
            b
            for b in BANDS
            if registry.get_sample_value(name, {"model": "k", "concurrency": b}) is not None
        ]

    assert bands_of_k() == ["1", "2", "4", "8"]


def test_an_idle_model_label_gives_back_its_capacity_series_and_tracker():
    """A model label forgotten for idleness (sidecar/base/labels.py) leaves nothing behind
    in the capacity metrics either; if it comes back, its bands are made afresh."""
    from sidecar.app import build_sidecar
    from sidecar.config import Settings

    registry = CollectorRegistry()
    sc = build_sidecar(Settings(upstream="http://127.0.0.1:9"), registry)
    capacity = sc.capacity

    def series(model: str) -> int:
        return sum(
            1
            for family in registry.collect()
            if family.name.startswith(("llm_inter_token_latency_by_concurrency", "llm_decode_"))
            for s in family.samples
            if s.labels.get("model") == model
        )

    def decode(model: str) -> None:  # one stream of the model decodes
        tracker = capacity.trackers(model)
        tracker.enter(1.0)
        tracker.leave(2.0)

    tracker = capacity.trackers("a")
    decode("a")
    decode("b")
    assert series("a") > 0 and series("b") == series("a")
    sc.metrics.model_label.on_forget("a")  # what the label refresh calls for an idle value
    assert series("a") == 0 and series("b") > 0
    assert capacity.trackers("a") is not tracker  # back again: a fresh tracker
    assert series("a") == 0  # and no series until it decodes again
    decode("a")
    assert series("a") == series("b")


def test_the_series_budget_counts_the_capacity_series_too():
    """--max-series bounds every labelled series: a model label's bands of capacity series
    count against it, so the budget refuses new label values as soon as they would pass it."""
    from sidecar.app import build_sidecar
    from sidecar.config import Settings

    registry = CollectorRegistry()
    sc = build_sidecar(Settings(upstream="http://127.0.0.1:9"), registry)
    budget = sc.metrics.model_label.budget
    before = budget.count()
    tracker = sc.capacity.trackers("a")  # a model's first stream makes its bands' series
    tracker.enter(1.0)
    tracker.leave(2.0)
    grown = budget.count() - before
    assert grown == sc.capacity.series_count() > 0
    exposed = sum(
        1
        for family in sc.renderer._registry.collect()  # as /metrics serves it: no _created
        if family.name.startswith(("llm_inter_token_latency_by_concurrency", "llm_decode_"))
        for s in family.samples
    )
    assert grown == exposed  # counted as the exposition has them


@pytest.mark.parametrize(
    "streams",
    [[3, 4, 4, 3, 4], [1, 2, 3, 5, 9, 17, 33, 65, 129], [130, 200, 129], [2, 2, 3]],
    ids=["one-band", "every-band", "above-128", "two-bands"],
)
def test_a_requests_gaps_land_in_the_band_of_each_gap_in_one_band_or_many(streams):
    from array import array

    gaps = array("d", [0.01 * (i + 1) for i in range(len(streams))])
    reg = CollectorRegistry()
    capacity = CapacityMetrics(reg)
    t = RequestTimeline(100.0, "POST", "/v1/chat/completions", "m")
    t.add_tokens(len(gaps), gaps, array("I", streams), 101.0, None)
    t.finish(Outcome.OK, 101.5)
    capacity.record(summarize(t, "m"))
    expected: dict[str, list[float]] = {}
    for gap, n in zip(gaps, streams, strict=True):
        expected.setdefault(band(n), []).append(gap)
    for b in BANDS:
        labels = {"model": "m", "concurrency": b}
        values = expected.get(b, [])
        assert (
            reg.get_sample_value("llm_inter_token_latency_by_concurrency_seconds_count", labels)
            or 0
        ) == len(values)
        assert (
            reg.get_sample_value("llm_inter_token_latency_by_concurrency_seconds_sum", labels) or 0
        ) == pytest.approx(sum(values))
        count = "llm_inter_token_latency_by_concurrency_seconds_count"  # the decode tokens
        assert (reg.get_sample_value(count, labels) or 0) == len(values)
