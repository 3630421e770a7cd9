"""Anthropic Messages dialect over the wire format of the Messages streaming docs.

Fixtures (tests/fixtures/streams/anthropic/, sources in ../SOURCES.md) follow, byte for byte
in framing, key order and spacing, the example streams of
https://docs.claude.com/en/docs/build-with-claude/streaming: the "basic streaming request"
(spaced JSON, as the docs print it), the tool-use stream (compact JSON as the API sends it,
with the spaced ``{"type": "ping"}`` the API really sends), the extended-thinking stream
(no usage at all, ``signature_delta``) and the web-search stream (cache counts, a
``server_tool_use`` block, ``"index":1 }``, final input counts in ``message_delta``).

Every fixture, whole and split every way: tests/unit/streams/test_dialect_conformance.py.
"""

from __future__ import annotations

import pytest

from sidecar.streams.protocols.anthropic import (
    AnthropicStreamDialect,
    parse_anthropic_response,
    usage_from_anthropic,
)
from sidecar.streams.protocols.events import (
    GenerationDone,
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    ToolCallDelta,
    Usage,
)
from tests.fixtures.streams.expected import ANSWER, REASONING, TOOL
from tests.fixtures.streams.harness import load, run_whole
from tests.support.sse import sse

MODEL = "claude-sonnet-4-5-20250929"

make = AnthropicStreamDialect


# -- individual rules ---------------------------------------------------------------------


def delta(d: bytes) -> list:
    return run_whole(
        make,
        sse(
            event="content_block_delta",
            data=b'{"type":"content_block_delta","index":0,"delta":' + d + b"}",
        ),
    )


@pytest.mark.parametrize(
    "d,expected",
    [
        (b'{"type":"text_delta","text":"a"}', [ANSWER]),
        (b'{"type":"thinking_delta","thinking":"a"}', [REASONING]),
        (b'{"type":"input_json_delta","partial_json":"{"}', [TOOL]),
        (b'{"type":"text_delta","text":""}', []),
        (b'{"type":"thinking_delta","thinking":""}', []),
        (b'{"type":"input_json_delta","partial_json":""}', []),
        (b'{"type":"signature_delta","signature":"EqQBCgIYAhIM"}', []),
        (b'{"type":"citations_delta","citation":{"type":"char_location","cited_text":"x"}}', []),
        (b'{"type":"some_future_delta","text":"a"}', []),
        (b'{"type":"text_delta","text":7}', []),
        (b'{"type":["text_delta"],"text":"a"}', []),
        (b'{"text":"a"}', []),
        (b'"text_delta"', []),
    ],
)
def test_delta_kinds(d, expected):
    assert delta(d) == expected


def test_ping_and_unknown_events_are_nothing():
    raw = (
        sse(event="ping", data=b'{"type": "ping"}')
        + sse(event="content_block_stop", data=b'{"type":"content_block_stop","index":0}')
        + sse(event="some_future_event", data=b'{"type":"some_future_event","text":"a"}')
        + b": comment\n\n"
    )
    assert run_whole(make, raw) == []


def test_event_name_is_the_fallback_when_data_has_no_type():
    raw = sse(
        event="content_block_delta", data=b'{"index":0,"delta":{"type":"text_delta","text":"a"}}'
    ) + sse(event="message_stop", data=b"{}")
    assert run_whole(make, raw) == [ANSWER, StreamEnd()]


def test_data_type_wins_over_event_name():
    raw = sse(
        event="ping",
        data=b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}',
    )
    assert run_whole(make, raw) == [ANSWER]


def test_non_empty_block_start_is_a_token():
    raw = sse(
        event="content_block_start",
        data=b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"Hi"}}',
    )
    raw += sse(
        event="content_block_start",
        data=b'{"type":"content_block_start","index":1,"content_block":{"type":"thinking","thinking":"hm"}}',
    )
    raw += sse(
        event="content_block_start",
        data=b'{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}',
    )
    assert run_whole(make, raw) == [
        ANSWER,
        REASONING,
        ToolCallDelta(2),
    ]  # a tool_use block opens a call, not a token


