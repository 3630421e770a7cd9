"""llama.cpp server native ``/completion`` dialect over real wire bytes.

Fixtures (tests/fixtures/streams/llamacpp/, sources in ../SOURCES.md) are what
tools/server writes: ``server_task_result_cmpl_partial::to_json_non_oaicompat`` and
``server_task_result_cmpl_final::to_json_non_oaicompat`` (tools/server/server-task.cpp),
``result_timings::to_json``, dumped by nlohmann ``ordered_json`` (insertion order, compact)
as ``data: {...}\\n\\n`` SSE events, with the response fields of tools/server/README.md.
``completion_old.txt`` is the 2024 shape (``stopped_*`` flags, no ``cache_n``, the final
result repeating the whole text); ``progress_eos.txt`` has ``return_progress`` updates and
an empty partial (half of a UTF-8 character).

Every fixture, whole and split every way: tests/unit/streams/test_dialect_conformance.py.
"""

from __future__ import annotations

import orjson
import pytest

from sidecar.streams.protocols.events import (
    EngineTimings,
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
)
from sidecar.streams.protocols.llamacpp import (
    LlamaCppStreamDialect,
    engine_timings_from_llamacpp,
    parse_llamacpp_response,
)
from tests.fixtures.streams.expected import ANSWER, LLAMACPP
from tests.fixtures.streams.harness import load, run_whole
from tests.support.sse import sse

make = LlamaCppStreamDialect


# -- individual rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj,expected",
    [
        ({"content": "a", "stop": False}, [ANSWER]),
        ({"content": "a"}, [ANSWER]),
        ({"content": "", "stop": False}, []),
        ({"content": None, "stop": False}, []),
        ({"content": ["a"], "stop": False}, []),
        (
            {
                "stop": False,
                "prompt_progress": {"total": 10, "cache": 0, "processed": 5, "time_ms": 3},
            },
            [],
        ),
        ({"content": "a", "stop": "true"}, [ANSWER]),
    ],
)
def test_partials(obj, expected):
    assert run_whole(make, sse(obj)) == expected


def test_final_content_is_never_a_token():
    assert run_whole(make, sse({"content": "the whole text", "stop": True})) == [StreamEnd()]


@pytest.mark.parametrize(
    "flags,reason",
    [
        ({"stopped_eos": True, "stopped_word": False, "stopped_limit": False}, "eos"),
        ({"stopped_eos": False, "stopped_word": True, "stopped_limit": False}, "word"),
        ({"stopped_limit": True}, "limit"),
        ({"stop_type": "word", "stopped_eos": True}, "word"),
    ],
)
def test_stop_reasons(flags, reason):
    assert run_whole(make, sse({"stop": True, **flags})) == [
        ResponseInfo(finish_reasons=(reason,)),
        StreamEnd(),
    ]


@pytest.mark.parametrize("stop_type", ["none", "", 3, None])
def test_no_stop_reason(stop_type):
    assert run_whole(make, sse({"stop": True, "stop_type": stop_type})) == [StreamEnd()]


def test_timings_per_token_on_partials_are_not_reported():
    # with timings_per_token every partial carries cumulative timings; only the final's count
    partial = {
        "content": "a",
        "stop": False,
        "timings": {"prompt_n": 3, "prompt_ms": 5.0, "predicted_n": 1, "predicted_ms": 2.0},
    }
    assert run_whole(make, sse(partial)) == [ANSWER]


def test_engine_timings_from_llamacpp():
    assert engine_timings_from_llamacpp(
        {"prompt_ms": 250, "predicted_ms": 1500.5}
    ) == EngineTimings(prefill_seconds=0.25, decode_seconds=1.5005)
    assert engine_timings_from_llamacpp({"prompt_ms": -1.0, "predicted_ms": "2"}) is None
    assert engine_timings_from_llamacpp({"prompt_ms": float("inf")}) is None
    assert engine_timings_from_llamacpp(None) is None
    # what llama.cpp's OpenAI-compatible stream puts on its last chunk
    last_chunk = load("llamacpp", "completion.txt").split(b"\n\n")[-2][len(b"data: ") :]
    assert (
        engine_timings_from_llamacpp(orjson.loads(last_chunk)["timings"])
        == LLAMACPP["completion.txt"][-2]
    )


@pytest.mark.parametrize(
    "obj,expected",
    [
        (
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size",
                    "type": "exceed_context_size_error",
                }
            },
            StreamError(
                "the request exceeds the available context size", "exceed_context_size_error", 400
            ),
        ),
        ({"error": {"code": True, "message": 5}}, StreamError("5")),
        ({"error": "plain"}, StreamError("plain")),
    ],
)
def test_error_shapes(obj, expected):
    assert run_whole(make, sse(obj)) == [expected]


def test_old_error_field_is_invisible_to_sse():
    # builds before 2025 wrote "error: {...}" (not a data field): the SSE spec ignores it
    raw = (
        sse({"content": "a", "stop": False})
        + b'error: {"code":500,"message":"boom","type":"server_error"}\n\n'
    )
    assert run_whole(make, raw) == [ANSWER]


def test_bad_data_is_a_parse_error_and_the_stream_goes_on():
    raw = sse(b"{x") + sse(b"1") + sse({"content": "a"})
    assert run_whole(make, raw) == [
        ParseError("data is not JSON"),
        ParseError("data is not a JSON object"),
        ANSWER,
    ]


# -- non-streaming ------------------------------------------------------------------------


def test_parse_completion():
    assert (
        parse_llamacpp_response(load("llamacpp", "completion.json"))
        == LLAMACPP["completion.txt"][6:-1]
    )


def test_parse_error_body():
    body = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
    assert parse_llamacpp_response(body) == [StreamError("Loading model", "unavailable_error", 503)]


@pytest.mark.parametrize(
    "body,expected",
    [
        (b"", [ParseError("response is not JSON")]),
        (b"[]", [ParseError("response is not a JSON object")]),
        (b"{}", []),
    ],
)
def test_parse_odd_bodies(body, expected):
    assert parse_llamacpp_response(body) == expected
