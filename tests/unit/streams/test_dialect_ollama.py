"""Ollama native ``/api/chat`` and ``/api/generate`` NDJSON dialect over real wire bytes.

Fixtures (tests/fixtures/streams/ollama/, sources in ../SOURCES.md) are Go ``json.Marshal``
of ``api.ChatResponse`` / ``api.GenerateResponse`` (api/types.go: field order, ``omitempty``
metrics, ``\\u003c``-style HTML escaping, raw UTF-8) plus ``\\n``, as server/routes.go's
``streamResponse`` writes them (``application/x-ndjson``), with the shapes of docs/api.md
(final ``done: true`` object with nanosecond durations), the thinking streams of gpt-oss
and qwen3, and ``docs_streaming.ndjson``, the example of docs/api/streaming.mdx with its
hand-edited last line (``"done":true, "done_reason": "stop"`` carrying text).

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
    ToolCallDelta,
    Usage,
)
from sidecar.streams.protocols.ollama import (
    OllamaStreamDialect,
    engine_timings_from_ollama,
    parse_ollama_response,
)
from tests.fixtures.streams.expected import ANSWER, REASONING, TOOL
from tests.fixtures.streams.harness import load, run_whole

NS = 1e9
STOP = ResponseInfo(finish_reasons=("stop",))

make = OllamaStreamDialect


def nd(*objs: dict) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objs)


# -- individual rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj,expected",
    [
        ({"message": {"role": "assistant", "content": "a"}}, [ANSWER]),
        ({"message": {"role": "assistant", "content": ""}}, []),
        ({"message": {"role": "assistant"}}, []),
        ({"message": {"role": "assistant", "content": "", "thinking": "t"}}, [REASONING]),
        ({"message": {"role": "assistant", "content": "a", "thinking": "t"}}, [REASONING, ANSWER]),
        (
            {
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f"}}],
                }
            },
            [TOOL, ToolCallDelta(0)],
        ),
        ({"message": {"role": "assistant", "content": "", "tool_calls": []}}, []),
        ({"message": {"content": 5, "thinking": None, "tool_calls": {}}}, []),
        ({"response": "a"}, [ANSWER]),
        ({"response": "", "thinking": "t"}, [REASONING]),
        (
            {"response": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            [TOOL, ToolCallDelta(0)],
        ),
        ({"response": None}, []),
        ({"message": "not an object", "response": "a"}, [ANSWER]),
        ({}, []),
    ],
)
def test_token_kinds(obj, expected):
    assert (
        run_whole(make, nd({"created_at": "2025-01-01T00:00:00Z", "done": False, **obj}))
        == expected
    )


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
    raw = nd(
        {
            "done": True,
            "prompt_eval_count": -1,
            "eval_count": 2.5,
            "load_duration": "1s",
            "prompt_eval_duration": -5,
            "eval_duration": True,
            "done_reason": "",
        }
    )
    assert run_whole(make, raw) == [StreamEnd()]


def test_float_durations_are_accepted():
    assert engine_timings_from_ollama({"eval_duration": 1.5e9}) == EngineTimings(decode_seconds=1.5)
    assert engine_timings_from_ollama({}) is None
    assert engine_timings_from_ollama([]) is None


@pytest.mark.parametrize(
    "obj,expected",
    [
        (
            {"error": "model requires more system memory (9.8 GiB) than is available (3.1 GiB)"},
            StreamError("model requires more system memory (9.8 GiB) than is available (3.1 GiB)"),
        ),
        ({"error": {"message": "m", "type": "api_error"}}, StreamError("m", "api_error")),
    ],
)
def test_error_lines(obj, expected):
    assert run_whole(make, nd(obj)) == [expected]


def test_bad_lines_are_parse_errors_and_the_stream_goes_on():
    raw = b"{nope\n[1]\n\n" + nd({"response": "a"})
    assert run_whole(make, raw) == [
        ParseError("line is not JSON"),
        ParseError("line is not a JSON object"),
        ANSWER,
    ]


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
