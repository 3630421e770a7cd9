"""The simulator's tool calls (``x-sim-tool-calls``) and cached prompt tokens
(``x-sim-cached-tokens``), checked against the recordings in tests/fixtures/streams and read
back by the sidecar's own dialects.

Shape: every JSON value's scalars masked to their type, key order kept, a run of same-shaped
events collapsed to one (the fixtures and the simulator stream different numbers of argument
pieces), as tests/unit/tools/sim/test_simulate_real_shape.py compares the vLLM routes. Per dialect,
what is compared and what is left out on purpose:

- OpenAI chat: each chunk's ``delta`` and ``finish_reason`` against
  ``openai/built_vllm_parallel_tools.txt`` (the envelope is vLLM 0.32's, already checked
  against real recordings: ``token_ids``, ``prompt_token_ids``); the usage chunk against the
  real vLLM 0.32 prefix-cached recording ``openai/vllm032_chat_prefix_cached.txt``.
- Anthropic: every event of ``anthropic/parallel_tool_use.txt``, whole.
- Responses: the events from the first ``output_item.added`` on, and the completed
  response's ``output`` and ``usage``, against ``responses/parallel_function_calls.txt``
  (the response envelope follows the newer ``text.txt`` layout; no ``obfuscation``, as with
  ``include_obfuscation: false``).
- Ollama chat: the tool-call line of ``ollama/chat_parallel_tool_calls.ndjson``, whole but
  for the arguments' keys (the tool's own parameters); the final line is the one of every
  simulated Ollama chat, checked by tests/unit/tools/sim/test_simulate_dialects.py.

Then the timeline oracle of tests/unit/measure/test_tool_call_timings.py (worked out from the JSON,
independently of the dialects) must agree with what the sidecar's dialect reads from the
simulator's stream: one call per requested call, each call's first and last piece.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.base.outcomes import Outcome
from sidecar.measure.cache_class import CacheClass, cache_class
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.anthropic import AnthropicStreamDialect
from sidecar.streams.protocols.ollama import OllamaStreamDialect
from sidecar.streams.protocols.openai import OpenAIStreamDialect
from sidecar.streams.protocols.responses import ResponsesStreamDialect
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.fixtures.streams.harness import events_of, load
from tests.support.tool_calls import expected_times

MODEL = "sim-model"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris, and the time there?"}]
EXACT = {"x-sim-ttft": "0.002", "x-sim-tpot": "0.001"}

DIALECTS = {
    "openai": ("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "stream": True,
                                        "stream_options": {"include_usage": True}}, OpenAIStreamDialect),
    "anthropic": ("/v1/messages", {"model": MODEL, "max_tokens": 200, "messages": MESSAGES, "stream": True},
                  AnthropicStreamDialect),
    "responses": ("/v1/responses", {"model": MODEL, "input": MESSAGES, "stream": True}, ResponsesStreamDialect),
    "ollama": ("/api/chat", {"model": MODEL, "messages": MESSAGES}, OllamaStreamDialect),
}  # fmt: skip
FIXTURES = {
    "openai": "built_vllm_parallel_tools.txt",
    "anthropic": "parallel_tool_use.txt",
    "responses": "parallel_function_calls.txt",
    "ollama": "chat_parallel_tool_calls.ndjson",
}


def shape(value: Any) -> Any:
    """A JSON value with every scalar replaced by its type; key order kept; no ``obfuscation``;
    an arguments object (Ollama's) is one value: its keys are the tool's own parameters."""
    if isinstance(value, dict):
        return tuple(  # a tuple: an empty object is not an empty list
            (k, "object" if k == "arguments" and isinstance(v, dict) else shape(v))
            for k, v in value.items()
            if k != "obfuscation"
        )
    if isinstance(value, list):
        return [shape(v) for v in value]
    if value is None or isinstance(value, bool):
        return value if value is None else "bool"
    return "number" if isinstance(value, int | float) else type(value).__name__


def collapsed(items: list) -> list:
    out: list = []
    for item in items:
        if not out or out[-1] != item:
            out.append(item)
    return out


def objects(folder: str, raw: bytes) -> list[dict]:
    """The JSON objects of a stream, each SSE ``event:`` name checked against its ``type``."""
    out = []
    for event in events_of(raw, ndjson=folder == "ollama"):
        if folder == "ollama":
            out.append(json.loads(event))
            continue
        lines = event.decode().splitlines()
        data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        obj = json.loads(data)
        names = [line[6:].strip() for line in lines if line.startswith("event:")]
        if names:
            assert names == [obj["type"]], event
        out.append(obj)
    return out


def compared(folder: str, raw: bytes) -> list:
    """What of a stream's shape is compared with the recording (see the module doc)."""
    objs = objects(folder, raw)
    if folder == "openai":
        return collapsed([
            (shape(c["delta"]), c["finish_reason"]) for o in objs for c in o["choices"]
        ])  # fmt: skip
    if folder == "responses":
        start = next(i for i, o in enumerate(objs) if o["type"] == "response.output_item.added")
        done = objs[-1]
        assert done["type"] == "response.completed"
        tail = [shape(done["response"]["output"]), shape(done["response"]["usage"])]
        return collapsed([shape(o) for o in objs[start:-1]]) + tail
    if folder == "ollama":
        return [shape(o) for o in objs if "tool_calls" in o.get("message", {})]
    return collapsed([shape(o) for o in objs])


async def stream(aiohttp_client, folder: str, headers: dict[str, str]) -> bytes:
    path, body, _ = DIALECTS[folder]
    config = SimulatorConfig(model=MODEL, jitter=0.0, seed=3)
    client = await aiohttp_client(build_simulator_app(config))
    resp = await client.post(path, json=body, headers={**EXACT, **headers})
    raw = await resp.read()
    assert resp.status == 200, raw
    return raw


@pytest.mark.parametrize("folder", list(DIALECTS))
async def test_tool_call_streams_have_the_recordings_shape(aiohttp_client, folder):
    raw = await stream(
        aiohttp_client,
        folder,
        {"x-sim-tool-calls": "2", "x-sim-tokens": "9", "x-sim-cached-tokens": "8"},
    )
    assert compared(folder, raw) == compared(folder, load(folder, FIXTURES[folder]))


async def test_the_shape_comparison_sees_a_changed_tool_call(aiohttp_client):
    """Not vacuous: a call without its id, or a wrong finish reason, is another shape."""
    recorded = load("openai", FIXTURES["openai"])
    assert compared(
        "openai", recorded.replace(b'"id":"chatcmpl-tool-', b'"xid":"chatcmpl-tool-')
    ) != compared("openai", recorded)
    assert compared("openai", recorded.replace(b'"tool_calls","stop', b'"stop","stop')) != compared(
        "openai", recorded
    )
    anthropic = load("anthropic", FIXTURES["anthropic"])
    assert compared("anthropic", anthropic.replace(b'"input":{}', b'"input":[]')) != compared(
        "anthropic", anthropic
    )


async def test_the_usage_chunk_has_real_vllms_cached_shape(aiohttp_client):
    """The usage with ``x-sim-cached-tokens`` is shaped as real vLLM 0.32's with
    ``--enable-prompt-tokens-details`` (prompt_tokens_details after the counts)."""
    raw = await stream(aiohttp_client, "openai", {"x-sim-tokens": "3", "x-sim-cached-tokens": "8"})
    (usage,) = [o for o in objects("openai", raw) if not o["choices"]]
    (real,) = [
        o
        for o in objects("openai", load("openai", "vllm032_chat_prefix_cached.txt"))
        if not o["choices"]
    ]
    assert shape(usage) == shape(real)
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == 8


@pytest.mark.parametrize("calls", [1, 2, 3])
@pytest.mark.parametrize("folder", list(DIALECTS))
async def test_the_sidecar_reads_each_call_where_the_oracle_finds_it(aiohttp_client, folder, calls):
    raw = await stream(aiohttp_client, folder, {"x-sim-tool-calls": str(calls), "x-sim-tokens": "10",
                                                 "x-sim-reasoning": "2"})  # fmt: skip
    events = events_of(raw, ndjson=folder == "ollama")
    t = RequestTimeline(0.0, "POST", DIALECTS[folder][0], MODEL)
    t.response_started(0.0, 200, streamed=True)
    d = DIALECTS[folder][2]()
    for i, event in enumerate(events):
        t.events(d.feed(event), float(i))
    t.events(d.close(), float(len(events)))
    t.finish(Outcome.OK, float(len(events)))
    want = expected_times(folder, events)
    assert len(want) == calls == t.tool_call_count
    assert t.time_to_first_tool_call == min(first for first, _ in want.values())
    assert sorted(t.tool_call_assembly()) == sorted(
        float(last - first) for first, last in want.values()
    )
    if folder != "ollama":  # Ollama sends each call whole
        assert all(a > 0 for a in t.tool_call_assembly())
    # Reasoning came first: the first token is not the first tool call (except in Ollama,
    # whose thinking lines come first too).
    assert t.ttft is not None and t.ttft < t.time_to_first_tool_call


@pytest.mark.parametrize(
    ("folder", "reported"), [("openai", 16), ("anthropic", 16), ("responses", 16)]
)
async def test_cached_tokens_reach_the_cache_class(aiohttp_client, folder, reported):
    raw = await stream(
        aiohttp_client, folder, {"x-sim-tokens": "3", "x-sim-cached-tokens": str(reported)}
    )
    d = DIALECTS[folder][2]()
    t = RequestTimeline(0.0, "POST", DIALECTS[folder][0], MODEL)
    t.response_started(0.0, 200, streamed=True)
    t.events(d.feed(raw) + d.close(), 1.0)
    t.finish(Outcome.OK, 1.0)
    assert (
        t.cached_input_tokens == reported
        and t.input_tokens is not None
        and t.input_tokens > reported
    )
    assert cache_class(t.input_tokens, t.cached_input_tokens) is CacheClass.MOST
    none = await stream(aiohttp_client, folder, {"x-sim-tokens": "3", "x-sim-cached-tokens": "0"})
    d = DIALECTS[folder][2]()
    t = RequestTimeline(0.0, "POST", DIALECTS[folder][0], MODEL)
    t.response_started(0.0, 200, streamed=True)
    t.events(d.feed(none) + d.close(), 1.0)
    t.finish(Outcome.OK, 1.0)
    assert cache_class(t.input_tokens, t.cached_input_tokens) is CacheClass.NONE


@pytest.mark.parametrize(
    ("path", "body", "value", "needle"),
    [
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": MESSAGES, "stream": True},
            "-1",
            b"from 0 to 16",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": MESSAGES, "stream": True},
            "17",
            b"from 0 to 16",
        ),
        (
            "/v1/messages",
            {"model": MODEL, "max_tokens": 9, "messages": MESSAGES, "stream": True},
            "two",
            b"from 0 to 16",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": MESSAGES},
            "1",
            b"only streamed answers",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "stream": True},
            "1",
            b"has no tool calls",
        ),
        ("/api/generate", {"model": MODEL, "prompt": "x"}, "1", b"has no tool calls"),
        ("/generate_stream", {"inputs": "x"}, "1", b"has no tool calls"),
    ],
)
async def test_tool_calls_where_the_api_has_none_are_refused(
    aiohttp_client, path, body, value, needle
):
    client = await aiohttp_client(build_simulator_app(SimulatorConfig(model=MODEL)))
    resp = await client.post(path, json=body, headers={**EXACT, "x-sim-tool-calls": value})
    assert resp.status in (400, 422) and needle in await resp.read()


async def test_zero_tool_calls_is_a_text_answer(aiohttp_client):
    raw = await stream(aiohttp_client, "openai", {"x-sim-tool-calls": "0", "x-sim-tokens": "4"})
    assert b"tool_calls" not in raw and b'"finish_reason":"stop"' in raw
