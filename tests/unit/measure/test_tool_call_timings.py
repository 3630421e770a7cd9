"""Time to first tool call and tool-call assembly, from each dialect's recorded tool-call
streams (tests/fixtures/streams), and the Prometheus families and span attributes they feed.

Each stream is fed one event per read, event i arriving at second i, and the expected times
are worked out from the JSON itself, independently of the dialects
(``tests/support/tool_calls.py``): the event that opens each call (an OpenAI delta with the
call's id/name, an Anthropic ``tool_use`` block start, a Responses ``function_call`` item)
and the last event carrying a piece of its arguments.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.base.outcomes import Outcome
from sidecar.export.metrics import SidecarMetrics
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import MAX_TOOL_CALLS, RequestTimeline
from sidecar.streams.protocols.anthropic import AnthropicStreamDialect
from sidecar.streams.protocols.events import TokenKind, Tokens, ToolCallDelta
from sidecar.streams.protocols.ollama import OllamaStreamDialect
from sidecar.streams.protocols.openai import OpenAIStreamDialect
from sidecar.streams.protocols.responses import ResponsesStreamDialect
from tests.fixtures.streams.harness import events_of, load
from tests.support.tool_calls import expected_times

STREAMS = [
    ("openai", "built_vllm_tools.txt", OpenAIStreamDialect, 1),
    ("openai", "built_vllm_parallel_tools.txt", OpenAIStreamDialect, 2),
    ("anthropic", "tool_use.txt", AnthropicStreamDialect, 1),
    ("anthropic", "parallel_tool_use.txt", AnthropicStreamDialect, 2),
    ("responses", "reasoning_tool.txt", ResponsesStreamDialect, 1),
    ("responses", "parallel_function_calls.txt", ResponsesStreamDialect, 2),
    ("ollama", "chat_tool_calls.ndjson", OllamaStreamDialect, 1),
    ("ollama", "chat_parallel_tool_calls.ndjson", OllamaStreamDialect, 2),
]
START = 100.0


def timeline_of(folder: str, name: str, make) -> tuple[RequestTimeline, list[bytes]]:
    events = events_of(load(folder, name), ndjson=name.endswith(".ndjson"))
    t = RequestTimeline(START, "POST", "/v1/chat/completions", "m")
    t.response_started(START, 200, streamed=True)
    d = make()
    for i, chunk in enumerate(events):
        t.events(d.feed(chunk), START + i)
    t.events(d.close(), START + len(events))
    t.finish(Outcome.OK, START + len(events))
    return t, events


@pytest.mark.parametrize(
    ("folder", "name", "make", "calls"), STREAMS, ids=[f"{f}/{n}" for f, n, _, _ in STREAMS]
)
def test_first_tool_call_and_assembly_per_call(folder, name, make, calls):
    t, events = timeline_of(folder, name, make)
    want = expected_times(folder, events)
    assert len(want) == calls  # the oracle read the fixture as intended
    assert t.tool_call_count == calls
    assert t.time_to_first_tool_call == min(first for first, _ in want.values())
    assert sorted(t.tool_call_assembly()) == sorted(
        float(last - first) for first, last in want.values()
    )
    if folder != "ollama":  # Ollama sends each call whole: assembly 0
        assert all(a > 0 for a in t.tool_call_assembly())


def recorded(name: str) -> CollectorRegistry:
    """A fresh registry after recording the OpenAI fixture ``name`` as model ``m``."""
    registry = CollectorRegistry()
    t, _ = timeline_of("openai", name, OpenAIStreamDialect)
    SidecarMetrics(registry).record(summarize(t, "m"))
    return registry


LABELS = {"model": "m"}  # the distributions are per model


def test_parallel_calls_give_one_assembly_observation_each():
    registry, labels = recorded("built_vllm_parallel_tools.txt"), LABELS
    assert registry.get_sample_value("llm_tool_call_assembly_seconds_count", labels) == 2
    # Call 0: events 1..4; call 1: events 5..8 (one second apart each).
    assert registry.get_sample_value("llm_tool_call_assembly_seconds_sum", labels) == 6.0
    assert registry.get_sample_value("llm_time_to_first_tool_call_seconds_sum", labels) == 1.0
    assert registry.get_sample_value("llm_tool_calls_per_response_count", labels) == 1
    assert registry.get_sample_value("llm_tool_calls_per_response_sum", labels) == 2
    assert (
        registry.get_sample_value("llm_tool_calls_per_response_bucket", {**labels, "le": "1.0"})
        == 0
    )


def test_a_text_answer_observes_no_tool_call():
    registry, labels = recorded("vllm032_chat_no_usage.txt"), LABELS
    assert registry.get_sample_value("llm_time_to_first_tool_call_seconds_count", labels) is None
    assert registry.get_sample_value("llm_tool_calls_per_response_count", labels) is None


def test_server_run_tools_are_no_client_call():
    """Anthropic's web search (server_tool_use) streams input_json_delta too: tool tokens,
    but nothing the client waits on."""
    t, _ = timeline_of("anthropic", "web_search_cache.txt", AnthropicStreamDialect)
    assert t.stream_tokens > 0 and t.first_tool_call is None and t.tool_call_count == 0


def test_a_stream_cannot_grow_the_record_past_the_bound():
    t = RequestTimeline(0.0)
    for i in range(MAX_TOOL_CALLS * 3):
        t.events([ToolCallDelta(i)], float(i))
    assert t.tool_call_count == MAX_TOOL_CALLS
    assert t.first_tool_call == 0.0


def test_calls_of_two_choices_are_two_calls():
    t = RequestTimeline(0.0)
    t.events([ToolCallDelta(0, 0), ToolCallDelta(0, 1)], 1.0)
    t.events([ToolCallDelta(0, 1)], 3.0)
    assert t.tool_call_count == 2
    assert sorted(t.tool_call_assembly()) == [0.0, 2.0]


def test_a_tool_arguments_template_arms_and_keeps_the_call_index():
    """A long argument stream: the repeating piece is recognised from its bytes (no lane:
    two events, the tool token and its call's piece), and reads as the decoding oracle."""
    head = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"'
    tail = b'"}}]},"finish_reason":null}]}\n\n'
    chunks = [head + b"p%d" % i + tail for i in range(30)]
    fast, oracle = OpenAIStreamDialect(), OpenAIStreamDialect()
    oracle._learning = 0
    assert fast.feed(chunks[0]) == oracle.feed(chunks[0])  # the first also says the id
    for chunk in chunks[1:]:
        assert fast.feed(chunk) == oracle.feed(chunk) == [Tokens(TokenKind.TOOL), ToolCallDelta(1)]
    assert fast._memo is not None and fast._memo.events == (
        Tokens(TokenKind.TOOL),
        ToolCallDelta(1),
    )
