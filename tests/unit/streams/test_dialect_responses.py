"""OpenAI Responses API dialect over real wire bytes.

Fixtures (tests/fixtures/streams/responses/, sources in ../SOURCES.md): ``text.txt``,
``reasoning_tool.txt``, ``incomplete.txt`` and ``response.json`` follow, key for key and in
order, a stream recorded from api.openai.com (coder/aibridge
fixtures/openai/responses/streaming/simple.txtar: compact JSON, ``type`` first,
``sequence_number``, ``obfuscation``, the whole Response in created/in_progress/completed)
and the event shapes of the streaming events reference
(https://platform.openai.com/docs/api-reference/responses-streaming);
``failed.txt`` and ``error.txt`` the failure shapes of coder/aibridge's
stream_failure.txtar and stream_error.txtar; ``llamacpp_reasoning.txt`` what llama.cpp's
``/v1/responses`` writes (tools/server/server-task.cpp ``to_json_oaicompat_resp*``: no
``sequence_number``, ``response.reasoning_text.delta``, no model until completion).

Every fixture, whole and split every way: tests/unit/streams/test_dialect_conformance.py.
"""

from __future__ import annotations

import orjson
import pytest

from sidecar.streams.protocols.events import (
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    ToolCallDelta,
    Usage,
)
from sidecar.streams.protocols.responses import (
    ResponsesStreamDialect,
    parse_responses_response,
    usage_from_responses,
)
from tests.fixtures.streams.expected import ANSWER, REASONING, TOOL
from tests.fixtures.streams.harness import load, run_whole
from tests.support.sse import sse

make = ResponsesStreamDialect


# -- individual rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,expected",
    [
        ("response.output_text.delta", [ANSWER]),
        ("response.refusal.delta", [ANSWER]),
        ("response.reasoning_text.delta", [REASONING]),
        ("response.reasoning_summary_text.delta", [REASONING]),
        (
            "response.function_call_arguments.delta",
            [TOOL, ToolCallDelta(0)],
        ),  # a piece of a client call
        ("response.custom_tool_call_input.delta", [TOOL, ToolCallDelta(0)]),
        (
            "response.mcp_call_arguments.delta",
            [TOOL],
        ),  # the server runs it: no call of the client's
        ("response.code_interpreter_call_code.delta", [TOOL]),
        ("response.output_text.done", []),
        ("response.output_text.annotation.added", []),
        ("response.audio.transcript.delta", []),
        ("response.some_future_event.delta", []),
    ],
)
def test_delta_kinds(kind, expected):
    body = orjson.dumps(
        {"type": kind, "item_id": "i", "output_index": 0, "delta": "x", "sequence_number": 5}
    )
    assert run_whole(make, sse(body, kind)) == expected


@pytest.mark.parametrize("delta", [b'""', b"null", b"7", b'["x"]', b'{"x":1}'])
def test_empty_or_non_string_delta_is_not_a_token(delta):
    body = b'{"type":"response.output_text.delta","delta":' + delta + b"}"
    assert run_whole(make, sse(body)) == []


def test_event_name_is_the_fallback_when_data_has_no_type():
    assert run_whole(make, sse(b'{"delta":"x"}', "response.output_text.delta")) == [ANSWER]


def test_data_type_wins_over_event_name():
    assert run_whole(
        make, sse(b'{"type":"response.output_text.delta","delta":"x"}', "response.created")
    ) == [ANSWER]


def test_info_once_per_field_and_later_model_is_reported():
    raw = (
        sse(b'{"type":"response.created","response":{"id":"r1"}}')
        + sse(b'{"type":"response.in_progress","response":{"id":"r2","model":"m1"}}')
        + sse(b'{"type":"response.queued","response":{"id":"r3","model":"m2"}}')
    )
    assert run_whole(make, raw) == [
        ResponseInfo(response_id="r1"),
        ResponseInfo(response_model="m1"),
    ]


def test_done_sentinel_is_tolerated():
    raw = (
        sse(b'{"type":"response.completed","response":{"status":"completed"}}')
        + b"data: [DONE]\n\n"
    )
    assert run_whole(make, raw) == [
        ResponseInfo(finish_reasons=("completed",)),
        StreamEnd(),
        StreamEnd(),
    ]


