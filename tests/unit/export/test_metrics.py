"""Instruments fed from scripted timelines, asserted on a fresh registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.base.buckets import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TOKEN_COUNT_BUCKETS,
    TPS_BUCKETS,
    TTFT_BUCKETS,
)
from sidecar.base.labels import ModelLabeler
from sidecar.base.outcomes import Outcome
from sidecar.base.routes import OTHER, ROUTES, match_route
from sidecar.config import Settings
from sidecar.export.metrics import SidecarMetrics, SLOThresholds
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.events import TokenKind, Usage
from tests.support.timelines import ROUTE, streamed


def make(slo=None) -> tuple[SidecarMetrics, CollectorRegistry]:
    reg = CollectorRegistry()
    m = SidecarMetrics(reg, slo)
    return m, reg


def test_streamed_request_feeds_every_histogram():
    m, reg = make(SLOThresholds(0.5, 0.1, 10.0))
    m.started("m", ROUTE)
    assert reg.get_sample_value("llm_requests_in_flight", {"model": "m", "route": ROUTE}) == 1
    t = streamed(
        [100.2, 100.25, 100.3, 100.4],
        usage=Usage(input_tokens=10, output_tokens=4, cached_input_tokens=3),
    )
    m.ended("m", ROUTE)
    m.record(summarize(t, "m"))
    mr = {"model": "m", "route": ROUTE}
    get = reg.get_sample_value
    assert get("llm_requests_in_flight", mr) == 0
    assert (
        get("llm_requests_total", {**mr, "code": "200", "outcome": "ok", "error_type": "none"}) == 1
    )
    m_ = {"model": "m"}  # the distributions are per model, not per route
    mrc = {**m_, "prompt_class": "all"}  # no classes configured
    assert get("llm_time_to_first_token_seconds_sum", mrc) == pytest.approx(0.2)
    assert get("llm_time_to_first_token_seconds_bucket", {**mrc, "le": "0.25"}) == 1
    assert get("llm_time_to_first_token_seconds_bucket", {**mrc, "le": "0.1"}) == 0
    assert get("llm_time_to_first_byte_seconds_sum", m_) == pytest.approx(0.01)
    assert get("llm_inter_token_latency_seconds_count", m_) == 3
    assert get("llm_inter_token_latency_seconds_sum", m_) == pytest.approx(0.2)
    assert get("llm_inter_token_latency_seconds_bucket", {**m_, "le": "0.05"}) == 2
    assert get("llm_time_per_output_token_seconds_sum", m_) == pytest.approx(0.2 / 3)
    assert get("llm_output_tokens_per_second_sum", m_) == pytest.approx(15.0)
    assert get("llm_request_duration_seconds_sum", {**m_, "outcome": "ok"}) == pytest.approx(0.401)
    # 3 of 10 prompt tokens cached: class partial, TTFT again.
    by_cache = {**m_, "cache": "partial"}
    assert get("llm_time_to_first_token_by_cache_seconds_sum", by_cache) == pytest.approx(0.2)
    assert get("llm_tokens_total", {**mr, "type": "input"}) == 10
    assert get("llm_tokens_total", {**mr, "type": "output"}) == 4
    assert get("llm_tokens_total", {**mr, "type": "cached_input"}) == 3
    assert get("llm_tokens_total", {**mr, "type": "reasoning"}) is None
    assert get("llm_request_tokens_bucket", {**m_, "type": "input", "le": "64.0"}) == 1
    assert get("llm_requests_within_slo_total", {"model": "m"}) == 1  # no route: goodput per model
    assert (
        get("llm_time_to_first_answer_token_seconds_count", m_) is None
    )  # first token was an answer


def test_reasoning_first_feeds_time_to_first_answer_token():
    m, reg = make()
    m.started("m", ROUTE)
    t = streamed(
        [100.1, 100.2, 100.9], kinds=[TokenKind.REASONING, TokenKind.REASONING, TokenKind.ANSWER]
    )
    m.record(summarize(t, "m"))
    mr = {"model": "m", "route": ROUTE}
    assert reg.get_sample_value(
        "llm_time_to_first_token_seconds_sum", {"model": "m", "prompt_class": "all"}
    ) == pytest.approx(0.1)
    assert reg.get_sample_value(
        "llm_time_to_first_answer_token_seconds_sum", {"model": "m"}
    ) == pytest.approx(0.9)
    assert reg.get_sample_value("llm_tokens_total", {**mr, "type": "reasoning"}) == 2


@pytest.mark.parametrize(
    "times, end, outcome, expected",
    [
        ([100.2, 100.25], None, Outcome.OK, 1),  # within every objective
        ([100.6, 100.65], None, Outcome.OK, 0),  # TTFT over 0.5
        ([100.2, 100.5], None, Outcome.OK, 0),  # TPOT 0.3 over 0.1
        ([100.2, 100.25], 111.0, Outcome.OK, 0),  # e2e over 10
        ([100.2, 100.25], None, Outcome.CANCELLED, 0),  # not ok
    ],
)
def test_goodput_needs_every_objective_at_once(times, end, outcome, expected):
    m, reg = make(SLOThresholds(0.5, 0.1, 10.0))
    m.started("m", ROUTE)
    m.record(summarize(streamed(times, outcome=outcome, end=end), "m"))
    assert (reg.get_sample_value("llm_requests_within_slo_total", {"model": "m"}) or 0) == expected


def test_a_fast_4xx_is_not_goodput():
    m, reg = make(SLOThresholds(0.5, 0.1, 10.0))
    t = RequestTimeline(100.0, "POST", ROUTE, "m")
    t.response_started(100.01, 429, streamed=False)
    t.finish(Outcome.OK, 100.02)
    m.started("m", ROUTE)
    m.record(summarize(t, "m"))
    assert reg.get_sample_value("llm_requests_within_slo_total", {"model": "m"}) is None


def test_failed_before_response_gets_a_code():
    m, reg = make()
    for outcome, code in ((Outcome.CANCELLED, "499"), (Outcome.ERROR, "500")):
        t = RequestTimeline(1.0, "POST", ROUTE, "m")
        t.finish(outcome, 2.0)
        m.started("m", ROUTE)
        m.record(summarize(t, "m"))
        # No cause given (the proxy always gives one): the error_type label's guard value.
        labels = {
            "model": "m",
            "route": ROUTE,
            "code": code,
            "outcome": outcome.value,
            "error_type": "other",
        }
        assert reg.get_sample_value("llm_requests_total", labels) == 1


def test_tokens_help_text_says_where_counts_come_from():
    m, reg = make()
    helps = {metric.name: metric.documentation for metric in reg.collect()}
    assert "usage" in helps["llm_tokens"] and "engine's own counts" in helps["llm_tokens"]
    assert (
        "estimated from the stream" in helps["llm_tokens"]
        and "input is not counted" in helps["llm_tokens"]
    )


@pytest.mark.parametrize(
    "usage,source",
    [
        (Usage(input_tokens=10, output_tokens=2), "usage"),
        (Usage(input_tokens=10, output_tokens=2, engine=True), "engine"),
        (Usage(input_tokens=10), "estimated"),  # input alone says nothing about the output
        (None, "estimated"),
    ],
)
def test_token_count_source_one_per_request(usage, source):
    m, reg = make()
    m.started("m", ROUTE)
    m.record(summarize(streamed([100.2, 100.3], usage=usage), "m"))
    get = reg.get_sample_value
    mr = {"model": "m", "route": ROUTE}
    assert get("llm_token_count_source_total", {**mr, "source": source}) == 1
    assert (
        sum(
            get("llm_token_count_source_total", {**mr, "source": s}) or 0
            for s in ("usage", "engine", "estimated", "none")
        )
        == 1
    )
    assert get("llm_tokens_total", {**mr, "type": "output"}) == 2
    assert get("llm_tokens_total", {**mr, "type": "input"}) == (None if usage is None else 10)


def test_token_count_source_none_for_json_without_usage_and_absent_off_api_routes():
    m, reg = make()
    for route in (ROUTE, "other"):
        t = RequestTimeline(100.0, "POST", route, "m")
        t.response_started(100.1, 200, streamed=False)
        t.finish(Outcome.OK, 100.2)
        m.started("m", route)
        m.record(summarize(t, "m"))
    assert (
        reg.get_sample_value(
            "llm_token_count_source_total", {"model": "m", "route": ROUTE, "source": "none"}
        )
        == 1
    )
    assert (
        reg.get_sample_value(
            "llm_token_count_source_total", {"model": "m", "route": "other", "source": "none"}
        )
        is None
    )


def test_model_labeler_bounds():
    lab = ModelLabeler(max_models=2)
    # A request starting with a name nobody vouched for is "other"; a 2xx answer earns it a slot.
    assert [lab(x) for x in ["a", None, ""]] == ["other", "unknown", "unknown"]
    assert [lab.settle(x, 200) for x in ["a", "b", "c", "a"]] == ["a", "b", "other", "a"]
    assert [lab(x) for x in ["a", "b", "c"]] == ["a", "b", "other"]
    assert ModelLabeler(max_models=5).settle("x" * 500, 200) == "other"
    allow = ModelLabeler(allowlist=["a"], max_models=1)
    assert [allow.settle(x, 200) for x in ["b", "a", "c"]] == ["other", "a", "other"]


def test_model_labeler_known_never_admits():
    lab = ModelLabeler(max_models=1)
    assert not lab.known("a") and not lab.known("a")  # asking twice does not take the slot
    assert lab("a") == "other" and not lab.known("a")  # nor does a request starting
    assert lab.settle("a", 200) == "a" and lab.known("a")
    assert not lab.known("b") and not lab.known(None) and not lab.known("")
    assert ModelLabeler(allowlist=["x"]).known("x") and not ModelLabeler(allowlist=["x"]).known("y")


@pytest.mark.parametrize(
    "buckets", [TTFT_BUCKETS, ITL_BUCKETS, E2E_BUCKETS, TPS_BUCKETS, TOKEN_COUNT_BUCKETS]
)
def test_buckets_sorted_and_unique(buckets):
    assert list(buckets) == sorted(set(buckets))


def test_default_slo_thresholds_are_buckets():
    s = Settings(upstream="http://x:1")
    assert s.slo_ttft_seconds in TTFT_BUCKETS
    assert s.slo_tpot_seconds in ITL_BUCKETS
    assert s.slo_e2e_seconds in E2E_BUCKETS
    with pytest.raises(ValueError, match="bucket"):
        Settings(upstream="http://x:1", slo_ttft_seconds=0.33)


def test_route_table():
    assert match_route("/v1/chat/completions")[0] is ROUTES["/v1/chat/completions"]
    assert match_route("/v1/chat/completions/")[0] is ROUTES["/v1/chat/completions"]
    assert match_route("/v1/chat/completionsX")[0] is OTHER
    route, model = match_route("/v2/models/llama/generate_stream")
    assert route.template == "/v2/models/{model}/generate_stream" and model == "llama"
    assert match_route("/v2/models/llama/versions/2/generate_stream")[1] == "llama"
    assert match_route("/health")[0] is OTHER
    assert match_route("/", "POST")[0].template == "/"  # TGI's compat route
    assert match_route("/", "GET")[0] is OTHER


def test_error_body_in_a_4xx_stays_ok_but_in_a_200_is_an_error():
    from sidecar.streams.protocols.events import StreamError

    for status, expected in ((404, Outcome.OK), (200, Outcome.ERROR)):
        t = RequestTimeline(1.0, "POST", ROUTE, "m")
        t.response_started(1.1, status, streamed=False)
        t.events([StreamError("The model `x` does not exist.")], 1.2)
        t.finish(Outcome.OK, 1.3)
        assert t.outcome is expected
