"""Anthropic Messages dialect over the wire format of the Messages streaming docs.

Fixtures (tests/fixtures/streams/anthropic/, sources in ../SOURCES.md) follow, byte for byte
in framing, key order and spacing, the example streams of
https://docs.claude.com/en/docs/build-with-claude/streaming: the "basic streaming request"
(spaced JSON, as the docs print it), the tool-use stream (compact JSON as the API sends it,
with the spaced ``{"type": "ping"}`` the API really sends), the extended-thinking stream
(no usage at all, ``signature_delta``) and the web-search stream (cache counts, a
``server_tool_use`` block, ``"index":1 }``, final input counts in ``message_delta``).
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.streams.protocols.anthropic import (
    AnthropicStreamDialect,
    parse_anthropic_response,
    usage_from_anthropic,
)
from sidecar.streams.protocols.events import (
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    TokenKind,
    Tokens,
    Usage,
)
from tests.fixtures.streams.harness import (
    FAST,
    SSE_EOLS,
    load,
    objects_from,
    run,
    run_bytewise,
    run_whole,
    split_at,
    with_eol,
)

ANSWER = Tokens(TokenKind.ANSWER, 1)
REASONING = Tokens(TokenKind.REASONING, 1)
TOOL = Tokens(TokenKind.TOOL, 1)
MODEL = "claude-sonnet-4-5-20250929"

CASES = {
    "basic.txt": [
        ResponseInfo(response_model=MODEL, response_id="msg_01Xk3pR8wq2vN7tYb5sLm9Ad"),
        Usage(input_tokens=12),
        ANSWER,
        ANSWER,
        ANSWER,
        ResponseInfo(finish_reasons=("end_turn",)),
        Usage(input_tokens=12, output_tokens=6),
        StreamEnd(),
    ],
    "tool_use.txt": [
        ResponseInfo(response_model=MODEL, response_id="msg_01Hq7WbN4cR2sLx9TzVkPd3E"),
        Usage(input_tokens=391),
        ANSWER,
        ANSWER,
        ANSWER,
        TOOL,  # the first input_json_delta has partial_json "" and is not a token
        TOOL,
        TOOL,
        ResponseInfo(finish_reasons=("tool_use",)),
        Usage(input_tokens=391, output_tokens=57),
        StreamEnd(),
    ],
    "thinking.txt": [
        ResponseInfo(response_model=MODEL, response_id="msg_01Lr4Sx8Gm2Nq6Vp9Tc3Wd7F"),
        REASONING,
        REASONING,
        REASONING,  # then signature_delta: not a token
        ANSWER,
        ANSWER,
        ResponseInfo(finish_reasons=("end_turn",)),
        StreamEnd(),
    ],
    "web_search_cache.txt": [
        ResponseInfo(response_model=MODEL, response_id="msg_01Gd2Hx7Kp4Rt9Wm3Ns6Vb8Q"),
        Usage(input_tokens=2679 + 2048, cached_input_tokens=2048),
        ANSWER,
        ANSWER,
        TOOL,
        TOOL,
        ANSWER,  # citations_delta in between: not a token
        ANSWER,
        ResponseInfo(finish_reasons=("end_turn",)),
        Usage(input_tokens=10682 + 2048, output_tokens=510, cached_input_tokens=2048),
        StreamEnd(),
    ],
    "error.txt": [
        ResponseInfo(response_model=MODEL, response_id="msg_01Ty8Vc3Mb6Qn2Wp5Rk9Lh4S"),
        Usage(input_tokens=25, cached_input_tokens=0),
        ANSWER,
        StreamError("Overloaded", "overloaded_error"),
    ],
}
NAMES = sorted(CASES)
make = AnthropicStreamDialect


def sse(event: str, data: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


# -- the fixtures, every way --------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_whole(name):
    assert run_whole(make, load("anthropic", name)) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_bytewise(name):
    assert run_bytewise(make, load("anthropic", name)) == CASES[name]


@pytest.mark.parametrize("eol", SSE_EOLS[1:], ids=["crlf", "cr"])
@pytest.mark.parametrize("name", NAMES)
def test_other_line_ends(name, eol):
    data = with_eol(load("anthropic", name), eol)
    assert run_whole(make, data) == CASES[name]
    assert run_bytewise(make, data) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_unterminated_last_event_adds_nothing(name):
    tail = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}\n'
    assert run_whole(make, load("anthropic", name) + tail) == CASES[name]


@FAST
@given(st.data())
def test_random_splits(data):
    name = data.draw(st.sampled_from(NAMES))
    raw = with_eol(load("anthropic", name), data.draw(st.sampled_from(SSE_EOLS)))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=25))
    assert run(make, split_at(raw, cuts)) == CASES[name]


# -- individual rules ---------------------------------------------------------------------


def delta(d: bytes) -> list:
    return run_whole(make, sse("content_block_delta", b'{"type":"content_block_delta","index":0,"delta":' + d + b"}"))


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
        sse("ping", b'{"type": "ping"}')
        + sse("content_block_stop", b'{"type":"content_block_stop","index":0}')
        + sse("some_future_event", b'{"type":"some_future_event","text":"a"}')
        + b": comment\n\n"
    )
    assert run_whole(make, raw) == []


def test_event_name_is_the_fallback_when_data_has_no_type():
    raw = sse("content_block_delta", b'{"index":0,"delta":{"type":"text_delta","text":"a"}}') + sse(
        "message_stop", b"{}"
    )
    assert run_whole(make, raw) == [ANSWER, StreamEnd()]


def test_data_type_wins_over_event_name():
    raw = sse("ping", b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}')
    assert run_whole(make, raw) == [ANSWER]


def test_non_empty_block_start_is_a_token():
    raw = sse("content_block_start", b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"Hi"}}')
    raw += sse(
        "content_block_start",
        b'{"type":"content_block_start","index":1,"content_block":{"type":"thinking","thinking":"hm"}}',
    )
    raw += sse(
        "content_block_start",
        b'{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}',
    )
    assert run_whole(make, raw) == [ANSWER, REASONING]


def test_provisional_output_count_of_message_start_is_ignored():
    raw = sse(
        "message_start",
        b'{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":5,"output_tokens":1}}}',
    )
    assert run_whole(make, raw) == [ResponseInfo(response_model="c", response_id="m"), Usage(input_tokens=5)]


def test_message_delta_usage_merges_with_start():
    raw = sse(
        "message_start",
        b'{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":5,"cache_read_input_tokens":3}}}',
    ) + sse("message_delta", b'{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":9}}')
    assert run_whole(make, raw)[-2:] == [
        ResponseInfo(finish_reasons=("max_tokens",)),
        Usage(input_tokens=8, output_tokens=9, cached_input_tokens=3),
    ]


def test_message_delta_without_usage_or_with_garbage_usage():
    raw = sse("message_delta", b'{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":"9"}}')
    raw += sse("message_delta", b'{"type":"message_delta","delta":[],"usage":[]}')
    assert run_whole(make, raw) == []


def test_message_start_twice_reports_info_once():
    start = sse("message_start", b'{"type":"message_start","message":{"id":"m","model":"c"}}')
    assert run_whole(make, start + start) == [ResponseInfo(response_model="c", response_id="m")]


@pytest.mark.parametrize(
    "body,expected",
    [
        (b'{"type":"error","error":{"type":"api_error","message":"Internal server error"}}', StreamError("Internal server error", "api_error")),
        (b'{"type":"error","error":"boom"}', StreamError("boom")),
        (b'{"type":"error"}', StreamError("")),
    ],
)
def test_error_event_shapes(body, expected):
    assert run_whole(make, sse("error", body)) == [expected]


def test_bad_data_is_a_parse_error_and_the_stream_goes_on():
    raw = sse("content_block_delta", b"{not json") + sse("ping", b"[1]") + sse("message_stop", b'{"type":"message_stop"}')
    assert run_whole(make, raw) == [ParseError("data is not JSON"), ParseError("data is not a JSON object"), StreamEnd()]


def test_overflow_is_a_parse_error_and_the_stream_goes_on():
    d = AnthropicStreamDialect(max_line_bytes=128)
    big = sse("content_block_delta", b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"' + b"x" * 500 + b'"}}')
    ok = sse("content_block_delta", b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"y"}}')
    assert d.feed(big) + d.feed(ok) + d.close() == [ParseError("line longer than 128 bytes"), ANSWER]


# -- usage and non-streaming --------------------------------------------------------------


def test_usage_from_anthropic():
    assert usage_from_anthropic(
        {"input_tokens": 10, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 30, "output_tokens": 4}
    ) == Usage(input_tokens=60, output_tokens=4, cached_input_tokens=30)
    assert usage_from_anthropic({"input_tokens": True, "output_tokens": -1}) == Usage()
    assert usage_from_anthropic([]) is None


def test_parse_message():
    assert parse_anthropic_response(load("anthropic", "message.json")) == [
        ResponseInfo(response_model=MODEL, response_id="msg_01Nb5Qx2Wr8Kt4Vm7Hc3Zp6D", finish_reasons=("end_turn",)),
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


# -- properties: never raise --------------------------------------------------------------

KEYS = ["type", "message", "usage", "input_tokens", "output_tokens", "cache_read_input_tokens",
        "cache_creation_input_tokens", "model", "id", "delta", "text", "thinking", "partial_json",
        "stop_reason", "content_block", "error", "index"]
anthropic_objects = objects_from(KEYS)


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10))
def test_any_bytes_never_raise(raw, cuts):
    run(make, split_at(raw, cuts))
    parse_anthropic_response(raw)


@FAST
@given(st.lists(anthropic_objects, min_size=1, max_size=4), st.data())
def test_any_json_events_never_raise_and_split_invariant(objs, data):
    raw = b"".join(
        sse(data.draw(st.sampled_from(["message_start", "content_block_delta", "message_delta", "error", "x"])), orjson.dumps(o))
        for o in objs
    )
    expected = run_whole(make, raw)
    assert run(make, split_at(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))) == expected
    for o in objs:
        parse_anthropic_response(orjson.dumps(o))
