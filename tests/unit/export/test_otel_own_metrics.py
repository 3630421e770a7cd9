"""The OTel metrics in the sidecar's own namespace (sidecar/export/otel_own_metrics.py): TTFT
by prefix-cache class, time to first tool call, tool-call assembly, tool calls per response
and the requests' own objectives, recorded beside the GenAI client metrics from the same
finished timeline as the Prometheus families, read back through an in-memory reader.

The timeline is the recorded two-call vLLM stream (tests/fixtures/streams), one event every
0.1 s, so every expected figure is worked out from the fixture's layout.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from sidecar.base.buckets import TOOL_CALL_COUNT_BUCKETS
from sidecar.base.outcomes import Outcome
from sidecar.export import semconv as sc
from sidecar.export.metrics import SidecarMetrics
from sidecar.export.spans import RequestTelemetry
from sidecar.measure.objectives import ObjectiveDefaults, RequestObjectives
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.openai import OpenAIStreamDialect
from tests.fixtures.streams.harness import load
from tests.support.samples import metric_points

ROUTE = "/v1/chat/completions"
DEFAULTS = ObjectiveDefaults(2.0, 0.1)
COMMON = {
    sc.GEN_AI_OPERATION_NAME: "chat",
    sc.GEN_AI_PROVIDER_NAME: "openai",
    sc.GEN_AI_REQUEST_MODEL: "m",
    sc.SERVER_ADDRESS: "127.0.0.1",
    sc.SERVER_PORT: 8000,
}


def streamed(fixture: str, asked: RequestObjectives | None = None) -> RequestTimeline:
    """The fixture's events at 0.1 s, 0.2 s, ... of a request that started at 0."""
    t = RequestTimeline(0.0, "POST", ROUTE, "m")
    t.objectives = asked
    t.request_stream = True
    t.response_started(0.01, 200, streamed=True)
    d = OpenAIStreamDialect()
    events = [e for e in load("openai", fixture).split(b"\n\n") if e.strip()]
    for i, chunk in enumerate(events):
        t.events(d.feed(chunk + b"\n\n"), 0.1 * (i + 1))
    t.events(d.close(), 0.1 * (len(events) + 1))
    t.finish(Outcome.OK, 2.0)
    return t


def record(t: RequestTimeline, *, latest: bool) -> dict[str, list]:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    telemetry = RequestTelemetry(
        "http://127.0.0.1:8000",
        meter_provider=meters,
        latest_genai_names=latest,
    )
    telemetry.record(summarize(t, "m", DEFAULTS))
    out = metric_points(reader)
    meters.shutdown()
    return out


@pytest.mark.parametrize(
    "latest", [False, True], ids=["released-genai-names", "latest-genai-names"]
)
def test_tool_calls_cache_class_and_objectives_as_otel_metrics(latest):
    # Header objectives: TTFT 150 ms (the first tool-call piece comes at 0.2 s: missed), and a
    # TPOT header that is not a number (ignored and counted; the default 0.1 s judges).
    t = streamed("built_vllm_parallel_tools.txt", RequestObjectives(0.15, None, ("tpot",)))
    got = record(t, latest=latest)

    (by_cache,) = got[sc.METRIC_OWN_TTFT_BY_CACHE]
    assert dict(by_cache.attributes) == {
        **COMMON,
        sc.LLM_SIDECAR_CACHE_CLASS: "most",
    }  # 288 of 312 cached
    assert by_cache.count == 1 and by_cache.sum == pytest.approx(0.2)
    assert tuple(by_cache.explicit_bounds) == sc.BUCKETS_CLIENT_SECONDS

    (first,) = got[sc.METRIC_OWN_TIME_TO_FIRST_TOOL_CALL]
    assert dict(first.attributes) == COMMON
    assert first.count == 1 and first.sum == pytest.approx(0.2)
    # Two parallel calls, events 2..5 and 6..9 of the fixture: two observations of 0.3 s.
    (assembly,) = got[sc.METRIC_OWN_TOOL_CALL_ASSEMBLY]
    assert assembly.count == 2 and assembly.sum == pytest.approx(0.6)
    assert (assembly.min, assembly.max) == (pytest.approx(0.3), pytest.approx(0.3))
    (calls,) = got[sc.METRIC_OWN_TOOL_CALLS]
    assert calls.count == 1 and calls.sum == 2
    assert tuple(calls.explicit_bounds) == TOOL_CALL_COUNT_BUCKETS

    verdicts = {
        (
            p.attributes[sc.LLM_SIDECAR_OBJECTIVE_NAME],
            p.attributes[sc.LLM_SIDECAR_OBJECTIVE_RESULT],
        ): p.value
        for p in got[sc.METRIC_OWN_REQUEST_OBJECTIVES]
    }
    assert verdicts == {("ttft", "missed"): 1, ("tpot", "met"): 1, ("all", "missed"): 1}
    (invalid,) = got[sc.METRIC_OWN_REQUEST_OBJECTIVE_INVALID]
    assert (
        dict(invalid.attributes) == {**COMMON, sc.LLM_SIDECAR_OBJECTIVE_NAME: "tpot"}
        and invalid.value == 1
    )


