"""Ollama native ``/api/chat`` and ``/api/generate`` NDJSON dialect over real wire bytes.

Fixtures (tests/fixtures/streams/ollama/, sources in ../SOURCES.md) are Go ``json.Marshal``
of ``api.ChatResponse`` / ``api.GenerateResponse`` (api/types.go: field order, ``omitempty``
metrics, ``\\u003c``-style HTML escaping, raw UTF-8) plus ``\\n``, as server/routes.go's
``streamResponse`` writes them (``application/x-ndjson``), with the shapes of docs/api.md
(final ``done: true`` object with nanosecond durations), the thinking streams of gpt-oss
and qwen3, and ``docs_streaming.ndjson``, the example of docs/api/streaming.mdx with its
hand-edited last line (``"done":true, "done_reason": "stop"`` carrying text).
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
from sidecar.streams.protocols.ollama import OllamaStreamDialect, engine_timings_from_ollama, parse_ollama_response
from tests.fixtures.streams.harness import (
    FAST,
    NDJSON_EOLS,
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
NS = 1e9
STOP = ResponseInfo(finish_reasons=("stop",))

CASES = {
    "generate.ndjson": [
        ResponseInfo(response_model="llama3.2"),
        *[ANSWER] * 9,
        STOP,
        Usage(input_tokens=26, output_tokens=10, engine=True),
        EngineTimings(6338219291 / NS, 130079000 / NS, 4232710000 / NS),
        StreamEnd(),
    ],
    "generate_thinking.ndjson": [
        ResponseInfo(response_model="gpt-oss:20b"),
        *[REASONING] * 4,  # the first line ("response":"") is not a token
        *[ANSWER] * 6,
        STOP,
        Usage(input_tokens=74, output_tokens=31, engine=True),
        EngineTimings(94587125 / NS, 213458000 / NS, 1482931417 / NS),
        StreamEnd(),
    ],
    "chat.ndjson": [
        ResponseInfo(response_model="qwen3:8b"),
        *[REASONING] * 4,
        *[ANSWER] * 7,
        STOP,
        Usage(input_tokens=26, output_tokens=282, engine=True),
        EngineTimings(1334875 / NS, 342546000 / NS, 4535599000 / NS),
        StreamEnd(),
    ],
    "chat_tool_calls.ndjson": [
        ResponseInfo(response_model="llama3.2"),
        TOOL,
        STOP,
        Usage(output_tokens=33, engine=True),  # prompt_eval_count omitted (omitempty): not known
        EngineTimings(load_seconds=3753500 / NS, decode_seconds=552222000 / NS),
        StreamEnd(),
    ],
    "chat_error.ndjson": [
        ResponseInfo(response_model="llama3.2"),
        ANSWER,
        ANSWER,
        StreamError("an error was encountered while running the model: unexpected EOF"),
    ],
    "docs_streaming.ndjson": [
        ResponseInfo(response_model="gemma3"),
        *[ANSWER] * 5,  # the done line carries "!" and is a token
        STOP,
        StreamEnd(),
    ],
}
NAMES = sorted(CASES)
make = OllamaStreamDialect


def nd(*objs: dict) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objs)


# -- the fixtures, every way --------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_whole(name):
    assert run_whole(make, load("ollama", name)) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_bytewise(name):
    assert run_bytewise(make, load("ollama", name)) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_crlf(name):
    data = with_eol(load("ollama", name), b"\r\n")
    assert run_whole(make, data) == CASES[name]
    assert run_bytewise(make, data) == CASES[name]


@pytest.mark.parametrize("name", NAMES)
def test_without_final_newline(name):
    assert run_whole(make, load("ollama", name).rstrip(b"\n")) == CASES[name]


@FAST
@given(st.data())
def test_random_splits(data):
    name = data.draw(st.sampled_from(NAMES))
    raw = with_eol(load("ollama", name), data.draw(st.sampled_from(NDJSON_EOLS)))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=25))
    assert run(make, split_at(raw, cuts)) == CASES[name]


# -- individual rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj,expected",
    [
        ({"message": {"role": "assistant", "content": "a"}}, [ANSWER]),
        ({"message": {"role": "assistant", "content": ""}}, []),
        ({"message": {"role": "assistant"}}, []),
        ({"message": {"role": "assistant", "content": "", "thinking": "t"}}, [REASONING]),
        ({"message": {"role": "assistant", "content": "a", "thinking": "t"}}, [REASONING, ANSWER]),
        ({"message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}}, [TOOL]),
        ({"message": {"role": "assistant", "content": "", "tool_calls": []}}, []),
        ({"message": {"content": 5, "thinking": None, "tool_calls": {}}}, []),
        ({"response": "a"}, [ANSWER]),
        ({"response": "", "thinking": "t"}, [REASONING]),
        ({"response": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}, [TOOL]),
        ({"response": None}, []),
        ({"message": "not an object", "response": "a"}, [ANSWER]),
        ({}, []),
    ],
)
def test_token_kinds(obj, expected):
    assert run_whole(make, nd({"created_at": "2025-01-01T00:00:00Z", "done": False, **obj})) == expected


def test_model_reported_once():
    raw = nd({"model": "a", "response": ""}, {"model": "b", "response": ""})
    assert run_whole(make, raw) == [ResponseInfo(response_model="a")]


@pytest.mark.parametrize("reason", ["load", "unload", "length"])
def test_done_reasons(reason):
    assert run_whole(make, nd({"response": "", "done": True, "done_reason": reason})) == [
        ResponseInfo(finish_reasons=(reason,)),
        StreamEnd(),
    ]


def test_done_without_metrics_or_reason():
    assert run_whole(make, nd({"response": "", "done": True})) == [StreamEnd()]


@pytest.mark.parametrize("done", [False, None, 1, "true"])
def test_only_done_true_ends(done):
    assert run_whole(make, nd({"response": "", "done": done, "eval_count": 3})) == []


def test_bad_metric_values_are_not_reported():
    raw = nd({"done": True, "prompt_eval_count": -1, "eval_count": 2.5, "load_duration": "1s",
              "prompt_eval_duration": -5, "eval_duration": True, "done_reason": ""})
    assert run_whole(make, raw) == [StreamEnd()]


def test_float_durations_are_accepted():
    assert engine_timings_from_ollama({"eval_duration": 1.5e9}) == EngineTimings(decode_seconds=1.5)
    assert engine_timings_from_ollama({}) is None
    assert engine_timings_from_ollama([]) is None


@pytest.mark.parametrize(
    "obj,expected",
    [
        ({"error": "model requires more system memory (9.8 GiB) than is available (3.1 GiB)"},
         StreamError("model requires more system memory (9.8 GiB) than is available (3.1 GiB)")),
        ({"error": {"message": "m", "type": "api_error"}}, StreamError("m", "api_error")),
    ],
)
def test_error_lines(obj, expected):
    assert run_whole(make, nd(obj)) == [expected]


def test_bad_lines_are_parse_errors_and_the_stream_goes_on():
    raw = b"{nope\n[1]\n\n" + nd({"response": "a"})
    assert run_whole(make, raw) == [ParseError("line is not JSON"), ParseError("line is not a JSON object"), ANSWER]


def test_overlong_line_is_a_parse_error_and_the_stream_goes_on():
    d = OllamaStreamDialect(max_line_bytes=64)
    out = d.feed(nd({"response": "x" * 200})) + d.feed(nd({"response": "y"})) + d.close()
    assert out == [ParseError("line longer than 64 bytes"), ANSWER]


# -- non-streaming ------------------------------------------------------------------------


def test_parse_generate():
    assert parse_ollama_response(load("ollama", "generate.json")) == [
        ResponseInfo(response_model="llama3.2"),
        STOP,
        Usage(input_tokens=26, output_tokens=290, engine=True),
        EngineTimings(5025959 / NS, 325953000 / NS, 4709213000 / NS),
    ]


def test_parse_chat():
    assert parse_ollama_response(load("ollama", "chat.json")) == [
        ResponseInfo(response_model="llama3.2"),
        ResponseInfo(finish_reasons=("length",)),
        Usage(input_tokens=26, output_tokens=298, engine=True),
        EngineTimings(2154458 / NS, 383809000 / NS, 4799921000 / NS),
    ]


def test_parse_error():
    assert parse_ollama_response(load("ollama", "error.json")) == [
        StreamError('model "llama9" not found, try pulling it first')
    ]


@pytest.mark.parametrize(
    "body,expected",
    [
        (b"", [ParseError("response is not JSON")]),
        (b"[]", [ParseError("response is not a JSON object")]),
        (b"{}", [ResponseInfo()]),
    ],
)
def test_parse_odd_bodies(body, expected):
    assert parse_ollama_response(body) == expected


# -- properties: never raise --------------------------------------------------------------

KEYS = ["model", "message", "role", "content", "thinking", "tool_calls", "response", "done", "done_reason",
        "prompt_eval_count", "eval_count", "load_duration", "prompt_eval_duration", "eval_duration", "error"]
ollama_objects = objects_from(KEYS)


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10))
def test_any_bytes_never_raise(raw, cuts):
    run(make, split_at(raw, cuts))
    parse_ollama_response(raw)


@FAST
@given(st.lists(ollama_objects, min_size=1, max_size=4), st.data())
def test_any_json_lines_never_raise_and_split_invariant(objs, data):
    raw = nd(*objs)
    expected = run_whole(make, raw)
    assert run(make, split_at(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))) == expected
    for o in objs:
        parse_ollama_response(orjson.dumps(o))
