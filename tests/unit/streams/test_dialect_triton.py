"""Triton generate extension (``/v2/models/{model}/generate_stream``) dialect.

Fixtures (tests/fixtures/streams/triton/, sources in ../SOURCES.md) follow
docs/protocol/extension_generate.md of triton-inference-server/server (``data:`` events
holding ``model_name``, ``model_version``, ``text_output``; ``{"error": ...}``) and the
byte layout of the TensorRT-LLM ``ensemble`` stream published in the TensorRT-LLM backend
and Triton LLM guides (alphabetical keys, the other output tensors alongside, an
``output_log_probs`` scalar first and then a growing list), including the
``accumulate_tokens`` variant where every event holds the whole text so far.

Every fixture, whole and split every way: tests/unit/streams/test_dialect_conformance.py.
"""

from __future__ import annotations

import pytest

from sidecar.streams.protocols.events import ParseError, ResponseInfo, StreamError
from sidecar.streams.protocols.triton import TritonStreamDialect, parse_triton_response
from tests.fixtures.streams.expected import ANSWER
from tests.fixtures.streams.harness import load, run_whole
from tests.support.sse import sse

ENSEMBLE = ResponseInfo(response_model="ensemble")


def make() -> TritonStreamDialect:
    return TritonStreamDialect(model="ensemble")


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
    raw = sse({"model_name": "tensorrt_llm_bls", "text_output": "a"}) + sse(
        {"model_name": "other", "text_output": "b"}
    )
    assert run_whole(make, raw) == [ResponseInfo(response_model="tensorrt_llm_bls"), ANSWER, ANSWER]


def test_model_from_the_path_when_the_stream_names_none():
    raw = sse({"text_output": "a"})
    assert run_whole(lambda: TritonStreamDialect(model="llama"), raw) == [
        ResponseInfo(response_model="llama"),
        ANSWER,
    ]
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
    assert run_whole(make, raw) == [
        ParseError("data is not JSON"),
        ParseError("data is not a JSON object"),
        ENSEMBLE,
        ANSWER,
    ]


# -- non-streaming ------------------------------------------------------------------------


def test_parse_generate():
    assert parse_triton_response(load("triton", "generate.json")) == [ENSEMBLE]
    assert parse_triton_response(b'{"text_output":"x"}', model="llama") == [
        ResponseInfo(response_model="llama")
    ]
    assert parse_triton_response(b'{"text_output":"x"}') == []


def test_parse_error():
    assert parse_triton_response(load("triton", "error.json")) == [
        StreamError("Request for unknown model: 'missing' is not found")
    ]


@pytest.mark.parametrize(
    "body,expected",
    [
        (b"", [ParseError("response is not JSON")]),
        (b"[]", [ParseError("response is not a JSON object")]),
    ],
)
def test_parse_odd_bodies(body, expected):
    assert parse_triton_response(body) == expected