def test_the_same_figures_as_the_prometheus_families():
    t = streamed("built_vllm_parallel_tools.txt")
    got = record(t, latest=False)
    registry = CollectorRegistry()
    SidecarMetrics(registry).record(summarize(t, "m", DEFAULTS))
    per_model = {"model": "m"}  # the distributions and the objectives are per model
    prom = registry.get_sample_value
    assert got[sc.METRIC_OWN_TTFT_BY_CACHE][0].sum == pytest.approx(
        prom("llm_time_to_first_token_by_cache_seconds_sum", {**per_model, "cache": "most"})
    )
    assert got[sc.METRIC_OWN_TIME_TO_FIRST_TOOL_CALL][0].sum == pytest.approx(
        prom("llm_time_to_first_tool_call_seconds_sum", per_model)
    )
    assert got[sc.METRIC_OWN_TOOL_CALL_ASSEMBLY][0].count == prom(
        "llm_tool_call_assembly_seconds_count", per_model
    )
    assert got[sc.METRIC_OWN_TOOL_CALLS][0].sum == prom(
        "llm_tool_calls_per_response_sum", per_model
    )
    for p in got[sc.METRIC_OWN_REQUEST_OBJECTIVES]:
        name, result = (
            p.attributes[sc.LLM_SIDECAR_OBJECTIVE_NAME],
            p.attributes[sc.LLM_SIDECAR_OBJECTIVE_RESULT],
        )
        assert p.value == prom(  # per model: the Prometheus family has no route
            "llm_request_objectives_total", {**per_model, "objective": name, "result": result}
        )


def test_a_text_answer_without_cached_count_records_no_tool_call_and_cache_unknown():
    t = streamed("vllm032_chat_include_usage.txt")
    got = record(t, latest=False)
    (by_cache,) = got[sc.METRIC_OWN_TTFT_BY_CACHE]
    assert (
        by_cache.attributes[sc.LLM_SIDECAR_CACHE_CLASS] == "unknown"
    )  # no cached count: never a miss
    for name in (
        sc.METRIC_OWN_TIME_TO_FIRST_TOOL_CALL,
        sc.METRIC_OWN_TOOL_CALL_ASSEMBLY,
        sc.METRIC_OWN_TOOL_CALLS,
    ):
        assert name not in got
    assert sc.METRIC_OWN_REQUEST_OBJECTIVE_INVALID not in got


def test_own_names_stay_in_the_own_namespace_and_apart_from_span_attributes():
    own = [v for k, v in vars(sc).items() if k.startswith("METRIC_OWN_")]
    assert len(own) == 7
    attributes = {v for k, v in vars(sc).items() if k.startswith(("LLM_SIDECAR_", "GEN_AI_"))}
    assert all(name.startswith("llm_sidecar.client.") and name not in attributes for name in own)
