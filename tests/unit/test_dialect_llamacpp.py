"""llama.cpp server native ``/completion`` dialect over real wire bytes.

Fixtures (tests/fixtures/streams/llamacpp/, sources in ../SOURCES.md) are what
tools/server writes: ``server_task_result_cmpl_partial::to_json_non_oaicompat`` and
``server_task_result_cmpl_final::to_json_non_oaicompat`` (tools/server/server-task.cpp),
``result_timings::to_json``, dumped by nlohmann ``ordered_json`` (insertion order, compact)
as ``data: {...}\\n\\n`` SSE events, with the response fields of tools/server/README.md.
``completion_old.txt`` is the 2024 shape (``stopped_*`` flags, no ``cache_n``, the final
result repeating the whole text); ``progress_eos.txt`` has ``return_progress`` updates and
an empty partial (half of a UTF-8 character).
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.streams.protocols.events import (
    EngineTimings,
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    TokenKind,
    Tokens,
    Usage,
)
from sidecar.streams.protocols.llamacpp import (
    LlamaCppStreamDialect,
    engine_timings_from_llamacpp,
    parse_llamacpp_response,
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
MS = 1000.0

CASES = {
    "completion.txt": [
        *[ANSWER] * 6,
        ResponseInfo(response_model="Llama-3.2-1B-Instruct-Q4_K_M.gguf", finish_reasons=("limit",)),
        Usage(input_tokens=12, output_tokens=6, cached_input_tokens=5, engine=True),
        EngineTimings(prefill_seconds=35.187 / MS, decode_seconds=92.301 / MS),
        StreamEnd(),
    ],
    "progress_eos.txt": [
        *[ANSWER] * 5,  # two progress updates and one empty partial are not tokens
        ResponseInfo(response_model="gemma-3-4b-it", finish_reasons=("eos",)),
        Usage(input_tokens=2048, output_tokens=7, cached_input_tokens=1024, engine=True),
        EngineTimings(prefill_seconds=403.112 / MS, decode_seconds=118.52 / MS),
        StreamEnd(),
    ],
    "completion_old.txt": [
        *[ANSWER] * 4,  # the final result repeats " Hello, world!": not a token
        ResponseInfo(response_model="models/llama-2-7b.Q4_0.gguf", finish_reasons=("limit",)),
        Usage(input_tokens=5, output_tokens=4, engine=True),
        EngineTimings(prefill_seconds=71.3 / MS, decode_seconds=120.25 / MS),
        StreamEnd(),
    ],
    "error.txt": [ANSWER, ANSWER, StreamError("Context size has been exceeded.", "server_error", 500)],
}
NAMES = sorted(CASES)
make = LlamaCppStreamDialect


def sse(obj: dict | bytes) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


# -- the fixtures, every way --------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_whole(name):
    assert run_whole(make, load("llamacpp", name)) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_bytewise(name):
    assert run_bytewise(make, load("llamacpp", name)) == CASES[name]


@pytest.mark.parametrize("eol", SSE_EOLS[1:], ids=["crlf", "cr"])
@pytest.mark.parametrize("name", NAMES)
def test_other_line_ends(name, eol):
    data = with_eol(load("llamacpp", name), eol)
    assert run_whole(make, data) == CASES[name]
    assert run_bytewise(make, data) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_unterminated_last_event_adds_nothing(name):
    assert run_whole(make, load("llamacpp", name) + b'data: {"content":"x","stop":false}\n') == CASES[name]


@FAST
@given(st.data())
def test_random_splits(data):
    name = data.draw(st.sampled_from(NAMES))
    raw = with_eol(load("llamacpp", name), data.draw(st.sampled_from(SSE_EOLS)))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=25))
    assert run(make, split_at(raw, cuts)) == CASES[name]


# -- individual rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj,expected",
    [
        ({"content": "a", "stop": False}, [ANSWER]),
        ({"content": "a"}, [ANSWER]),
        ({"content": "", "stop": False}, []),
        ({"content": None, "stop": False}, []),
        ({"content": ["a"], "stop": False}, []),
        ({"stop": False, "prompt_progress": {"total": 10, "cache": 0, "processed": 5, "time_ms": 3}}, []),
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
    assert run_whole(make, sse({"stop": True, **flags})) == [ResponseInfo(finish_reasons=(reason,)), StreamEnd()]


@pytest.mark.parametrize("stop_type", ["none", "", 3, None])
def test_no_stop_reason(stop_type):
    assert run_whole(make, sse({"stop": True, "stop_type": stop_type})) == [StreamEnd()]


def test_timings_per_token_on_partials_are_not_reported():
    # with timings_per_token every partial carries cumulative timings; only the final's count
    partial = {"content": "a", "stop": False, "timings": {"prompt_n": 3, "prompt_ms": 5.0, "predicted_n": 1, "predicted_ms": 2.0}}
    assert run_whole(make, sse(partial)) == [ANSWER]


def test_engine_timings_from_llamacpp():
    assert engine_timings_from_llamacpp({"prompt_ms": 250, "predicted_ms": 1500.5}) == EngineTimings(
        prefill_seconds=0.25, decode_seconds=1.5005
    )
    assert engine_timings_from_llamacpp({"prompt_ms": -1.0, "predicted_ms": "2"}) is None
    assert engine_timings_from_llamacpp({"prompt_ms": float("inf")}) is None
    assert engine_timings_from_llamacpp(None) is None
    # what llama.cpp's OpenAI-compatible stream puts on its last chunk
    last_chunk = load("llamacpp", "completion.txt").split(b"\n\n")[-2][len(b"data: "):]
    assert engine_timings_from_llamacpp(orjson.loads(last_chunk)["timings"]) == CASES["completion.txt"][-2]


@pytest.mark.parametrize(
    "obj,expected",
    [
        ({"error": {"code": 400, "message": "the request exceeds the available context size", "type": "exceed_context_size_error"}},
         StreamError("the request exceeds the available context size", "exceed_context_size_error", 400)),
        ({"error": {"code": True, "message": 5}}, StreamError("5")),
        ({"error": "plain"}, StreamError("plain")),
    ],
)
def test_error_shapes(obj, expected):
    assert run_whole(make, sse(obj)) == [expected]


def test_old_error_field_is_invisible_to_sse():
    # builds before 2025 wrote "error: {...}" (not a data field): the SSE spec ignores it
    raw = sse({"content": "a", "stop": False}) + b'error: {"code":500,"message":"boom","type":"server_error"}\n\n'
    assert run_whole(make, raw) == [ANSWER]


def test_bad_data_is_a_parse_error_and_the_stream_goes_on():
    raw = sse(b"{x") + sse(b"1") + sse({"content": "a"})
    assert run_whole(make, raw) == [ParseError("data is not JSON"), ParseError("data is not a JSON object"), ANSWER]


# -- non-streaming ------------------------------------------------------------------------


def test_parse_completion():
    assert parse_llamacpp_response(load("llamacpp", "completion.json")) == CASES["completion.txt"][6:-1]


def test_parse_error_body():
    body = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
    assert parse_llamacpp_response(body) == [StreamError("Loading model", "unavailable_error", 503)]


@pytest.mark.parametrize(
    "body,expected",
    [(b"", [ParseError("response is not JSON")]), (b"[]", [ParseError("response is not a JSON object")]), (b"{}", [])],
)
def test_parse_odd_bodies(body, expected):
    assert parse_llamacpp_response(body) == expected


# -- properties: never raise --------------------------------------------------------------

KEYS = ["content", "stop", "model", "tokens_predicted", "tokens_evaluated", "stop_type", "stopped_eos",
        "stopped_limit", "timings", "prompt_ms", "predicted_ms", "cache_n", "error", "code", "message", "type"]
llamacpp_objects = objects_from(KEYS)


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10))
def test_any_bytes_never_raise(raw, cuts):
    run(make, split_at(raw, cuts))
    parse_llamacpp_response(raw)


@FAST
@given(st.lists(llamacpp_objects, min_size=1, max_size=4), st.data())
def test_any_json_events_never_raise_and_split_invariant(objs, data):
    raw = b"".join(sse(o) for o in objs)
    expected = run_whole(make, raw)
    assert run(make, split_at(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))) == expected
    for o in objs:
        parse_llamacpp_response(orjson.dumps(o))
