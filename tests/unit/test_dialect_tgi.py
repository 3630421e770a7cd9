"""Hugging Face TGI ``/generate_stream`` and ``/generate`` dialect over real wire bytes.

Fixtures (tests/fixtures/streams/tgi/, sources in ../SOURCES.md) are what TGI's router
writes: ``StreamResponse`` / ``StreamDetails`` / ``Token`` / ``ErrorResponse`` of
router/src/lib.rs serialised by serde_json (compact, raw UTF-8, ryu floats such as
``-5.9604645e-7``) into axum SSE events (``data:`` without a space, ``:`` keep-alive
comments), as in docs/source/conceptual/streaming.md.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.streams.protocols.events import (
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    TokenKind,
    Tokens,
    Usage,
)
from sidecar.streams.protocols.tgi import TGIStreamDialect, parse_tgi_response
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

CASES = {
    # 10 text tokens, then the special </s>: not a token, but generated_tokens counts it
    "generate_stream.txt": [
        *[ANSWER] * 10,
        ResponseInfo(finish_reasons=("eos_token",)),
        Usage(input_tokens=7, output_tokens=11, engine=True),
        StreamEnd(),
    ],
    # details not requested: no usage, no finish reason; empty-text byte tokens still count
    "no_details.txt": [*[ANSWER] * 5, StreamEnd()],
    "error.txt": [
        ANSWER,
        ANSWER,
        StreamError(
            "Request failed during generation: Server error: CUDA out of memory. Tried to allocate 2.00 GiB",
            "generation",
        ),
    ],
}
NAMES = sorted(CASES)
make = TGIStreamDialect


def sse(obj: bytes) -> bytes:
    return b"data:" + obj + b"\n\n"


def token(text: str = "a", special: bool = False, final: bool = False, details: bytes = b"null") -> bytes:
    return orjson.dumps(
        {"index": 1, "token": {"id": 1, "text": text, "logprob": -0.5, "special": special}}
    )[:-1] + b',"generated_text":' + (b'"done"' if final else b"null") + b',"details":' + details + b"}"


# -- the fixtures, every way --------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_whole(name):
    assert run_whole(make, load("tgi", name)) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_bytewise(name):
    assert run_bytewise(make, load("tgi", name)) == CASES[name]


@pytest.mark.parametrize("eol", SSE_EOLS[1:], ids=["crlf", "cr"])
@pytest.mark.parametrize("name", NAMES)
def test_other_line_ends(name, eol):
    data = with_eol(load("tgi", name), eol)
    assert run_whole(make, data) == CASES[name]
    assert run_bytewise(make, data) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_unterminated_last_event_adds_nothing(name):
    assert run_whole(make, load("tgi", name) + b"data:" + token() + b"\n") == CASES[name]


@FAST
@given(st.data())
def test_random_splits(data):
    name = data.draw(st.sampled_from(NAMES))
    raw = with_eol(load("tgi", name), data.draw(st.sampled_from(SSE_EOLS)))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=25))
    assert run(make, split_at(raw, cuts)) == CASES[name]


def test_utf8_character_split_inside():
    raw = load("tgi", "no_details.txt")
    cut = raw.index("日".encode()) + 1  # between the bytes of one character
    assert run(make, [raw[:cut], raw[cut:]]) == CASES["no_details.txt"]


# -- individual rules ---------------------------------------------------------------------


def test_special_token_is_not_a_token():
    assert run_whole(make, sse(token("<|eot_id|>", special=True))) == []


@pytest.mark.parametrize("special", [b"false", b"null", b'"true"', b"1"])
def test_only_special_true_is_special(special):
    raw = sse(b'{"index":1,"token":{"id":1,"text":"x","logprob":0.0,"special":' + special + b"}}")
    assert run_whole(make, raw) == [ANSWER]


@pytest.mark.parametrize("tok", [b"null", b'"x"', b"[1]", b"3"])
def test_token_that_is_not_an_object_is_not_a_token(tok):
    assert run_whole(make, sse(b'{"index":1,"token":' + tok + b',"generated_text":null,"details":null}')) == []


def test_final_event_details_without_input_length():
    details = b'{"finish_reason":"length","generated_tokens":2,"seed":42}'
    raw = sse(token("a")) + sse(token("b", final=True, details=details))
    assert run_whole(make, raw) == [
        ANSWER,
        ANSWER,
        ResponseInfo(finish_reasons=("length",)),
        Usage(output_tokens=2, engine=True),  # TGI 1.x: no input_length
        StreamEnd(),
    ]


def test_details_with_garbage_fields():
    raw = sse(token(final=True, details=b'{"finish_reason":7,"generated_tokens":-1,"input_length":"3"}'))
    assert run_whole(make, raw) == [ANSWER, StreamEnd()]


@pytest.mark.parametrize(
    "body,expected",
    [
        (b'{"error":"Model is overloaded","error_type":"overloaded"}', StreamError("Model is overloaded", "overloaded")),
        (b'{"error":"x"}', StreamError("x")),
        (b'{"error":{"message":"m","type":"t"}}', StreamError("m", "t")),
    ],
)
def test_error_shapes(body, expected):
    assert run_whole(make, sse(body)) == [expected]


def test_keepalive_comments_and_blank_data_are_nothing():
    assert run_whole(make, b":\n\n: ping\n\ndata:\n\n") == []


def test_bad_data_is_a_parse_error_and_the_stream_goes_on():
    raw = sse(b"{nope") + sse(b"[]") + sse(token())
    assert run_whole(make, raw) == [ParseError("data is not JSON"), ParseError("data is not a JSON object"), ANSWER]


# -- non-streaming ------------------------------------------------------------------------


def test_parse_generate_with_details():
    assert parse_tgi_response(load("tgi", "generate.json")) == [
        ResponseInfo(finish_reasons=("length",)),
        Usage(output_tokens=10, engine=True),
    ]


def test_parse_generate_without_details():
    assert parse_tgi_response(load("tgi", "generate_plain.json")) == []


def test_parse_generate_error():
    assert parse_tgi_response(load("tgi", "generate_error.json")) == [
        StreamError(
            "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
            "Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
            "validation",
        )
    ]


def test_parse_compat_route_list():
    body = b'[{"generated_text":"x","details":{"finish_reason":"stop_sequence","generated_tokens":3,"seed":null,"prefill":[],"tokens":[]}}]'
    assert parse_tgi_response(body) == [ResponseInfo(finish_reasons=("stop_sequence",)), Usage(output_tokens=3, engine=True)]


@pytest.mark.parametrize(
    "body,expected",
    [
        (b"", [ParseError("response is not JSON")]),
        (b"[]", [ParseError("response is not a JSON object")]),
        (b"[1]", [ParseError("response is not a JSON object")]),
        (b"[{},{}]", [ParseError("response is not a JSON object")]),
        (b'"x"', [ParseError("response is not a JSON object")]),
    ],
)
def test_parse_odd_bodies(body, expected):
    assert parse_tgi_response(body) == expected


# -- properties: never raise --------------------------------------------------------------

KEYS = ["index", "token", "id", "text", "logprob", "special", "generated_text", "details", "finish_reason",
        "generated_tokens", "input_length", "seed", "error", "error_type", "message", "type"]
tgi_objects = objects_from(KEYS)


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10))
def test_any_bytes_never_raise(raw, cuts):
    run(make, split_at(raw, cuts))
    parse_tgi_response(raw)


@FAST
@given(st.lists(tgi_objects, min_size=1, max_size=4), st.data())
def test_any_json_events_never_raise_and_split_invariant(objs, data):
    raw = b"".join(sse(orjson.dumps(o)) for o in objs)
    expected = run_whole(make, raw)
    assert run(make, split_at(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))) == expected
    for o in objs:
        parse_tgi_response(orjson.dumps(o))
        parse_tgi_response(orjson.dumps([o]))


@pytest.mark.parametrize(
    "details,expected",
    [
        ({"generated_tokens": 3, "input_length": 9, "prefill": [{"id": 1}]}, Usage(input_tokens=9, output_tokens=3, engine=True)),
        ({"generated_tokens": 3, "prefill": [{"id": 1, "text": "<s>"}, {"id": 2, "text": "Hi"}]}, Usage(input_tokens=2, output_tokens=3, engine=True)),
        ({"generated_tokens": 3, "prefill": []}, Usage(output_tokens=3, engine=True)),  # not listed: unknown, not 0
    ],
)
def test_generate_input_from_input_length_else_listed_prefill(details, expected):
    body = orjson.dumps({"generated_text": "abc", "details": {"finish_reason": "length", **details}})
    assert parse_tgi_response(body) == [ResponseInfo(finish_reasons=("length",)), expected]
