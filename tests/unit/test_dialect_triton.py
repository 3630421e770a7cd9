"""Triton generate extension (``/v2/models/{model}/generate_stream``) dialect.

Fixtures (tests/fixtures/streams/triton/, sources in ../SOURCES.md) follow
docs/protocol/extension_generate.md of triton-inference-server/server (``data:`` events
holding ``model_name``, ``model_version``, ``text_output``; ``{"error": ...}``) and the
byte layout of the TensorRT-LLM ``ensemble`` stream published in the TensorRT-LLM backend
and Triton LLM guides (alphabetical keys, the other output tensors alongside, an
``output_log_probs`` scalar first and then a growing list), including the
``accumulate_tokens`` variant where every event holds the whole text so far.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.streams.protocols.events import ParseError, ResponseInfo, StreamError, TokenKind, Tokens
from sidecar.streams.protocols.triton import TritonStreamDialect, parse_triton_response
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
ENSEMBLE = ResponseInfo(response_model="ensemble")

CASES = {
    "trtllm_ensemble.txt": [ENSEMBLE, *[ANSWER] * 7],  # the last event's text_output is ""
    "accumulate.txt": [ENSEMBLE, *[ANSWER] * 8],  # events are counted, not text
    "error.txt": [
        ENSEMBLE,
        ANSWER,
        ANSWER,
        StreamError(
            "in ensemble 'ensemble', Executor failed process requestId 7 due to the following error: "
            "Encountered an error in forwardAsync function: CUDA out of memory"
        ),
    ],
}
NAMES = sorted(CASES)


def make() -> TritonStreamDialect:
    return TritonStreamDialect(model="ensemble")


def sse(obj: dict | bytes) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


# -- the fixtures, every way --------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_whole(name):
    assert run_whole(make, load("triton", name)) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_bytewise(name):
    assert run_bytewise(make, load("triton", name)) == CASES[name]


@pytest.mark.parametrize("eol", SSE_EOLS[1:], ids=["crlf", "cr"])
@pytest.mark.parametrize("name", NAMES)
def test_other_line_ends(name, eol):
    data = with_eol(load("triton", name), eol)
    assert run_whole(make, data) == CASES[name]
    assert run_bytewise(make, data) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_unterminated_last_event_adds_nothing(name):
    assert run_whole(make, load("triton", name) + b'data: {"text_output":"x"}\n') == CASES[name]


@FAST
@given(st.data())
def test_random_splits(data):
    name = data.draw(st.sampled_from(NAMES))
    raw = with_eol(load("triton", name), data.draw(st.sampled_from(SSE_EOLS)))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=25))
    assert run(make, split_at(raw, cuts)) == CASES[name]


# -- individual rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj,expected",
    [
        ({"text_output": "a"}, [ANSWER]),
        ({"text_output": ""}, []),
        ({"text_output": None}, []),
        ({"text_output": ["a"]}, []),
        ({"model_name": "m"}, [ResponseInfo(response_model="m")]),
        ({"model_name": 7, "text_output": "a"}, [ANSWER]),
    ],
)
def test_text_output(obj, expected):
    assert run_whole(TritonStreamDialect, sse(obj)) == expected


def test_model_from_the_stream_wins_over_the_path_and_is_reported_once():
    raw = sse({"model_name": "tensorrt_llm_bls", "text_output": "a"}) + sse({"model_name": "other", "text_output": "b"})
    assert run_whole(make, raw) == [ResponseInfo(response_model="tensorrt_llm_bls"), ANSWER, ANSWER]


def test_model_from_the_path_when_the_stream_names_none():
    raw = sse({"text_output": "a"})
    assert run_whole(lambda: TritonStreamDialect(model="llama"), raw) == [ResponseInfo(response_model="llama"), ANSWER]
    assert run_whole(lambda: TritonStreamDialect(), raw) == [ANSWER]


@pytest.mark.parametrize(
    "obj,expected",
    [
        ({"error": "Request for unknown model"}, StreamError("Request for unknown model")),
        ({"error": {"message": "m", "type": "t"}}, StreamError("m", "t")),
    ],
)
def test_error_before_anything_else(obj, expected):
    assert run_whole(make, sse(obj) + sse({"text_output": "a"})) == [expected, ENSEMBLE, ANSWER]


def test_bad_data_is_a_parse_error_and_the_stream_goes_on():
    raw = sse(b"{x") + sse(b"[]") + sse({"text_output": "a"})
    assert run_whole(make, raw) == [ParseError("data is not JSON"), ParseError("data is not a JSON object"), ENSEMBLE, ANSWER]


# -- non-streaming ------------------------------------------------------------------------


def test_parse_generate():
    assert parse_triton_response(load("triton", "generate.json")) == [ENSEMBLE]
    assert parse_triton_response(b'{"text_output":"x"}', model="llama") == [ResponseInfo(response_model="llama")]
    assert parse_triton_response(b'{"text_output":"x"}') == []


def test_parse_error():
    assert parse_triton_response(load("triton", "error.json")) == [
        StreamError("Request for unknown model: 'missing' is not found")
    ]


@pytest.mark.parametrize(
    "body,expected",
    [(b"", [ParseError("response is not JSON")]), (b"[]", [ParseError("response is not a JSON object")])],
)
def test_parse_odd_bodies(body, expected):
    assert parse_triton_response(body) == expected


# -- properties: never raise --------------------------------------------------------------

triton_objects = objects_from(["model_name", "model_version", "text_output", "error", "message", "type"])


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10))
def test_any_bytes_never_raise(raw, cuts):
    run(make, split_at(raw, cuts))
    parse_triton_response(raw)


@FAST
@given(st.lists(triton_objects, min_size=1, max_size=4), st.data())
def test_any_json_events_never_raise_and_split_invariant(objs, data):
    raw = b"".join(sse(o) for o in objs)
    expected = run_whole(make, raw)
    assert run(make, split_at(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))) == expected
    for o in objs:
        parse_triton_response(orjson.dumps(o))
