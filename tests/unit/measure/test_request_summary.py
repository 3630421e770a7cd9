"""A finished request's summary (sidecar/measure/summary.py): the timeline's figures worked
out once, equal to what the timeline itself says, immutable, and the one thing every
recorder of the production wiring is handed."""

from __future__ import annotations

import ast

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from sidecar.app import build_sidecar
from sidecar.base.outcomes import Outcome, Verdict
from sidecar.base.routes import match_route
from sidecar.config import Settings
from sidecar.measure import summary as summary_module
from sidecar.measure.cache_class import cache_class
from sidecar.measure.objectives import ObjectiveDefaults, RequestObjectives
from sidecar.measure.summary import RequestSummary, summarize
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.events import (
    EngineTimings,
    TokenKind,
    Tokens,
    ToolCallDelta,
    Usage,
)
from tests.fixtures.streams.harness import load
from tests.support.paths import ROOT
from tests.support.timelines import ROUTE, streamed

PACKAGE = ROOT / "sidecar"


def grouped() -> RequestTimeline:
    """Tokens that arrived several to an event, the first event too, then engine counts only."""
    t = RequestTimeline(10.0, "POST", ROUTE, "m")
    t.response_started(10.05, 200, streamed=True)
    t.events([Tokens(TokenKind.REASONING, 3)], 10.2)
    t.events([Tokens(TokenKind.ANSWER)], 10.3)
    t.events([Tokens(TokenKind.ANSWER, 4)], 10.5)
    t.events([Usage(input_tokens=40, output_tokens=9, engine=True)], 10.5)
    t.events([EngineTimings(prefill_seconds=0.1, decode_seconds=0.3)], 10.5)
    t.body_received, t.upstream_sent, t.client_head_sent = 10.001, 10.002, 10.051
    t.finish(Verdict.OK, 10.6)
    return t


def tool_calls() -> RequestTimeline:
    t = RequestTimeline(0.0, "POST", ROUTE, "m")
    t.request_stream = True
    t.response_started(0.01, 200, streamed=True)
    t.events([ToolCallDelta(0), Tokens(TokenKind.TOOL)], 0.2)
    t.events([ToolCallDelta(1)], 0.3)
    t.events([ToolCallDelta(0)], 0.5)
    t.finish(Outcome.CANCELLED, 0.7, "client_disconnected")
    return t


def not_streamed() -> RequestTimeline:
    t = RequestTimeline(0.0, "POST", ROUTE, "m")
    t.response_started(0.3, 429, streamed=False)
    t.finish(Outcome.OK, 0.31)
    return t


def no_answer() -> RequestTimeline:
    t = RequestTimeline(0.0, "POST", ROUTE, "m")
    t.request_stream = True
    t.finish(Verdict.UPSTREAM_UNREACHABLE, 0.05)
    return t


TIMELINES = {
    "usage": lambda: streamed(
        [100.2, 100.25, 100.3, 100.4],
        usage=Usage(input_tokens=10, output_tokens=4, cached_input_tokens=3),
    ),
    "reasoning-first": lambda: streamed(
        [100.2, 100.3, 100.35], kinds=[TokenKind.REASONING, TokenKind.REASONING, TokenKind.ANSWER]
    ),
    "grouped-engine-counts": grouped,
    "tool-calls-cancelled": tool_calls,
    "not-streamed-429": not_streamed,
    "never-answered": no_answer,
}


