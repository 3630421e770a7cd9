"""OpenAI Chat Completions / Completions dialect over real wire bytes.

The fixtures are byte for byte what the servers write: vLLM serialises each chunk with
pydantic ``model_dump_json(exclude_unset=True)`` (compact, the role-only first chunk is
``{"role":"assistant","content":""}``, the final usage chunk has ``"choices":[]``), its
in-stream errors with ``json.dumps`` (spaced separators); OpenAI sends ``"usage":null`` on
every chunk when ``include_usage`` is set and the details objects in the last one.

Whole streams (tests/fixtures/streams/openai/, the ``built_*.txt`` ones from the builders
below) are driven every way by tests/unit/streams/test_dialect_conformance.py; this module keeps the
rules that are the OpenAI dialect's own.
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings

from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.events import (
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    TokenKind,
    Tokens,
    ToolCallDelta,
    Usage,
)
from sidecar.streams.protocols.openai import (
    OpenAIStreamDialect,
    parse_openai_response,
    usage_from_openai,
)
from tests.fixtures.streams.expected import ANSWER, DIALECTS, REASONING, TOOL
from tests.fixtures.streams.harness import load, objects_from, run_whole

FAST = settings(max_examples=200, deadline=None)

DONE = b"data: [DONE]\n\n"


def sse(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


# -- chunk builders -----------------------------------------------------------------------------

VLLM_ID = "chatcmpl-9b1f2e4c7d3a4c0e8f5b6a7d2c1e0f9a"
VLLM_MODEL = "Qwen/Qwen2.5-7B-Instruct"
_HEAD = b'{"id":"chatcmpl-9b1f2e4c7d3a4c0e8f5b6a7d2c1e0f9a","object":"chat.completion.chunk","created":1733011200,"model":"Qwen/Qwen2.5-7B-Instruct",'


def vllm_chunk(choices: bytes, tail: bytes = b"") -> bytes:
    return _HEAD + b'"choices":[' + choices + b"]" + tail + b"}"


def vllm_delta(delta: bytes, index: int = 0, finish: bytes = b"null") -> bytes:
    stop = b',"stop_reason":null' if finish != b"null" else b""
    return (
        b'{"index":%d,"delta":' % index
        + delta
        + b',"logprobs":null,"finish_reason":'
        + finish
        + stop
        + b"}"
    )


_CMPL_HEAD = b'{"id":"cmpl-4e0c2b9d8a7f4b61a3c5d7e9f1b2c3d4","object":"text_completion","created":1733011200,"model":"meta-llama/Llama-3.1-8B",'


def vllm_text(text: bytes, finish: bytes = b"null") -> bytes:
    return (
        _CMPL_HEAD
        + b'"choices":[{"index":0,"text":'
        + text
        + b',"logprobs":null,"finish_reason":'
        + finish
        + b',"stop_reason":null}]}'
    )


def read(data: bytes) -> list:
    return run_whole(OpenAIStreamDialect, data)


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
    assert read(sse(vllm_chunk(vllm_delta(b'{"role":"assistant","content":""}')))) == [
        ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID)
    ]


def test_role_chunk_with_content_is_a_token():
    # Some servers put the first token into the role chunk.
    assert one(b'{"role":"assistant","content":"Hi"}') == [ANSWER]


def test_refusal_is_answer():
    assert one(b'{"refusal":"I can\'t help with that."}') == [ANSWER]


def test_legacy_function_call_is_tool():
    assert one(b'{"function_call":{"name":"f","arguments":""}}') == [TOOL, ToolCallDelta(0)]


def test_reasoning_and_content_in_one_delta_reasoning_first():
    assert one(b'{"reasoning_content":"so","content":"Yes"}') == [REASONING, ANSWER]


def test_n2_in_one_chunk_counts_both():
    chunk = vllm_chunk(
        vllm_delta(b'{"content":"a"}', index=0) + b"," + vllm_delta(b'{"content":"b"}', index=1)
    )
    assert read(sse(chunk))[1:] == [Tokens(TokenKind.ANSWER, 2)]


def test_n2_mixed_kinds_in_one_chunk():
    chunk = vllm_chunk(
        vllm_delta(b'{"reasoning":"hm"}', index=0)
        + b","
        + vllm_delta(b'{"content":"b"}', index=1, finish=b'"stop"')
    )
    assert read(sse(chunk))[1:] == [REASONING, ANSWER, ResponseInfo(finish_reasons=("stop",))]


def test_completions_empty_text_is_not_a_token():
    assert read(sse(vllm_text(b'""')))[1:] == []


def test_response_info_only_once():
    events = read(load("openai", "built_vllm_chat.txt"))
    infos = [e for e in events if isinstance(e, ResponseInfo) and e.response_id is not None]
    assert infos == [ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID)]


def test_error_as_string():
    assert read(sse(b'{"error":"upstream overloaded"}')) == [StreamError("upstream overloaded")]


def test_old_vllm_error_wrapped_in_error_object():
    # vLLM 0.6-0.8 wrapped its ErrorResponse (which had "object":"error") in {"error": ...}.
    raw = sse(
        b'{"error": {"object": "error", "message": "Request aborted", "type": "BadRequestError", '
        b'"param": null, "code": 400}}'
    )
    assert read(raw) == [StreamError("Request aborted", "BadRequestError", 400)]


def test_openai_error_with_string_code():
    raw = sse(
        b'{"error":{"message":"The server had an error while processing your request.",'
        b'"type":"server_error","param":null,"code":"server_error"}}'
    )
    assert read(raw) == [
        StreamError(
            "The server had an error while processing your request.", "server_error", "server_error"
        )
    ]


def test_error_does_not_count_as_first_chunk_info():
    raw = sse(
        b'{"error":{"message":"x","type":"t","code":1}}', vllm_chunk(vllm_delta(b'{"content":"a"}'))
    )
    assert read(raw) == [
        StreamError("x", "t", 1),
        ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
        ANSWER,
    ]


def test_parse_error_then_later_events_still_parse():
    raw = (
        sse(b"{not json", b'"a string"', b"null", vllm_chunk(vllm_delta(b'{"content":"x"}'))) + DONE
    )
    assert read(raw) == [
        ParseError("data is not JSON"),
        ParseError("data is not a JSON object"),
        ParseError("data is not a JSON object"),
        ResponseInfo(response_model=VLLM_MODEL, response_id=VLLM_ID),
        ANSWER,
        StreamEnd(),
    ]


def test_invalid_utf8_is_a_parse_error():
    assert read(sse(b'{"choices":[{"delta":{"content":"\xff\xfe"}}]}')) == [
        ParseError("data is not JSON")
    ]


def test_bad_shapes_are_parse_errors_not_exceptions():
    raw = sse(b'{"choices":"nope"}', b'{"choices":[1, {"delta":{"content":"x"}}]}')
    assert read(raw) == [
        ParseError("choices is not a list"),
        ParseError("choice is not an object"),
        ANSWER,
    ]


def test_blank_data_event_is_ignored():
    assert read(b"data:\n\ndata: \n\n" + DONE) == [StreamEnd()]


def test_sse_overflow_becomes_parse_error_and_stream_resumes():
    d = OpenAIStreamDialect(max_line_bytes=256)
    huge = sse(b'{"choices":[{"delta":{"content":"' + b"x" * 1000 + b'"}}]}')
    out = (
        d.feed(huge)
        + d.feed(sse(vllm_chunk(vllm_delta(b'{"content":"y"}'))))
        + d.feed(DONE)
        + d.close()
    )
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
    assert u == Usage(
        input_tokens=100, output_tokens=50, reasoning_tokens=30, cached_input_tokens=64
    )


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
    for i, event in enumerate(
        load("openai", "built_vllm_continuous_usage.txt").split(b"\n\n")[:-1]
    ):
        tl.events(d.feed(event + b"\n\n"), 0.1 * (i + 1))
    tl.events(d.close(), 1.0)
    assert tl.usage == Usage(input_tokens=7, output_tokens=3)
    assert tl.output_tokens == 3
    assert tl.tokens_from_usage
    # Two chunks with text, then the finishing chunk with "content": "" whose usage grew to
    # 3: vLLM's last token had no text of its own, and it arrived with that chunk.
    assert tl.stream_tokens == 3 and len(tl.gaps) == 2 and tl.last_token == pytest.approx(0.4)
    assert tl.saw_end_marker


def _timeline_of(body: bytes) -> RequestTimeline:
    d = OpenAIStreamDialect()
    tl = RequestTimeline(start=0.0)
    tl.response_started(0.01, 200, streamed=True)
    for i, event in enumerate(body.split(b"\n\n")[:-1]):
        tl.events(d.feed(event + b"\n\n"), 0.1 * (i + 1))
    tl.events(d.close(), 1.0)
    return tl


def _chunk(
    delta: str, finish: str | None = None, usage: int | None = None, legacy: bool = False
) -> bytes:
    choice = {"index": 0, "text": delta} if legacy else {"index": 0, "delta": {"content": delta}}
    choice["finish_reason"] = finish
    event: dict = {"choices": [choice]}
    if usage is not None:
        event["usage"] = {"prompt_tokens": 1, "completion_tokens": usage, "total_tokens": usage + 1}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


@pytest.mark.parametrize("legacy", [False, True], ids=["chat", "completions"])
@pytest.mark.parametrize(
    ("usage", "counted"),
    [
        (4, 4),  # vLLM: the usage counts the token the finishing chunk stands for
        (3, 3),  # llama.cpp, transformers serve: a bare terminator, not a token
        (None, 3),  # no usage: nothing says it was a token
    ],
)
def test_a_finishing_chunk_without_text_is_a_token_when_the_usage_says_so(legacy, usage, counted):
    final_usage = (
        b""
        if usage is None
        else b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d,"total_tokens":%d}}\n\n'
        % (usage, usage + 1)
    )
    body = (
        _chunk("a", legacy=legacy) + _chunk("b", legacy=legacy) + _chunk("c", legacy=legacy)
        + _chunk("", "stop", legacy=legacy) + final_usage + b"data: [DONE]\n\n"
    )  # fmt: skip
    tl = _timeline_of(body)
    assert tl.stream_tokens == counted and len(tl.gaps) == counted - 1
    assert tl.last_token == pytest.approx(0.4 if counted == 4 else 0.3)  # when it arrived
    if usage is not None:
        assert tl.output_tokens == usage
        assert tl.tpot == pytest.approx((tl.last_token - tl.first_token) / (usage - 1))


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
    assert parse_openai_response(body) == [
        StreamError("The model `x` does not exist.", "NotFoundError", 404)
    ]


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


@pytest.mark.parametrize(
    "choices", [b"5", b"true", b'"abc"', b'{"a":1}', b"[1,null]", b'[{"finish_reason":7}]']
)
def test_parse_response_bad_choices_never_raise(choices):
    out = parse_openai_response(b'{"id":"x","choices":' + choices + b"}")
    assert out == [ResponseInfo(response_id="x")]


# -- properties: never raise ----------------------------------------------------------------
# (any bytes, any JSON chunks through the stream reader:
# tests/unit/streams/test_dialect_conformance.py)

TOP_KEYS = ["id", "model", "object", "choices", "usage", "error", "message", "type", "code"]
# a whole response body, nested with the keys the chunk reader knows too, to reach deep branches
response_like = objects_from(
    sorted({*TOP_KEYS, *next(d for d in DIALECTS if d.folder == "openai").keys})
)


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
            b'"usage":{"prompt_tokens":5,"total_tokens":%d,"completion_tokens":%d}}\n\n'
            % (5 + completion, completion)
        )

    d = OpenAIStreamDialect()
    counts = []
    for text, total in ((b"a", 1), (b"bcd", 4), (b"e", 5), (b"fg", 7)):
        counts.append([e.count for e in d.feed(chunk(text, total)) if type(e) is Tokens])
    assert counts == [[1], [3], [1], [2]]


def test_usage_only_on_last_content_chunk_is_a_total_not_k_tokens():
    from sidecar.streams.protocols.openai import OpenAIStreamDialect

    d = OpenAIStreamDialect()
    plain = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
    )
    last = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"y"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}\n\n'
    events = d.feed(plain + plain + last)
    assert [e.count for e in events if type(e) is Tokens] == [1, 1, 1]
