"""The request's own objectives (x-llm-d-slo-*-ms, x-slo-*-ms), the model's defaults, the
verdicts, and the TTFT cache class: sidecar/measure/objectives.py, cache_class.py and the
families and span attributes they feed."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from sidecar.app import objective_defaults
from sidecar.base.outcomes import Outcome
from sidecar.config import ConfigError, Settings, load_settings
from sidecar.export import semconv as sc
from sidecar.export.metrics import SidecarMetrics
from sidecar.export.spans import RequestTelemetry
from sidecar.measure.cache_class import CacheClass, cache_class
from sidecar.measure.objectives import (
    ObjectiveDefaults,
    RequestObjectives,
    parse_objective_ms,
    read_objectives,
)
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.anthropic import AnthropicStreamDialect
from sidecar.streams.protocols.events import TokenKind, Tokens, Usage
from sidecar.streams.protocols.openai import OpenAIStreamDialect
from sidecar.streams.protocols.responses import ResponsesStreamDialect
from tests.fixtures.streams.harness import load, run_whole

ROUTE = "/v1/chat/completions"
TOKEN = Tokens(TokenKind.ANSWER)


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy:
    return CIMultiDictProxy(CIMultiDict(pairs))


# -- reading the headers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("350", 0.35),
        ("1", 0.001),
        (" 2500 ", 2.5),
        ("\t40 \t", 0.04),
        ("12.5", 0.0125),
        ("86400000", 86400.0),
    ],
)
def test_plain_milliseconds_are_read(raw, seconds):
    assert parse_objective_ms(raw) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "raw",
    [
        *("0", "0.0", "-5", "+5", "86400001", "1e3", "NaN", "inf", "350ms", "", "0x10", "1_000"),
        *("٣", "\u00a05", "5\u00a0", "\u30005", "\u00855", "\x0b5", "\x0c5", "\r5", "\n5"),
    ],
)
def test_absurd_values_are_not_objectives(raw):
    assert parse_objective_ms(raw) is None


def test_no_header_builds_nothing():
    assert read_objectives(headers(("content-type", "application/json"))) is None


def test_headers_are_read_and_bad_ones_named():
    got = read_objectives(headers(("X-SLO-TTFT-MS", "500"), ("x-slo-tpot-ms", "-1")))
    assert got == RequestObjectives(ttft=0.5, tpot=None, invalid=("tpot",))
    assert read_objectives(headers(("x-slo-tpot-ms", "40"))) == RequestObjectives(None, 0.04, ())


def test_llm_d_spelling_is_read_and_wins_over_the_first_one():
    assert read_objectives(headers(("x-llm-d-slo-ttft-ms", "500"))) == RequestObjectives(0.5)
    assert read_objectives(headers(("X-LLM-D-SLO-TPOT-MS", "40"))) == RequestObjectives(None, 0.04)
    both = headers(
        ("x-slo-ttft-ms", "100"),
        ("x-llm-d-slo-ttft-ms", "900"),
        ("x-llm-d-slo-tpot-ms", "bad"),
        ("x-slo-tpot-ms", "40"),
    )
    # Per objective: the llm-d header is read when present, valid or not; the other is not.
    assert read_objectives(both) == RequestObjectives(0.9, None, ("tpot",))
    mixed = headers(("x-llm-d-slo-ttft-ms", "250"), ("x-slo-tpot-ms", "30"))
    assert read_objectives(mixed) == RequestObjectives(0.25, 0.03)


def test_a_repeated_header_is_a_list_not_a_number():
    got = read_objectives(headers(("x-slo-ttft-ms", "500"), ("x-slo-ttft-ms", "900")))
    assert got == RequestObjectives(None, None, ("ttft",))


# -- defaults --------------------------------------------------------------------------------


def test_defaults_come_from_the_model_then_the_goodput_objectives():
    settings = load_settings(
        {"upstream": "http://x:1", "slo_model_objectives": '{"big:405b": {"ttft_seconds": 5}}'},
        environ={},
    )
    defaults = objective_defaults(settings)
    assert defaults.for_model("big:405b") == (5.0, settings.slo_tpot_seconds)
    assert defaults.for_model("small") == (settings.slo_ttft_seconds, settings.slo_tpot_seconds)


@pytest.mark.parametrize(
    "value",
    [
        '{"m": {"ttft_seconds": 0}}',
        '{"m": {"ttft": 1}}',
        '{"m": 5}',
        "[1]",
        "{m: 1}",
        '{"m": {"tpot_seconds": 90000}}',
    ],
)
def test_bad_model_objectives_fail_at_start(value):
    with pytest.raises(ConfigError, match="slo_model_objectives"):
        load_settings({"upstream": "http://x:1", "slo_model_objectives": value}, environ={})


def test_yaml_mapping_is_accepted(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstream: http://x:1\nslo_model_objectives:\n  qwen3:8b: {tpot_seconds: 0.05}\n"
    )
    assert (
        load_settings({}, environ={}, config_file=str(path))
        .slo_model_objectives["qwen3:8b"]
        .tpot_seconds
        == 0.05
    )


# -- verdicts ----------------------------------------------------------------------------------


def stream(
    ttft: float | None,
    gaps: list[float],
    *,
    outcome=Outcome.OK,
    status=200,
    end: float | None = None,
    asked=None,
    model="m",
):
    """A streamed request starting at 0 whose first token came at ``ttft`` and the next after ``gaps``."""
    t = RequestTimeline(0.0, "POST", ROUTE, model)
    t.objectives = asked
    t.request_stream = True
    t.response_started(0.001, status, streamed=True)
    now = ttft
    if ttft is not None:
        t.events([TOKEN], ttft)
        for gap in gaps:
            now += gap
            t.events([TOKEN], now)
    t.finish(outcome, end if end is not None else (now or 0.0) + 0.01)
    return t


DEFAULTS = ObjectiveDefaults(2.0, 0.1)


def test_header_objectives_win_over_defaults():
    j = summarize(
        stream(0.5, [0.05] * 4, asked=RequestObjectives(0.3, 0.06)), "m", DEFAULTS
    ).judgement
    assert (j.ttft_objective, j.tpot_objective, j.ttft_from_header, j.tpot_from_header) == (
        0.3,
        0.06,
        True,
        True,
    )
    assert (j.ttft_met, j.tpot_met, j.met) == (False, True, False)


def test_without_headers_the_defaults_judge():
    j = summarize(stream(0.5, [0.05] * 4), "m", DEFAULTS).judgement
    assert (j.ttft_objective, j.ttft_from_header, j.ttft_met, j.tpot_met, j.met) == (
        2.0,
        False,
        True,
        True,
        True,
    )


def test_no_token_is_a_ttft_miss_but_no_tpot_verdict():
    j = summarize(
        stream(None, [], outcome=Outcome.ERROR, status=200, end=0.2), "m", DEFAULTS
    ).judgement
    assert (j.ttft_met, j.tpot_met, j.met) == (False, None, False)


def test_a_client_that_left_early_is_not_judged():
    assert (
        summarize(
            stream(None, [], outcome=Outcome.CANCELLED, end=0.2), "m", DEFAULTS
        ).judgement.verdicts()
        == ()
    )
    late = summarize(stream(None, [], outcome=Outcome.CANCELLED, end=3.0), "m", DEFAULTS).judgement
    assert late.verdicts() == (("ttft", False), ("all", False))


def test_one_token_has_no_tpot_verdict():
    j = summarize(stream(0.1, []), "m", DEFAULTS).judgement
    assert j.verdicts() == (("ttft", True), ("all", True))


def test_an_error_after_good_timings_is_not_goodput():
    j = summarize(stream(0.1, [0.01, 0.01], outcome=Outcome.ERROR), "m", DEFAULTS).judgement
    assert j.verdicts() == (("ttft", True), ("tpot", True), ("all", False))


def test_non_streams_and_other_routes_are_not_judged():
    t = RequestTimeline(0.0, "POST", ROUTE, "m")
    t.response_started(0.1, 200, streamed=False)
    t.finish(Outcome.OK, 0.2)
    assert summarize(t, "m", DEFAULTS).judgement is None
    health = stream(0.1, [0.01])
    health.route = "other"
    assert summarize(health, "m", DEFAULTS).judgement is None
    assert summarize(stream(0.1, [0.01]), "m", ObjectiveDefaults()).judgement is None


def test_metrics_count_verdicts_and_invalid_headers():
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    metrics.record(
        summarize(
            stream(0.5, [0.05] * 3, asked=RequestObjectives(0.3, None, ("tpot",))), "m", DEFAULTS
        )
    )
    metrics.record(summarize(stream(0.2, [0.05] * 3), "m", DEFAULTS))
    value = lambda objective, result: registry.get_sample_value(  # noqa: E731
        "llm_request_objectives_total",
        {"model": "m", "objective": objective, "result": result},
    )
    assert (value("ttft", "met"), value("ttft", "missed")) == (1, 1)
    assert (value("tpot", "met"), value("tpot", "missed")) == (2, None)
    assert (value("all", "met"), value("all", "missed")) == (1, 1)
    assert (
        registry.get_sample_value(
            "llm_request_objective_invalid_total", {"route": ROUTE, "objective": "tpot"}
        )
        == 1
    )


def test_span_carries_objectives_verdicts_cache_class_and_tool_calls():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = RequestTelemetry("http://127.0.0.1:8000", tracer_provider=provider)
    t = RequestTimeline(0.0, "POST", ROUTE, "m")
    t.objectives = RequestObjectives(0.3, None, ("tpot",))
    t.request_stream = True
    telemetry.start({}, t)
    t.response_started(0.01, 200, streamed=True)
    d = OpenAIStreamDialect()
    for i, chunk in enumerate(load("openai", "built_vllm_parallel_tools.txt").split(b"\n\n")):
        t.events(d.feed(chunk + b"\n\n"), 0.1 * (i + 1))
    t.finish(Outcome.OK, 2.0)
    telemetry.record(summarize(t, "m", DEFAULTS))
    (span,) = exporter.get_finished_spans()
    a = span.attributes
    assert (
        a[sc.LLM_SIDECAR_OBJECTIVE_TTFT] == 0.3
        and a[sc.LLM_SIDECAR_OBJECTIVE_TTFT_SOURCE] == "header"
    )
    assert (
        a[sc.LLM_SIDECAR_OBJECTIVE_TPOT] == 0.1
        and a[sc.LLM_SIDECAR_OBJECTIVE_TPOT_SOURCE] == "default"
    )
    assert a[sc.LLM_SIDECAR_OBJECTIVE_TTFT_MET] is True  # the first tool-call piece at 0.2 s
    assert a[sc.LLM_SIDECAR_OBJECTIVE_TPOT_MET] is True and a[sc.LLM_SIDECAR_OBJECTIVE_MET] is True
    assert a[sc.LLM_SIDECAR_OBJECTIVE_INVALID] == ("tpot",)
    assert a[sc.LLM_SIDECAR_CACHE_CLASS] == "most"  # 288 of 312 prompt tokens cached
    assert a[sc.LLM_SIDECAR_TTFTC] == pytest.approx(0.2)
    assert a[sc.LLM_SIDECAR_TOOL_CALLS] == 2
    assert a[sc.LLM_SIDECAR_TOOL_CALL_ASSEMBLY] == pytest.approx((0.3, 0.3))


# -- cache class ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "cached", "cls"),
    [
        (100, 0, CacheClass.NONE),
        (100, 1, CacheClass.PARTIAL),
        (100, 49, CacheClass.PARTIAL),
        (100, 50, CacheClass.MOST),
        (470, 384, CacheClass.MOST),  # vLLM on CPU, a shared prefix (REAL-PARTS.md)
        (100, None, CacheClass.UNKNOWN),
        (None, 5, CacheClass.UNKNOWN),
        (0, 0, CacheClass.UNKNOWN),
    ],
)
def test_cache_class_bounds(prompt, cached, cls):
    assert cache_class(prompt, cached) is cls


@pytest.mark.parametrize(
    ("folder", "name", "make", "cls"),
    [
        ("openai", "built_vllm_parallel_tools.txt", OpenAIStreamDialect, "most"),
        (
            "openai",
            "vllm032_chat_include_usage.txt",
            OpenAIStreamDialect,
            "unknown",
        ),  # no prompt_tokens_details
        (
            "openai",
            "vllm032_chat_no_usage.txt",
            OpenAIStreamDialect,
            "unknown",
        ),  # no usage at all: never a miss
        ("anthropic", "basic.txt", AnthropicStreamDialect, "unknown"),  # no cache counts
        ("anthropic", "web_search_cache.txt", AnthropicStreamDialect, "partial"),  # 2048 of 12730
        ("anthropic", "parallel_tool_use.txt", AnthropicStreamDialect, "most"),  # 1536 of 1563
        ("responses", "text.txt", ResponsesStreamDialect, "none"),  # cached_tokens 0
        ("responses", "reasoning_tool.txt", ResponsesStreamDialect, "most"),  # 1152 of 1290
    ],
)
def test_ttft_by_cache_class_from_each_dialects_usage(folder, name, make, cls):
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    t = RequestTimeline(0.0, "POST", ROUTE, "m")
    t.response_started(0.01, 200, streamed=True)
    t.events(run_whole(make, load(folder, name)), 0.25)
    t.finish(Outcome.OK, 0.5)
    metrics.record(summarize(t, "m"))
    got = {
        c: registry.get_sample_value(
            "llm_time_to_first_token_by_cache_seconds_count", {"model": "m", "cache": c}
        )
        for c in ("none", "partial", "most", "unknown")
    }
    # unknown (no cached count reported) is in the TTFT histogram only: no series of its own.
    assert got == {c: (1.0 if c == cls != "unknown" else None) for c in got}
    ttft = registry.get_sample_value(
        "llm_time_to_first_token_seconds_sum", {"model": "m", "prompt_class": "all"}
    )
    by_cache = registry.get_sample_value(
        "llm_time_to_first_token_by_cache_seconds_sum", {"model": "m", "cache": cls}
    )
    assert ttft == 0.25 and by_cache == (None if cls == "unknown" else 0.25)


def test_usage_reported_late_counts_the_class_of_the_last_usage():
    t = RequestTimeline(0.0, "POST", ROUTE, "m")
    t.events([Usage(input_tokens=400, cached_input_tokens=0), TOKEN], 0.1)
    t.events([Usage(input_tokens=400, output_tokens=1, cached_input_tokens=384)], 0.2)
    assert cache_class(t.input_tokens, t.cached_input_tokens) is CacheClass.MOST


def test_settings_default_is_no_model_objectives():
    assert Settings(upstream="http://x:1").slo_model_objectives == {}