@pytest.mark.parametrize("make", TIMELINES.values(), ids=TIMELINES.keys())
def test_every_figure_equals_the_timelines_own(make):
    t = make()
    s = summarize(t, "label", ObjectiveDefaults(2.0, 0.1))
    for name in (
        "e2e", "ttfb", "ttft", "ttfat", "tpot", "tokens_per_second", "request_overhead",
        "response_overhead", "input_tokens", "output_tokens", "reasoning_tokens",
        "cached_input_tokens", "token_count_source", "tokens_from_usage", "gap_count",
        "time_to_first_tool_call", "tool_call_count", "streamed", "status", "outcome",
        "first_token", "first_answer_token", "first_token_kind", "end", "start", "method",
        "route", "model", "request_stream", "parse_errors", "engine", "finish_reasons",
    ):  # fmt: skip
        assert getattr(s, name) == getattr(t, name), name
    assert list(s.gap_runs) == t.gap_runs()
    assert list(s.chunk_gaps) == t.chunk_gaps()
    assert list(s.gaps) == list(t.gaps) and list(s.gap_streams) == list(t.gap_streams)
    assert list(s.tool_call_assembly) == t.tool_call_assembly()
    assert s.verdict is t.verdict and s.model_label == "label"
    assert s.error_type == (t.error_type or "none") and s.code == t.verdict.code(t.status)
    assert s.served == (t.outcome is Outcome.OK and 200 <= (t.status or 0) < 300)
    expected_cache = (
        cache_class(t.input_tokens, t.cached_input_tokens)
        if t.streamed and t.ttft is not None
        else None
    )
    assert s.cache is expected_cache


def test_the_objectives_are_judged_from_the_same_figures():
    t = streamed([100.2, 100.25, 100.3, 100.4], usage=Usage(input_tokens=10, output_tokens=4))
    t.objectives = RequestObjectives(0.1, None, ("tpot",))
    s = summarize(t, "m", ObjectiveDefaults(2.0, 0.06))
    j = s.judgement
    assert (j.ttft_objective, j.ttft_from_header, j.ttft_met) == (0.1, True, False)
    assert (j.tpot_objective, j.tpot_from_header, j.tpot_met) == (0.06, False, False)
    assert j.verdicts() == (("ttft", False), ("tpot", False), ("all", False))
    assert s.objectives_invalid == ("tpot",)
    assert summarize(not_streamed(), "m", ObjectiveDefaults(2.0, 0.06)).judgement is None


def test_a_summary_is_immutable_and_needs_a_finished_request():
    s = summarize(grouped(), "m")
    with pytest.raises(AttributeError):
        s.ttft = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        summarize(RequestTimeline(0.0), "m")


def test_judge_and_cache_class_run_once_whatever_reads_the_request(monkeypatch):
    """The production wiring with every recorder on (span, OTel metrics, Prometheus, capacity,
    access log): one streamed request's end judges its objectives once and classes its cache
    once, and every recorder is handed the same summary."""
    calls = {"judge": 0, "cache_class": 0}
    for name in calls:
        real = getattr(summary_module, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(summary_module, name, counted)
    spans = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(spans))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    sidecar = build_sidecar(
        Settings(upstream="http://127.0.0.1:9", slo_ttft_seconds=2.0),
        CollectorRegistry(),
        access_log=True,
        tracer_provider=tracer,
        meter_provider=meters,
    )
    records = sidecar.proxy.records
    handed: list[RequestSummary] = []
    records._recorders = (*records._recorders, handed.append)
    route, _ = match_route(ROUTE)
    headers = CIMultiDictProxy(CIMultiDict({"x-slo-tpot-ms": "50"}))
    record = records.open(0.0, "POST", route, "m", None, headers)
    observer = records.observe(record, route, 200, [("content-type", "text/event-stream")])
    for i, chunk in enumerate(load("openai", "built_vllm_chat.txt").split(b"\n\n")):
        observer.feed(chunk + b"\n\n", 0.1 * (i + 1))
    observer.close(5.0)
    records.close(record, Verdict.OK)
    assert calls == {"judge": 1, "cache_class": 1}
    (summary,) = handed
    assert summary.judgement is not None and summary.cache is not None
    (span,) = spans.get_finished_spans()
    assert span.attributes["llm_sidecar.cache.class"] == summary.cache.value
    meters.shutdown()


def test_no_exporter_reads_a_finished_timeline():
    """The exporters' recorders take the summary: only the span's start (a request in flight)
    still sees a timeline, and nothing under sidecar/export calls judge() or cache_class()."""
    readers, judging = set(), set()
    for path in sorted((PACKAGE / "export").glob("*.py")):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                  for a in n.names}  # fmt: skip
        if "RequestTimeline" in names:
            readers.add(path.name)
        if names & {"judge", "cache_class"}:
            judging.add(path.name)
    assert readers == {"spans.py"} and not judging
