"""The cached-token shapes of each API, read by the real SDKs' own types and by the dialects:
the same counts, and so the same prefix-cache class (sidecar/measure/cache_class.py).

- OpenAI chat: a real vLLM 0.32 stream with ``--enable-prefix-caching
  --enable-prompt-tokens-details`` (``usage.prompt_tokens_details.cached_tokens`` 384 of 470),
  parsed chunk by chunk as ``openai.types.chat.ChatCompletionChunk``;
- Responses: ``response.completed``'s ``usage.input_tokens_details.cached_tokens``, built
  as the installed SDK's ``ResponseUsage`` (the older fixtures lack fields it now requires,
  such as ``cache_write_tokens``; the dialect reads both);
- Anthropic: ``message_start``'s ``cache_read_input_tokens`` (Anthropic's ``input_tokens``
  leaves the cache out), built as ``anthropic.types.Usage`` / ``MessageDeltaUsage``.
"""

from __future__ import annotations

import json

import pytest

from sidecar.measure.cache_class import cache_class
from sidecar.streams.protocols.anthropic import AnthropicStreamDialect
from sidecar.streams.protocols.events import Usage
from sidecar.streams.protocols.openai import OpenAIStreamDialect
from sidecar.streams.protocols.responses import ResponsesStreamDialect
from tests.fixtures.streams.harness import load, run_whole

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


def _datas(raw: bytes) -> list[dict]:
    out = []
    for event in raw.split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip().startswith(b"{"):
                out.append(json.loads(line[5:]))
    return out


def _last_usage(events: list) -> Usage:
    return [e for e in events if type(e) is Usage][-1]


def test_vllm_recording_through_the_openai_sdk():
    raw = load("openai", "vllm032_chat_prefix_cached.txt")
    from openai.types.chat import ChatCompletionChunk

    chunks = [ChatCompletionChunk.model_validate(d) for d in _datas(raw)]
    usage = chunks[-1].usage
    sdk = (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens)
    ours = _last_usage(run_whole(OpenAIStreamDialect, raw))
    assert sdk == (ours.input_tokens, ours.cached_input_tokens) == (470, 384)
    assert cache_class(*sdk).value == "most"


@pytest.mark.parametrize(
    ("prompt", "cached", "cls"), [(1290, 1152, "most"), (14, 0, "none"), (2310, 400, "partial")]
)
def test_responses_usage_built_by_the_openai_sdk(prompt, cached, cls):
    """The SDK's own ResponseUsage (as the installed SDK types it), in a response.completed
    event: the dialect reads the prompt and cached counts the SDK holds."""
    from openai.types.responses import ResponseUsage
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

    usage = ResponseUsage(
        input_tokens=prompt,
        input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=0),
        output_tokens=9,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=prompt + 9,
    )
    event = {
        "type": "response.completed",
        "response": {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "usage": usage.model_dump(mode="json"),
        },
        "sequence_number": 3,
    }
    raw = b"event: response.completed\ndata: " + json.dumps(event).encode() + b"\n\n"
    ours = _last_usage(run_whole(ResponsesStreamDialect, raw))
    assert (ours.input_tokens, ours.cached_input_tokens) == (
        usage.input_tokens,
        usage.input_tokens_details.cached_tokens,
    )
    assert cache_class(ours.input_tokens, ours.cached_input_tokens).value == cls


def test_responses_tool_call_fixture_events_are_the_sdks_types():
    """The parallel-call fixture's tool-call events validate as the SDK's typed events."""
    from openai.types.responses import (
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseOutputItemAddedEvent,
    )

    datas = _datas(load("responses", "parallel_function_calls.txt"))
    deltas = [
        ResponseFunctionCallArgumentsDeltaEvent.model_validate(d)
        for d in datas
        if d["type"] == "response.function_call_arguments.delta"
    ]
    added = [
        ResponseOutputItemAddedEvent.model_validate(d)
        for d in datas
        if d["type"] == "response.output_item.added"
    ]
    assert [d.output_index for d in deltas] == [0] * 5 + [1] * 2
    assert [a.item.type for a in added] == ["function_call", "function_call"]


@pytest.mark.parametrize(
    ("base", "created", "read", "cls"),
    [
        (27, 0, 1536, "most"),
        (10682, 0, 2048, "partial"),
        (40, 900, 0, "none"),
        (12, None, None, "unknown"),
    ],
)
def test_anthropic_usage_built_by_the_anthropic_sdk(base, created, read, cls):
    """The SDK's own Usage in message_start and MessageDeltaUsage in message_delta:
    every prompt token is input + cache creation + cache read, cached the cache read."""
    from anthropic.types import MessageDeltaUsage, Usage as AnthropicUsage

    start = AnthropicUsage(
        input_tokens=base,
        output_tokens=1,
        cache_creation_input_tokens=created,
        cache_read_input_tokens=read,
    )
    delta = MessageDeltaUsage(output_tokens=30)
    raw = b"".join(
        b"event: %s\ndata: %s\n\n" % (name.encode(), json.dumps(obj).encode())
        for name, obj in (
            ("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                               "model": "claude", "content": [], "usage": start.model_dump(mode="json", exclude_none=True)}}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": delta.model_dump(mode="json", exclude_none=True)}),
            ("message_stop", {"type": "message_stop"}),
        )
    )  # fmt: skip
    ours = _last_usage(run_whole(AnthropicStreamDialect, raw))
    prompt = base + (created or 0) + (read or 0)
    assert (ours.input_tokens, ours.cached_input_tokens) == (prompt, read)
    assert cache_class(ours.input_tokens, ours.cached_input_tokens).value == cls
