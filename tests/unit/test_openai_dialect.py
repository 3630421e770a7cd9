"""OpenAI Chat Completions / Completions dialect over real wire bytes.

The fixtures are byte for byte what the servers write: vLLM serialises each chunk with
pydantic ``model_dump_json(exclude_unset=True)`` (compact, the role-only first chunk is
``{"role":"assistant","content":""}``, the final usage chunk has ``"choices":[]``), its
in-stream errors with ``json.dumps`` (spaced separators); OpenAI sends ``"usage":null`` on
every chunk when ``include_usage`` is set and the details objects in the last one.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
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
from sidecar.streams.protocols.openai import OpenAIStreamDialect, parse_openai_response, usage_from_openai
from sidecar.measure.timeline import RequestTimeline

FAST = settings(max_examples=200, deadline=None)

ANSWER = Tokens(TokenKind.ANSWER, 1)
REASONING = Tokens(TokenKind.REASONING, 1)
TOOL = Tokens(TokenKind.TOOL, 1)
DONE = b"data: [DONE]\n\n"


def sse(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


# -- fixtures -----------------------------------------------------------------------------

VLLM_ID = "chatcmpl-9b1f2e4c7d3a4c0e8f5b6a7d2c1e0f9a"
VLLM_MODEL = "Qwen/Qwen2.5-7B-Instruct"
_HEAD = b'{"id":"chatcmpl-9b1f2e4c7d3a4c0e8f5b6a7d2c1e0f9a","object":"chat.completion.chunk","created":1733011200,"model":"Qwen/Qwen2.5-7B-Instruct",'


def vllm_chunk(choices: bytes, tail: bytes = b"") -> bytes:
    return _HEAD + b'"choices":[' + choices + b"]" + tail + b"}"


def vllm_delta(delta: bytes, index: int = 0, finish: bytes = b"null") -> bytes:
    stop = b',"stop_reason":null' if finish != b"null" else b""
    return (
        b'{"index":%d,"delta":' % index + delta + b',"logprobs":null,"finish_reason":' + finish + stop + b"}"
    )


VLLM_CHAT = sse(
    vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}')),
    vllm_chunk(vllm_delta(b'{"content":"The"}')),
    vllm_chunk(vllm_delta(b'{"content":" capital"}')),
    vllm_chunk(vllm_delta(b'{"content":" is"}')),
    vllm_chunk(vllm_delta(b'{"content":" Paris"}')),
    vllm_chunk(vllm_delta(b'{"content":"."}')),
    vllm_chunk(vllm_delta(b'{"content":""}', finish=b'"stop"')),
    vllm_chunk(
        b"",
        b',"usage":{"prompt_tokens":14,"total_tokens":19,"completion_tokens":5,'
        b'"prompt_tokens_details":{"cached_tokens":8}}',
    ),
) + DONE

VLLM_CHAT_EVENTS = [
    ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
    ANSWER,
    ANSWER,
    ANSWER,
    ANSWER,
    ANSWER,
    ResponseInfo(finish_reasons=("stop",)),
    Usage(input_tokens=14, output_tokens=5, reasoning_tokens=None, cached_input_tokens=8),
    StreamEnd(),
]

_CMPL_HEAD = b'{"id":"cmpl-4e0c2b9d8a7f4b61a3c5d7e9f1b2c3d4","object":"text_completion","created":1733011200,"model":"meta-llama/Llama-3.1-8B",'


def vllm_text(text: bytes, finish: bytes = b"null") -> bytes:
    return (
        _CMPL_HEAD + b'"choices":[{"index":0,"text":' + text + b',"logprobs":null,"finish_reason":'
        + finish + b',"stop_reason":null}]}'
    )


VLLM_COMPLETIONS = sse(
    vllm_text(b'" Paris"'),
    vllm_text(b'","'),
    vllm_text(b'" France"'),
    vllm_text(b'""', finish=b'"length"'),
    _CMPL_HEAD + b'"choices":[],"usage":{"prompt_tokens":6,"total_tokens":9,"completion_tokens":3}}',
) + DONE

VLLM_COMPLETIONS_EVENTS = [
    ResponseInfo(response_model="meta-llama/Llama-3.1-8B", response_id="cmpl-4e0c2b9d8a7f4b61a3c5d7e9f1b2c3d4"),
    ANSWER,
    ANSWER,
    ANSWER,
    ResponseInfo(finish_reasons=("length",)),
    Usage(input_tokens=6, output_tokens=3),
    StreamEnd(),
]

# vLLM with a reasoning parser (deepseek_r1): reasoning_content first, then content.
VLLM_REASONING = sse(
    vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}')),
    vllm_chunk(vllm_delta(b'{"reasoning_content":"Okay"}')),
    vllm_chunk(vllm_delta(b'{"reasoning_content":", the"}')),
    vllm_chunk(vllm_delta(b'{"reasoning_content":" user"}')),
    vllm_chunk(vllm_delta(b'{"content":"Paris"}')),
    vllm_chunk(vllm_delta(b'{"content":"."}')),
    vllm_chunk(vllm_delta(b'{"content":""}', finish=b'"stop"')),
    vllm_chunk(b"", b',"usage":{"prompt_tokens":10,"total_tokens":15,"completion_tokens":5}'),
) + DONE

REASONING_EVENTS = [
    ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
    REASONING,
    REASONING,
    REASONING,
    ANSWER,
    ANSWER,
    ResponseInfo(finish_reasons=("stop",)),
    Usage(input_tokens=10, output_tokens=5),
    StreamEnd(),
]

# Newer vLLM / SGLang / OpenRouter spell it ``reasoning``.
VLLM_REASONING_NEW = VLLM_REASONING.replace(b'"reasoning_content"', b'"reasoning"')

# vLLM tool parser (hermes): the first delta names the function, the rest stream arguments.
VLLM_TOOLS = sse(
    vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}')),
    vllm_chunk(
        vllm_delta(
            b'{"tool_calls":[{"id":"chatcmpl-tool-5d3c1a9b7e2f4d6a","type":"function","index":0,'
            b'"function":{"name":"get_weather"}}]}'
        )
    ),
    vllm_chunk(vllm_delta(b'{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": \\""}}]}')),
    vllm_chunk(vllm_delta(b'{"tool_calls":[{"index":0,"function":{"arguments":"Paris"}}]}')),
    vllm_chunk(vllm_delta(b'{"tool_calls":[{"index":0,"function":{"arguments":"\\"}"}}]}')),
    vllm_chunk(vllm_delta(b'{"content":""}', finish=b'"tool_calls"')),
    vllm_chunk(b"", b',"usage":{"prompt_tokens":210,"total_tokens":222,"completion_tokens":12}'),
) + DONE

TOOL_EVENTS = [
    ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
    TOOL,
    TOOL,
    TOOL,
    TOOL,
    ResponseInfo(finish_reasons=("tool_calls",)),
    Usage(input_tokens=210, output_tokens=12),
    StreamEnd(),
]

# n=2: vLLM sends one chunk per choice, each with its own index.
VLLM_N2 = sse(
    vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}', index=0)),
    vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}', index=1)),
    vllm_chunk(vllm_delta(b'{"content":"Yes"}', index=0)),
    vllm_chunk(vllm_delta(b'{"content":"No"}', index=1)),
    vllm_chunk(vllm_delta(b'{"content":"!"}', index=1)),
    vllm_chunk(vllm_delta(b'{"content":""}', index=0, finish=b'"stop"')),
    vllm_chunk(vllm_delta(b'{"content":""}', index=1, finish=b'"length"')),
    vllm_chunk(b"", b',"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3}'),
) + DONE

N2_EVENTS = [
    ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
    ANSWER,
    ANSWER,
    ANSWER,
    ResponseInfo(finish_reasons=("stop",)),
    ResponseInfo(finish_reasons=("length",)),
    Usage(input_tokens=9, output_tokens=3),
    StreamEnd(),
]

# llama.cpp (older builds) and others: usage rides on the last content chunk, no [DONE].
LLAMACPP = sse(
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"created":1733011200,'
    b'"id":"chatcmpl-Xr7bQ2","model":"gpt-3.5-turbo","system_fingerprint":"b4200-3f1ae2e3",'
    b'"object":"chat.completion.chunk"}',
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" there"}}],"created":1733011200,'
    b'"id":"chatcmpl-Xr7bQ2","model":"gpt-3.5-turbo","system_fingerprint":"b4200-3f1ae2e3",'
    b'"object":"chat.completion.chunk"}',
    b'{"choices":[{"finish_reason":"stop","index":0,"delta":{"content":"!"}}],"created":1733011200,'
    b'"id":"chatcmpl-Xr7bQ2","model":"gpt-3.5-turbo","system_fingerprint":"b4200-3f1ae2e3",'
    b'"object":"chat.completion.chunk","usage":{"completion_tokens":3,"prompt_tokens":11,"total_tokens":14},'
    b'"timings":{"prompt_n":11,"prompt_ms":35.2,"predicted_n":3,"predicted_ms":41.7}}',
)

LLAMACPP_EVENTS = [
    ResponseInfo(response_model="gpt-3.5-turbo", response_id="chatcmpl-Xr7bQ2"),
    ANSWER,
    ANSWER,
    ANSWER,
    ResponseInfo(finish_reasons=("stop",)),
    Usage(input_tokens=11, output_tokens=3),
    Usage(input_tokens=11, output_tokens=3, engine=True),  # timings: the engine's own counts
    EngineTimings(prefill_seconds=35.2 / 1000, decode_seconds=41.7 / 1000),
]

# vLLM stream_options={"include_usage":true,"continuous_usage_stats":true}: usage everywhere.
VLLM_CONTINUOUS = sse(
    vllm_chunk(
        vllm_delta(b'{"role":"assistant","content":""}'),
        b',"usage":{"prompt_tokens":7,"total_tokens":7,"completion_tokens":0}',
    ),
    vllm_chunk(vllm_delta(b'{"content":"A"}'), b',"usage":{"prompt_tokens":7,"total_tokens":8,"completion_tokens":1}'),
    vllm_chunk(vllm_delta(b'{"content":"B"}'), b',"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2}'),
    vllm_chunk(
        vllm_delta(b'{"content":""}', finish=b'"stop"'),
        b',"usage":{"prompt_tokens":7,"total_tokens":10,"completion_tokens":3}',
    ),
    vllm_chunk(b"", b',"usage":{"prompt_tokens":7,"total_tokens":10,"completion_tokens":3}'),
) + DONE

CONTINUOUS_EVENTS = [
    ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
    Usage(input_tokens=7, output_tokens=0),
    ANSWER,
    Usage(input_tokens=7, output_tokens=1),
    ANSWER,
    Usage(input_tokens=7, output_tokens=2),
    ResponseInfo(finish_reasons=("stop",)),
    Usage(input_tokens=7, output_tokens=3),
    Usage(input_tokens=7, output_tokens=3),
    StreamEnd(),
]

# OpenAI itself with include_usage: "usage":null on every chunk, details in the last one.
_OAI = b'{"id":"chatcmpl-AbC123xyz","object":"chat.completion.chunk","created":1733011200,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0ba0d124f1",'
OPENAI_CHAT = sse(
    _OAI + b'"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}',
    _OAI + b'"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}',
    _OAI + b'"choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":null}],"usage":null}',
    _OAI + b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}',
    _OAI + b'"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,'
    b'"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":'
    b'{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}',
) + DONE

OPENAI_EVENTS = [
    ResponseInfo(response_model="gpt-4o-mini-2024-07-18", response_id="chatcmpl-AbC123xyz"),
    ANSWER,
    ANSWER,
    ResponseInfo(finish_reasons=("stop",)),
    Usage(input_tokens=9, output_tokens=2, reasoning_tokens=0, cached_input_tokens=0),
    StreamEnd(),
]

# Current vLLM: a mid-stream failure is {"error": {...}} (json.dumps, spaced), then [DONE].
VLLM_STREAM_ERROR = sse(
    vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}')),
    vllm_chunk(vllm_delta(b'{"content":"Par"}')),
    b'{"error": {"message": "The decoder prompt cannot be empty", "type": "BadRequestError", "param": null, "code": 400}}',
) + DONE

STREAM_ERROR_EVENTS = [
    ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
    ANSWER,
    StreamError("The decoder prompt cannot be empty", "BadRequestError", 400),
    StreamEnd(),
]

# Older vLLM: a top-level ErrorResponse, "object": "error".
VLLM_OLD_ERROR = sse(
    b'{"object": "error", "message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}',
) + DONE

OLD_ERROR_EVENTS = [StreamError("Internal server error", "InternalServerError", 500), StreamEnd()]

# Keep-alives, a garbage event and a non-object JSON value in between real chunks.
MESSY = (
    b": ping - 2024-12-01 00:00:00\n\n"
    + sse(vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}')))
    + b": ping\n\n"
    + sse(b"this is not json", b"[1, 2, 3]", b"")
    + sse(vllm_chunk(vllm_delta(b'{"content":"ok"}')))
    + b":\n\n"
    + DONE
)

MESSY_EVENTS = [
    ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
    ParseError("data is not JSON"),
    ParseError("data is not a JSON object"),
    ANSWER,
    StreamEnd(),
]

STREAMS = {
    "vllm_chat": (VLLM_CHAT, VLLM_CHAT_EVENTS),
    "vllm_completions": (VLLM_COMPLETIONS, VLLM_COMPLETIONS_EVENTS),
    "vllm_reasoning_content": (VLLM_REASONING, REASONING_EVENTS),
    "vllm_reasoning": (VLLM_REASONING_NEW, REASONING_EVENTS),
    "vllm_tools": (VLLM_TOOLS, TOOL_EVENTS),
    "vllm_n2": (VLLM_N2, N2_EVENTS),
    "llamacpp_usage_on_last_chunk": (LLAMACPP, LLAMACPP_EVENTS),
    "vllm_continuous_usage": (VLLM_CONTINUOUS, CONTINUOUS_EVENTS),
    "openai_include_usage": (OPENAI_CHAT, OPENAI_EVENTS),
    "vllm_stream_error": (VLLM_STREAM_ERROR, STREAM_ERROR_EVENTS),
    "vllm_old_error": (VLLM_OLD_ERROR, OLD_ERROR_EVENTS),
    "messy": (MESSY, MESSY_EVENTS),
}
NAMES = sorted(STREAMS)


# -- drivers ------------------------------------------------------------------------------


def run(chunks) -> list:
    d = OpenAIStreamDialect()
    out = []
    for c in chunks:
        out += d.feed(c)
    return out + d.close()


def run_whole(data: bytes) -> list:
    return run([data])


def run_bytewise(data: bytes) -> list:
    return run([data[i : i + 1] for i in range(len(data))])


def split_at(data: bytes, cuts) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


# -- the fixtures, every way ----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_whole(name):
    data, expected = STREAMS[name]
    assert run_whole(data) == expected


@pytest.mark.parametrize("name", NAMES)
def test_bytewise(name):
    data, expected = STREAMS[name]
    assert run_bytewise(data) == expected


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["crlf", "cr"])
@pytest.mark.parametrize("name", NAMES)
def test_other_line_ends_give_identical_events(name, eol):
    data, expected = STREAMS[name]
    assert b"\r" not in data  # JSON escapes its newlines, so this rewrite is exact
    converted = data.replace(b"\n", eol)
    assert run_whole(converted) == expected
    assert run_bytewise(converted) == expected


@pytest.mark.parametrize("name", NAMES)
def test_trailing_incomplete_event_adds_nothing(name):
    data, expected = STREAMS[name]
    tail = b'data: {"choices":[{"index":0,"delta":{"content":"never dispatched"}}]}\n'
    assert run_whole(data + tail) == expected


@FAST
@given(st.data())
def test_random_splits(data):
    name = data.draw(st.sampled_from(NAMES))
    raw, expected = STREAMS[name]
    eol = data.draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    raw = raw.replace(b"\n", eol)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=20))
    assert run(split_at(raw, cuts)) == expected


# -- individual rules -----------------------------------------------------------------------


def one(delta: bytes) -> list:
    """Events of a single chunk after the first (so no ResponseInfo)."""
    d = OpenAIStreamDialect()
    d.feed(sse(vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}'))))
    return d.feed(sse(vllm_chunk(vllm_delta(delta)))) + d.close()


@pytest.mark.parametrize(
    "delta",
    [
        b'{"role":"assistant","content":""}',
        b'{"role":"assistant"}',
        b'{"role":"assistant","content":null,"refusal":null}',
        b'{"content":""}',
        b"{}",
        b'{"tool_calls":[]}',
        b'{"reasoning_content":null,"content":null}',
    ],
)
def test_role_only_and_empty_deltas_are_not_tokens(delta):
    assert one(delta) == []


def test_role_only_first_chunk_gives_only_info():
    assert run_whole(sse(vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}')))) == [
        ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID)
    ]


def test_role_chunk_with_content_is_a_token():
    # Some servers put the first token into the role chunk.
    assert one(b'{"role":"assistant","content":"Hi"}') == [ANSWER]


def test_refusal_is_answer():
    assert one(b'{"refusal":"I can\'t help with that."}') == [ANSWER]


def test_legacy_function_call_is_tool():
    assert one(b'{"function_call":{"name":"f","arguments":""}}') == [TOOL]


def test_reasoning_and_content_in_one_delta_reasoning_first():
    assert one(b'{"reasoning_content":"so","content":"Yes"}') == [REASONING, ANSWER]


def test_n2_in_one_chunk_counts_both():
    chunk = vllm_chunk(
        vllm_delta(b'{"content":"a"}', index=0) + b"," + vllm_delta(b'{"content":"b"}', index=1)
    )
    assert run_whole(sse(chunk))[1:] == [Tokens(TokenKind.ANSWER, 2)]


def test_n2_mixed_kinds_in_one_chunk():
    chunk = vllm_chunk(
        vllm_delta(b'{"reasoning":"hm"}', index=0)
        + b","
        + vllm_delta(b'{"content":"b"}', index=1, finish=b'"stop"')
    )
    assert run_whole(sse(chunk))[1:] == [REASONING, ANSWER, ResponseInfo(finish_reasons=("stop",))]


def test_completions_empty_text_is_not_a_token():
    assert run_whole(sse(vllm_text(b'""')))[1:] == []


def test_response_info_only_once():
    events = run_whole(VLLM_CHAT)
    infos = [e for e in events if isinstance(e, ResponseInfo) and e.response_id is not None]
    assert infos == [ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID)]


def test_error_as_string():
    assert run_whole(sse(b'{"error":"upstream overloaded"}')) == [StreamError("upstream overloaded")]


def test_old_vllm_error_wrapped_in_error_object():
    # vLLM 0.6-0.8 wrapped its ErrorResponse (which had "object":"error") in {"error": ...}.
    raw = sse(
        b'{"error": {"object": "error", "message": "Request aborted", "type": "BadRequestError", '
        b'"param": null, "code": 400}}'
    )
    assert run_whole(raw) == [StreamError("Request aborted", "BadRequestError", 400)]


def test_openai_error_with_string_code():
    raw = sse(
        b'{"error":{"message":"The server had an error while processing your request.",'
        b'"type":"server_error","param":null,"code":"server_error"}}'
    )
    assert run_whole(raw) == [
        StreamError("The server had an error while processing your request.", "server_error", "server_error")
    ]


def test_error_does_not_count_as_first_chunk_info():
    raw = sse(b'{"error":{"message":"x","type":"t","code":1}}', vllm_chunk(vllm_delta(b'{"content":"a"}')))
    assert run_whole(raw) == [
        StreamError("x", "t", 1),
        ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
        ANSWER,
    ]


def test_parse_error_then_later_events_still_parse():
    raw = sse(b"{not json", b'"a string"', b"null", vllm_chunk(vllm_delta(b'{"content":"x"}'))) + DONE
    assert run_whole(raw) == [
        ParseError("data is not JSON"),
        ParseError("data is not a JSON object"),
        ParseError("data is not a JSON object"),
        ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
        ANSWER,
        StreamEnd(),
    ]


def test_invalid_utf8_is_a_parse_error():
    assert run_whole(sse(b'{"choices":[{"delta":{"content":"\xff\xfe"}}]}')) == [ParseError("data is not JSON")]


def test_bad_shapes_are_parse_errors_not_exceptions():
    raw = sse(b'{"choices":"nope"}', b'{"choices":[1, {"delta":{"content":"x"}}]}')
    assert run_whole(raw) == [
        ParseError("choices is not a list"),
        ParseError("choice is not an object"),
        ANSWER,
    ]


def test_blank_data_event_is_ignored():
    assert run_whole(b"data:\n\ndata: \n\n" + DONE) == [StreamEnd()]


def test_sse_overflow_becomes_parse_error_and_stream_resumes():
    d = OpenAIStreamDialect(max_line_bytes=256)
    huge = sse(b'{"choices":[{"delta":{"content":"' + b"x" * 1000 + b'"}}]}')
    out = d.feed(huge) + d.feed(sse(vllm_chunk(vllm_delta(b'{"content":"y"}')))) + d.feed(DONE) + d.close()
    assert [type(e) for e in out] == [ParseError, ResponseInfo, Tokens, StreamEnd]


def test_done_then_close():
    d = OpenAIStreamDialect()
    assert d.feed(DONE) == [StreamEnd()]
    assert d.close() == []


# -- usage ----------------------------------------------------------------------------------


def test_usage_details():
    u = usage_from_openai(
        {
            "prompt_tokens": 100,
            "completion_tokens": 50,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 30, "audio_tokens": 0},
        }
    )
    assert u == Usage(input_tokens=100, output_tokens=50, reasoning_tokens=30, cached_input_tokens=64)


@pytest.mark.parametrize(
    "usage,expected",
    [
        ({"prompt_tokens": 5, "completion_tokens": None}, Usage(input_tokens=5)),
        ({"prompt_tokens": -1, "completion_tokens": True}, Usage()),
        ({"prompt_tokens": 1.5, "completion_tokens": "3"}, Usage()),
        ({"prompt_tokens_details": None, "completion_tokens_details": None}, Usage()),
        ({"prompt_tokens_details": [], "completion_tokens_details": "x"}, Usage()),
    ],
)
def test_usage_ignores_bad_values(usage, expected):
    assert usage_from_openai(usage) == expected


@pytest.mark.parametrize("usage", [None, [], "x", 3])
def test_usage_not_an_object(usage):
    assert usage_from_openai(usage) is None


def test_continuous_usage_last_wins_in_timeline():
    d = OpenAIStreamDialect()
    tl = RequestTimeline(start=0.0)
    tl.response_started(0.01, 200, streamed=True)
    for i, event in enumerate(VLLM_CONTINUOUS.split(b"\n\n")[:-1]):
        tl.events(d.feed(event + b"\n\n"), 0.1 * (i + 1))
    tl.events(d.close(), 1.0)
    assert tl.usage == Usage(input_tokens=7, output_tokens=3)
    assert tl.output_tokens == 3
    assert tl.tokens_from_usage
    assert tl.stream_tokens == 2
    assert tl.saw_end_marker


# -- non-streaming --------------------------------------------------------------------------

CHAT_COMPLETION = b"""{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "o3-mini-2025-01-31",
  "choices": [
    {
      "index": 0,
      "message": {"role": "assistant", "content": "Paris.", "refusal": null, "annotations": []},
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 1163,
    "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
    "completion_tokens_details": {
      "reasoning_tokens": 32,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default",
  "system_fingerprint": "fp_42bfad963b"
}"""

# vLLM /v1/completions, n=2, non-streaming.
TEXT_COMPLETION = (
    b'{"id":"cmpl-7d2e9c1b0a3f4e5d8c6b","object":"text_completion","created":1733011200,'
    b'"model":"meta-llama/Llama-3.1-8B","choices":[{"index":0,"text":" Paris, France.","logprobs":null,'
    b'"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null},{"index":1,"text":" Paris is",'
    b'"logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],'
    b'"usage":{"prompt_tokens":6,"total_tokens":16,"completion_tokens":10,"prompt_tokens_details":null}}'
)


def test_parse_chat_completion():
    assert parse_openai_response(CHAT_COMPLETION) == [
        ResponseInfo(
            response_model="o3-mini-2025-01-31",
            response_id="chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
            finish_reasons=("stop",),
        ),
        Usage(input_tokens=1117, output_tokens=46, reasoning_tokens=32, cached_input_tokens=1024),
    ]


def test_parse_text_completion():
    assert parse_openai_response(TEXT_COMPLETION) == [
        ResponseInfo(
            response_model="meta-llama/Llama-3.1-8B",
            response_id="cmpl-7d2e9c1b0a3f4e5d8c6b",
            finish_reasons=("stop", "length"),
        ),
        Usage(input_tokens=6, output_tokens=10),
    ]


def test_parse_error_body():
    body = (
        b'{"error":{"message":"The model `gpt-5` does not exist or you do not have access to it.",'
        b'"type":"invalid_request_error","param":null,"code":"model_not_found"}}'
    )
    assert parse_openai_response(body) == [
        StreamError(
            "The model `gpt-5` does not exist or you do not have access to it.",
            "invalid_request_error",
            "model_not_found",
        )
    ]


def test_parse_old_vllm_error_body():
    body = b'{"object":"error","message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}'
    assert parse_openai_response(body) == [StreamError("The model `x` does not exist.", "NotFoundError", 404)]


def test_parse_response_without_usage():
    assert parse_openai_response(b'{"id":"x","model":"m","choices":[]}') == [
        ResponseInfo(response_model="m", response_id="x")
    ]


@pytest.mark.parametrize(
    "body,reason",
    [
        (b"", "response is not JSON"),
        (b"<html>502 Bad Gateway</html>", "response is not JSON"),
        (b"[]", "response is not a JSON object"),
        (b'"x"', "response is not a JSON object"),
    ],
)
def test_parse_response_not_an_object(body, reason):
    assert parse_openai_response(body) == [ParseError(reason)]


@pytest.mark.parametrize("choices", [b"5", b"true", b'"abc"', b'{"a":1}', b"[1,null]", b'[{"finish_reason":7}]'])
def test_parse_response_bad_choices_never_raise(choices):
    out = parse_openai_response(b'{"id":"x","choices":' + choices + b"}")
    assert out == [ResponseInfo(response_id="x")]


# -- properties: never raise ----------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=15,
)
KEYS = ["choices", "delta", "content", "text", "reasoning", "reasoning_content", "tool_calls", "function_call",
        "refusal", "finish_reason", "usage", "prompt_tokens", "completion_tokens", "prompt_tokens_details",
        "completion_tokens_details", "cached_tokens", "reasoning_tokens", "error", "object", "message",
        "type", "code", "model", "id", "index"]
# Objects built from the keys the dialect reads, so the fuzzer reaches the deep branches.
scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "x", "stop", "error"])


def _objects(kids):
    return st.fixed_dictionaries({}, optional={k: kids for k in KEYS})


nested = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | _objects(kids), max_leaves=8)
chunk_like = _objects(nested)


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10))
def test_any_bytes_never_raise(raw, cuts):
    run(split_at(raw, [c for c in cuts if c <= len(raw)]))
    parse_openai_response(raw)


@FAST
@given(st.lists(chunk_like, min_size=1, max_size=3), st.data())
def test_any_json_chunks_never_raise_and_split_invariant(objs, data):
    raw = sse(*(orjson.dumps(o) for o in objs))
    expected = run_whole(raw)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=10))
    assert run(split_at(raw, cuts)) == expected
    for o in objs:
        parse_openai_response(orjson.dumps(o))


TOP_KEYS = ["id", "model", "object", "choices", "usage", "error", "message", "type", "code"]
response_like = st.fixed_dictionaries({}, optional={k: scalars | nested for k in TOP_KEYS})


@FAST
@given(response_like)
def test_parse_response_any_json_never_raises(obj):
    out = parse_openai_response(orjson.dumps(obj))
    assert all(isinstance(e, (ResponseInfo, Usage, StreamError, ParseError)) for e in out)


def test_continuous_usage_counts_k_tokens_per_chunk():
    """vLLM continuous_usage_stats: usage on every chunk; a chunk whose completion_tokens
    grew by k (speculative decoding) counts as k tokens."""
    from sidecar.streams.protocols.openai import OpenAIStreamDialect

    def chunk(text, completion):
        return (
            b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"content":"' + text + b'"},"logprobs":null,"finish_reason":null}],'
            b'"usage":{"prompt_tokens":5,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (5 + completion, completion)
        )

    d = OpenAIStreamDialect()
    counts = []
    for text, total in ((b"a", 1), (b"bcd", 4), (b"e", 5), (b"fg", 7)):
        counts.append([e.count for e in d.feed(chunk(text, total)) if type(e) is Tokens])
    assert counts == [[1], [3], [1], [2]]


def test_usage_only_on_last_content_chunk_is_a_total_not_k_tokens():
    from sidecar.streams.protocols.openai import OpenAIStreamDialect

    d = OpenAIStreamDialect()
    plain = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
    last = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"y"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}\n\n'
    events = d.feed(plain + plain + last)
    assert [e.count for e in events if type(e) is Tokens] == [1, 1, 1]