@pytest.mark.parametrize(
    "details,reason",
    [
        (b'{"reason":"content_filter"}', "content_filter"),
        (b"null", "incomplete"),
        (b'{"reason":""}', "incomplete"),
        (b'{"reason":3}', "incomplete"),
    ],
)
def test_incomplete_reasons(details, reason):
    raw = sse(
        b'{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":'
        + details
        + b"}}"
    )
    assert run_whole(make, raw) == [ResponseInfo(finish_reasons=(reason,)), StreamEnd()]


@pytest.mark.parametrize(
    "body,expected",
    [
        (
            b'{"type":"error","error":{"type":"invalid_request_error","code":"context_length_exceeded","message":"Too long."},"sequence_number":2}',
            StreamError("Too long.", "invalid_request_error", "context_length_exceeded"),
        ),
        (b'{"type":"error","code":500,"message":"boom"}', StreamError("boom", None, 500)),
        (b'{"type":"error","code":true,"message":"x"}', StreamError("x")),
        (b'{"type":"error"}', StreamError("")),
    ],
)
def test_error_event_shapes(body, expected):
    assert run_whole(make, sse(body, "error")) == [expected]


@pytest.mark.parametrize(
    "response", [b"null", b'"x"', b"{}", b'{"error":null}', b'{"error":"text"}']
)
def test_failed_without_a_usable_error(response):
    raw = sse(b'{"type":"response.failed","response":' + response + b"}")
    assert run_whole(make, raw) == [StreamError("response failed"), StreamEnd()]


def test_terminal_without_response_object():
    raw = sse(b'{"type":"response.completed"}')
    assert run_whole(make, raw) == [ResponseInfo(finish_reasons=("completed",)), StreamEnd()]


def test_bad_data_is_a_parse_error_and_the_stream_goes_on():
    raw = sse(b"{oops") + sse(b'"str"') + sse(b'{"type":"response.output_text.delta","delta":"a"}')
    assert run_whole(make, raw) == [
        ParseError("data is not JSON"),
        ParseError("data is not a JSON object"),
        ANSWER,
    ]


# -- usage and non-streaming --------------------------------------------------------------


def test_usage_from_responses():
    assert usage_from_responses(
        {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 64},
            "output_tokens": 50,
            "output_tokens_details": {"reasoning_tokens": 30},
            "total_tokens": 150,
        }
    ) == Usage(input_tokens=100, output_tokens=50, reasoning_tokens=30, cached_input_tokens=64)
    assert (
        usage_from_responses(
            {"input_tokens": 1.0, "input_tokens_details": [], "output_tokens_details": None}
        )
        == Usage()
    )
    assert usage_from_responses(None) is None


def test_parse_response_object():
    assert parse_responses_response(load("responses", "response.json")) == [
        ResponseInfo(
            response_model="gpt-4o-mini-2024-07-18",
            response_id="resp_68f1c2a9d4e8819b8a3c6f0d2e7b5a410c9e3d7f2a1b4c68",
            finish_reasons=("completed",),
        ),
        Usage(input_tokens=14, output_tokens=8, reasoning_tokens=0, cached_input_tokens=0),
    ]


def test_parse_error_body():
    assert parse_responses_response(load("responses", "error.json")) == [
        StreamError(
            "The model `gpt-9` does not exist or you do not have access to it.",
            "invalid_request_error",
            "model_not_found",
        )
    ]


def test_parse_failed_and_incomplete_response_objects():
    failed = b'{"id":"r","object":"response","status":"failed","error":{"code":"server_error","message":"x"},"usage":null}'
    assert parse_responses_response(failed) == [
        ResponseInfo(response_id="r"),
        StreamError("x", None, "server_error"),
    ]
    incomplete = b'{"id":"r","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}'
    assert parse_responses_response(incomplete) == [
        ResponseInfo(response_id="r", finish_reasons=("max_output_tokens",))
    ]


@pytest.mark.parametrize(
    "body,expected",
    [
        (b"", [ParseError("response is not JSON")]),
        (b"[1]", [ParseError("response is not a JSON object")]),
        (b"{}", [ResponseInfo()]),
        (b'{"error":"plain"}', [StreamError("plain")]),
    ],
)
def test_parse_odd_bodies(body, expected):
    assert parse_responses_response(body) == expected