def test_provisional_output_count_of_message_start_is_ignored():
    raw = sse(
        event="message_start",
        data=b'{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":5,"output_tokens":1}}}',
    )
    assert run_whole(make, raw) == [
        ResponseInfo(response_model="c", response_id="m"),
        Usage(input_tokens=5),
    ]


def test_message_delta_usage_merges_with_start():
    raw = sse(
        event="message_start",
        data=b'{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":5,"cache_read_input_tokens":3}}}',
    ) + sse(
        event="message_delta",
        data=b'{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":9}}',
    )
    assert run_whole(make, raw)[-3:] == [
        ResponseInfo(finish_reasons=("max_tokens",)),
        Usage(input_tokens=8, output_tokens=9, cached_input_tokens=3),
        GenerationDone(),
    ]


def test_message_delta_without_usage_or_with_garbage_usage():
    raw = sse(
        event="message_delta",
        data=b'{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":"9"}}',
    )
    raw += sse(event="message_delta", data=b'{"type":"message_delta","delta":[],"usage":[]}')
    assert run_whole(make, raw) == []


def test_message_start_twice_reports_info_once():
    start = sse(
        event="message_start", data=b'{"type":"message_start","message":{"id":"m","model":"c"}}'
    )
    assert run_whole(make, start + start) == [ResponseInfo(response_model="c", response_id="m")]


@pytest.mark.parametrize(
    "body,expected",
    [
        (
            b'{"type":"error","error":{"type":"api_error","message":"Internal server error"}}',
            StreamError("Internal server error", "api_error"),
        ),
        (b'{"type":"error","error":"boom"}', StreamError("boom")),
        (b'{"type":"error"}', StreamError("")),
    ],
)
def test_error_event_shapes(body, expected):
    assert run_whole(make, sse(event="error", data=body)) == [expected]


def test_bad_data_is_a_parse_error_and_the_stream_goes_on():
    raw = (
        sse(event="content_block_delta", data=b"{not json")
        + sse(event="ping", data=b"[1]")
        + sse(event="message_stop", data=b'{"type":"message_stop"}')
    )
    assert run_whole(make, raw) == [
        ParseError("data is not JSON"),
        ParseError("data is not a JSON object"),
        StreamEnd(),
    ]


def test_overflow_is_a_parse_error_and_the_stream_goes_on():
    d = AnthropicStreamDialect(max_line_bytes=128)
    big = sse(
        event="content_block_delta",
        data=b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
        + b"x" * 500
        + b'"}}',
    )
    ok = sse(
        event="content_block_delta",
        data=b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"y"}}',
    )
    assert d.feed(big) + d.feed(ok) + d.close() == [
        ParseError("line longer than 128 bytes"),
        ANSWER,
    ]


# -- usage and non-streaming --------------------------------------------------------------


def test_usage_from_anthropic():
    assert usage_from_anthropic(
        {
            "input_tokens": 10,
            "cache_creation_input_tokens": 20,
            "cache_read_input_tokens": 30,
            "output_tokens": 4,
        }
    ) == Usage(input_tokens=60, output_tokens=4, cached_input_tokens=30)
    assert usage_from_anthropic({"input_tokens": True, "output_tokens": -1}) == Usage()
    assert usage_from_anthropic([]) is None


def test_parse_message():
    assert parse_anthropic_response(load("anthropic", "message.json")) == [
        ResponseInfo(
            response_model=MODEL,
            response_id="msg_01Nb5Qx2Wr8Kt4Vm7Hc3Zp6D",
            finish_reasons=("end_turn",),
        ),
        Usage(input_tokens=18 + 120 + 1024, output_tokens=42, cached_input_tokens=1024),
    ]


def test_parse_error_body():
    assert parse_anthropic_response(load("anthropic", "error.json")) == [
        StreamError("model: claude-nonexistent-1", "not_found_error")
    ]


@pytest.mark.parametrize(
    "body,expected",
    [
        (b"", [ParseError("response is not JSON")]),
        (b"<html>502</html>", [ParseError("response is not JSON")]),
        (b"[]", [ParseError("response is not a JSON object")]),
        (b"{}", [ResponseInfo()]),
        (b'{"type":"message","stop_reason":null,"usage":null}', [ResponseInfo()]),
    ],
)
def test_parse_odd_bodies(body, expected):
    assert parse_anthropic_response(body) == expected
