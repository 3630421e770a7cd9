"""Hugging Face TGI ``/generate_stream`` and ``/generate`` dialect over real wire bytes.

Fixtures (tests/fixtures/streams/tgi/, sources in ../SOURCES.md) are what TGI's router
writes: ``StreamResponse`` / ``StreamDetails`` / ``Token`` / ``ErrorResponse`` of
router/src/lib.rs serialised by serde_json (compact, raw UTF-8, ryu floats such as
``-5.9604645e-7``) into axum SSE events (``data:`` without a space, ``:`` keep-alive
comments), as in docs/source/conceptual/streaming.md.

Every fixture, whole and split every way: tests/unit/streams/test_dialect_conformance.py.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given

from sidecar.streams.protocols.events import ParseError, ResponseInfo, StreamEnd, StreamError, Usage
from sidecar.streams.protocols.tgi import TGIStreamDialect, parse_tgi_response
from tests.fixtures.streams.expected import ANSWER
from tests.fixtures.streams.harness import FAST, load, objects_from, run_whole

make = TGIStreamDialect


def sse(obj: bytes) -> bytes:
    return b"data:" + obj + b"\n\n"


def token(
    text: str = "a", special: bool = False, final: bool = False, details: bytes = b"null"
) -> bytes:
    return (
        orjson.dumps(
            {"index": 1, "token": {"id": 1, "text": text, "logprob": -0.5, "special": special}}
        )[:-1]
        + b',"generated_text":'
        + (b'"done"' if final else b"null")
        + b',"details":'
        + details
        + b"}"
    )


# -- individual rules ---------------------------------------------------------------------


def test_special_token_is_not_a_token():
    assert run_whole(make, sse(token("<|eot_id|>", special=True))) == []


@pytest.mark.parametrize("special", [b"false", b"null", b'"true"', b"1"])
def test_only_special_true_is_special(special):
    raw = sse(b'{"index":1,"token":{"id":1,"text":"x","logprob":0.0,"special":' + special + b"}}")
    assert run_whole(make, raw) == [ANSWER]


@pytest.mark.parametrize("tok", [b"null", b'"x"', b"[1]", b"3"])
def test_token_that_is_not_an_object_is_not_a_token(tok):
    assert (
        run_whole(
            make, sse(b'{"index":1,"token":' + tok + b',"generated_text":null,"details":null}')
        )
        == []
    )


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
    raw = sse(
        token(final=True, details=b'{"finish_reason":7,"generated_tokens":-1,"input_length":"3"}')
    )
    assert run_whole(make, raw) == [ANSWER, StreamEnd()]


@pytest.mark.parametrize(
    "body,expected",
    [
        (
            b'{"error":"Model is overloaded","error_type":"overloaded"}',
            StreamError("Model is overloaded", "overloaded"),
        ),
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
    assert run_whole(make, raw) == [
        ParseError("data is not JSON"),
        ParseError("data is not a JSON object"),
        ANSWER,
    ]


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
    assert parse_tgi_response(body) == [
        ResponseInfo(finish_reasons=("stop_sequence",)),
        Usage(output_tokens=3, engine=True),
    ]


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


# -- properties ---------------------------------------------------------------------------
# (any bytes, any JSON events: tests/unit/streams/test_dialect_conformance.py)


@FAST
@given(
    objects_from(
        [
            "generated_text",
            "details",
            "finish_reason",
            "generated_tokens",
            "input_length",
            "prefill",
            "error",
            "error_type",
        ]
    )
)
def test_compat_route_list_of_any_object_never_raises(obj):
    # /generate behind TGI's compat route answers a one-element list
    parse_tgi_response(orjson.dumps([obj]))


@pytest.mark.parametrize(
    "details,expected",
    [
        (
            {"generated_tokens": 3, "input_length": 9, "prefill": [{"id": 1}]},
            Usage(input_tokens=9, output_tokens=3, engine=True),
        ),
        (
            {"generated_tokens": 3, "prefill": [{"id": 1, "text": "<s>"}, {"id": 2, "text": "Hi"}]},
            Usage(input_tokens=2, output_tokens=3, engine=True),
        ),
        (
            {"generated_tokens": 3, "prefill": []},
            Usage(output_tokens=3, engine=True),
        ),  # not listed: unknown, not 0
    ],
)
def test_generate_input_from_input_length_else_listed_prefill(details, expected):
    body = orjson.dumps(
        {"generated_text": "abc", "details": {"finish_reason": "length", **details}}
    )
    assert parse_tgi_response(body) == [ResponseInfo(finish_reasons=("length",)), expected]
