"""The request clock with scripted time: wire bytes -> dialect -> timeline -> exact figures.

The timeline never reads a clock itself; each test plays a script of (arrival time, bytes)
through the OpenAI dialect and checks every figure to the float.
"""

from __future__ import annotations

import orjson
import pytest

from sidecar.base.outcomes import Outcome, Verdict
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.events import ParseError, StreamError, TokenKind, Tokens, Usage
from sidecar.streams.protocols.openai import OpenAIStreamDialect, parse_openai_response
from tests.support.timelines import per_token_gaps

START = 100.0
HEADERS = 100.05
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def chunk(
    delta: dict | None = None, finish: str | None = None, usage: dict | None = None, choices=True
) -> bytes:
    """One vLLM-shaped ``chat.completion.chunk`` SSE event."""
    obj: dict = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1733011200,
        "model": MODEL,
    }
    obj["choices"] = (
        [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]
        if choices
        else []
    )
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + orjson.dumps(obj) + b"\n\n"


ROLE = chunk({"role": "assistant", "content": ""})
DONE = b"data: [DONE]\n\n"


def content(text: str) -> bytes:
    return chunk({"content": text})


def reasoning(text: str) -> bytes:
    return chunk({"reasoning_content": text})


def tool(args: str) -> bytes:
    return chunk({"tool_calls": [{"index": 0, "function": {"arguments": args}}]})


def usage_chunk(prompt: int, completion: int, **extra) -> bytes:
    return chunk(
        usage={
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            **extra,
        },
        choices=False,
    )


def play(
    script: list[tuple[float, bytes]], end: float | None, outcome: Outcome = Outcome.OK
) -> RequestTimeline:
    """Headers at HEADERS, each read at its scripted time, then finish at ``end``."""
    tl = RequestTimeline(start=START, method="POST", route="/v1/chat/completions", model=MODEL)
    tl.response_started(HEADERS, 200, streamed=True)
    dialect = OpenAIStreamDialect()
    for now, data in script:
        tl.events(dialect.feed(data), now)
    if end is not None:
        tl.events(dialect.close(), end)
        assert tl.finish(outcome, end)
    return tl


# The basic vLLM stream: role chunk with the headers, five answer tokens, a finish chunk,
# the usage chunk and [DONE] in the last read.
BASIC = [
    (100.05, ROLE),
    (100.30, content("The")),
    (100.35, content(" capital")),
    (100.42, content(" is")),
    (100.50, content(" Paris")),
    (100.62, content(".")),
    (100.63, chunk({"content": ""}, finish="stop") + usage_chunk(14, 5) + DONE),
]


def test_basic_stream_figures():
    tl = play(BASIC, end=100.64)
    assert tl.outcome is Outcome.OK and tl.finished
    assert tl.streamed and tl.status == 200
    assert tl.ttfb == pytest.approx(0.05)
    assert tl.ttft == pytest.approx(0.30)
    assert tl.first_token_kind is TokenKind.ANSWER
    assert tl.ttfat is None  # the first token was already an answer
    assert list(tl.gaps) == pytest.approx([0.05, 0.07, 0.08, 0.12])
    assert tl.decode_seconds == pytest.approx(0.32)
    assert tl.output_tokens == 5 and tl.tokens_from_usage
    assert tl.stream_tokens == 5
    assert tl.input_tokens == 14
    assert tl.tpot == pytest.approx(0.32 / 4)
    assert tl.tokens_per_second == pytest.approx(4 / 0.32)
    assert tl.e2e == pytest.approx(0.64)
    assert tl.response_model == MODEL and tl.response_id == "chatcmpl-1"
    assert tl.finish_reasons == ["stop"]
    assert tl.saw_end_marker
    assert tl.parse_errors == 0
    assert tl.stream_error is None and tl.error_type is None


def test_tpot_uses_usage_count_when_it_differs_from_the_stream():
    # Speculative decoding / multi-token deltas: 5 deltas carried 9 tokens.
    script = BASIC[:-1] + [
        (100.63, chunk({"content": ""}, finish="stop") + usage_chunk(14, 9) + DONE)
    ]
    tl = play(script, end=100.64)
    assert tl.output_tokens == 9 and tl.tokens_from_usage
    assert tl.stream_tokens == 5
    assert tl.tpot == pytest.approx(0.32 / 8)
    assert tl.tokens_per_second == pytest.approx(8 / 0.32)
    assert len(tl.gaps) == 4  # gaps are what the client saw, not the usage count


def test_tpot_falls_back_to_stream_count_without_usage():
    script = BASIC[:-1] + [(100.63, chunk({"content": ""}, finish="stop") + DONE)]
    tl = play(script, end=100.64)
    assert tl.usage is None
    assert not tl.tokens_from_usage
    assert tl.output_tokens == 5
    assert tl.input_tokens is None
    assert tl.tpot == pytest.approx(0.32 / 4)
    assert tl.tokens_per_second == pytest.approx(4 / 0.32)


def test_usage_without_completion_tokens_falls_back_to_stream_count():
    script = BASIC[:-1] + [(100.63, chunk(usage={"prompt_tokens": 14}, choices=False) + DONE)]
    tl = play(script, end=100.64)
    assert tl.usage == Usage(input_tokens=14)
    assert not tl.tokens_from_usage
    assert tl.output_tokens == 5


def test_reasoning_first_gives_ttfat():
    script = [
        (100.05, ROLE),
        (100.20, reasoning("Okay")),
        (100.25, reasoning(", so")),
        (100.30, reasoning(" Paris")),
        (100.50, content("Paris")),
        (100.55, content(".")),
        (100.56, usage_chunk(10, 5, completion_tokens_details={"reasoning_tokens": 3}) + DONE),
    ]
    tl = play(script, end=100.60)
    assert tl.ttft == pytest.approx(0.20)
    assert tl.first_token_kind is TokenKind.REASONING
    assert tl.ttfat == pytest.approx(0.50)
    assert list(tl.gaps) == pytest.approx([0.05, 0.05, 0.20, 0.05])
    assert tl.reasoning_tokens == 3
    assert tl.reasoning_stream_tokens == 3
    assert tl.tpot == pytest.approx(0.35 / 4)
    assert tl.e2e == pytest.approx(0.60)


def test_reasoning_tokens_from_stream_without_usage_details():
    script = [(100.2, reasoning("a")), (100.3, reasoning("b")), (100.4, content("c"))]
    tl = play(script, end=100.5)
    assert tl.reasoning_tokens == 2
    assert tl.output_tokens == 3


def test_tool_call_first_gives_ttfat():
    script = [
        (100.05, ROLE),
        (100.40, tool('{"city": "')),
        (100.45, tool("Paris")),
        (100.50, tool('"}')),
        (100.90, content("Calling the tool.")),
    ]
    tl = play(script, end=101.0)
    assert tl.ttft == pytest.approx(0.40)
    assert tl.first_token_kind is TokenKind.TOOL
    assert tl.ttfat == pytest.approx(0.90)
    assert list(tl.gaps) == pytest.approx([0.05, 0.05, 0.40])


def test_tool_only_has_no_ttfat():
    tl = play([(100.4, tool("{")), (100.5, tool("}"))], end=100.6)
    assert tl.ttft == pytest.approx(0.4)
    assert tl.ttfat is None
    assert tl.reasoning_tokens is None


def test_same_read_tokens_have_zero_gap():
    script = [(100.30, content("a")), (100.40, content("b") + content("c")), (100.50, content("d"))]
    tl = play(script, end=100.5)
    assert list(tl.gaps) == pytest.approx([0.10, 0.0, 0.10])
    assert tl.stream_tokens == 4
    assert tl.tpot == pytest.approx(0.20 / 3)


def test_tokens_count_k_splits_the_gap_into_k_observations():
    tl = RequestTimeline(start=START)
    tl.response_started(HEADERS, 200, streamed=True)
    tl.events([Tokens(TokenKind.ANSWER, 3)], 100.3)
    assert per_token_gaps(tl) == [0.0, 0.0]  # the first event's tokens arrived together
    tl.events([Tokens(TokenKind.ANSWER, 4)], 100.4)
    assert per_token_gaps(tl) == pytest.approx([0.0, 0.0, 0.025, 0.025, 0.025, 0.025])
    tl.events([Tokens(TokenKind.ANSWER, 1)], 100.6)
    assert per_token_gaps(tl) == pytest.approx([0.0, 0.0, 0.025, 0.025, 0.025, 0.025, 0.2])
    assert sum(per_token_gaps(tl)) == pytest.approx(tl.decode_seconds)
    assert tl.stream_tokens == 8
    assert tl.gap_count == len(per_token_gaps(tl)) == tl.stream_tokens - 1
    assert len(tl.gaps) == 3  # one entry per event after the first's, whatever its count
    assert tl.ttft == pytest.approx(0.3)
    assert tl.tpot == pytest.approx(0.3 / 7)


def test_a_hostile_token_count_in_one_event_costs_one_entry():
    """An upstream whose per-chunk usage claims millions of tokens in one event: the record
    holds one entry standing for them, not millions (memory and time O(1) per event)."""
    tl = RequestTimeline(start=START)
    tl.response_started(HEADERS, 200, streamed=True)
    tl.events([Tokens(TokenKind.ANSWER, 1)], 100.3)
    for i in range(100):  # alternating claims repeat the cost on every event, were it per token
        tl.events([Tokens(TokenKind.ANSWER, 20_000_000 if i % 2 else 1)], 100.4 + i / 100)
    assert len(tl.gaps) == len(tl.gap_streams) == 100
    assert tl.gap_count == 50 * 20_000_000 + 50 == tl.stream_tokens - 1
    assert tl.gap_runs() == [(i, 20_000_000) for i in range(1, 100, 2)]
    assert len(tl.chunk_gaps()) == 100


def test_chunk_gaps_are_one_per_event_after_the_first():
    """OTel's time_per_output_chunk is per chunk, ITL per token: an event of k tokens is k
    ITL observations but one chunk gap, the whole time since the previous event."""
    tl = RequestTimeline(start=START)
    tl.response_started(HEADERS, 200, streamed=True)
    tl.events([Tokens(TokenKind.ANSWER, 3)], 100.3)
    assert tl.chunk_gaps() == []  # the first chunk has no gap, however many tokens it held
    tl.events([Tokens(TokenKind.ANSWER, 1)], 100.35)
    tl.events([Tokens(TokenKind.ANSWER, 4)], 100.45)
    tl.events([Tokens(TokenKind.REASONING, 1), Tokens(TokenKind.ANSWER, 2)], 100.6)
    tl.events([Tokens(TokenKind.ANSWER, 1)], 100.9)
    assert tl.chunk_gaps() == pytest.approx([0.05, 0.1, 0.15, 0.0, 0.3])
    assert sum(tl.chunk_gaps()) == pytest.approx(sum(per_token_gaps(tl)))
    assert tl.gap_count == tl.stream_tokens - 1 == 11


def test_chunk_gaps_equal_gaps_for_one_token_events():
    tl = play(BASIC, end=100.64)
    assert tl.chunk_gaps() == list(tl.gaps) and tl.chunk_gaps()


def test_gap_count_is_tokens_minus_one():
    tl = play(BASIC, end=100.64)
    assert len(tl.gaps) == tl.stream_tokens - 1


def test_single_token_has_no_tpot():
    tl = play([(100.3, content("Yes")), (100.31, usage_chunk(3, 1) + DONE)], end=100.32)
    assert tl.ttft == pytest.approx(0.3)
    assert list(tl.gaps) == []
    assert tl.decode_seconds == 0.0
    assert tl.tpot is None and tl.tokens_per_second is None


def test_all_tokens_in_one_read():
    tl = play([(100.3, content("a") + content("b") + content("c"))], end=100.4)
    assert list(tl.gaps) == [0.0, 0.0]
    assert tl.tpot == 0.0
    assert tl.tokens_per_second is None  # no time passed: speed is undefined, not infinite


def test_finish_is_once_only():
    tl = play(BASIC, end=100.64)
    before = (tl.outcome, tl.end, tl.error_type, tl.e2e)
    assert tl.finish(Outcome.ERROR, 105.0, "late") is False
    assert tl.finish(Outcome.CANCELLED, 106.0) is False
    assert (tl.outcome, tl.end, tl.error_type, tl.e2e) == before
    assert tl.outcome is Outcome.OK and tl.e2e == pytest.approx(0.64)


def test_in_stream_error_turns_ok_into_error():
    script = [
        (100.05, ROLE),
        (100.30, content("Par")),
        (
            100.40,
            b'data: {"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}\n\n'
            + DONE,
        ),
    ]
    tl = play(script, end=100.41)
    assert tl.outcome is Outcome.ERROR
    assert tl.error_type == "stream_error"
    assert tl.stream_error == StreamError("boom", "InternalServerError", 500)
    assert tl.ttft == pytest.approx(0.30)
    assert tl.e2e == pytest.approx(0.41)


def test_first_stream_error_is_kept():
    tl = RequestTimeline(start=START)
    tl.events([StreamError("first"), StreamError("second")], 100.1)
    assert tl.stream_error == StreamError("first")


def test_an_ok_answer_with_a_stream_error_is_a_stream_error_whatever_else_was_said():
    tl = RequestTimeline(start=START)
    tl.events([StreamError("boom")], 100.1)
    assert tl.finish(Outcome.OK, 100.2, "upstream_said_so")  # ok has no error type of its own
    assert tl.outcome is Outcome.ERROR and tl.error_type == "stream_error"
    assert tl.verdict is Verdict.STREAM_ERROR


def test_error_outcome_stays_error():
    tl = play(BASIC[:3], end=None)
    assert tl.finish(Outcome.ERROR, 100.5, "upstream_disconnected")
    assert tl.outcome is Outcome.ERROR and tl.error_type == "upstream_disconnected"
    assert tl.verdict is Verdict.UPSTREAM_DISCONNECTED


def test_a_cause_outside_the_vocabulary_is_other_on_the_record_too():
    tl = play(BASIC[:3], end=None)
    assert tl.finish(Outcome.ERROR, 100.5, "upstream_reset")
    assert tl.verdict is Verdict.OTHER_ERROR and tl.error_type == "other"


def test_cancelled_keeps_partial_figures():
    tl = play(BASIC[:4], end=None)  # client went away after three tokens
    assert tl.finish(Outcome.CANCELLED, 100.45)
    assert tl.outcome is Outcome.CANCELLED
    assert tl.ttfb == pytest.approx(0.05)
    assert tl.ttft == pytest.approx(0.30)
    assert list(tl.gaps) == pytest.approx([0.05, 0.07])
    assert tl.output_tokens == 3 and not tl.tokens_from_usage
    assert tl.tpot == pytest.approx(0.12 / 2)
    assert tl.e2e == pytest.approx(0.45)
    assert not tl.saw_end_marker


def test_cancelled_with_stream_error_stays_cancelled():
    tl = RequestTimeline(start=START)
    tl.events([StreamError("boom")], 100.1)
    assert tl.finish(Verdict.CLIENT_SEND_TIMEOUT, 100.2)
    assert tl.outcome is Outcome.CANCELLED and tl.error_type == "client_send_timeout"


def test_continuous_usage_last_wins():
    script = [
        (
            100.05,
            chunk(
                {"role": "assistant", "content": ""},
                usage={"prompt_tokens": 7, "completion_tokens": 0},
            ),
        ),
        (100.30, chunk({"content": "A"}, usage={"prompt_tokens": 7, "completion_tokens": 1})),
        (100.40, chunk({"content": "B"}, usage={"prompt_tokens": 7, "completion_tokens": 2})),
        (
            100.50,
            chunk({"content": "C"}, usage={"prompt_tokens": 7, "completion_tokens": 3}) + DONE,
        ),
    ]
    tl = play(script, end=100.5)
    assert tl.usage == Usage(input_tokens=7, output_tokens=3)
    assert tl.tpot == pytest.approx(0.2 / 2)


def test_cancelled_with_continuous_usage_uses_the_last_seen_count():
    script = [
        (100.30, chunk({"content": "A"}, usage={"prompt_tokens": 7, "completion_tokens": 1})),
        (100.40, chunk({"content": "B"}, usage={"prompt_tokens": 7, "completion_tokens": 2})),
    ]
    tl = play(script, end=None)
    tl.finish(Outcome.CANCELLED, 100.45)
    assert tl.output_tokens == 2 and tl.tokens_from_usage


def test_parse_errors_counted_and_measurement_continues():
    script = [(100.3, content("a")), (100.35, b"data: {oops\n\n"), (100.4, content("b"))]
    tl = play(script, end=100.5)
    assert tl.parse_errors == 1
    assert tl.stream_tokens == 2
    assert list(tl.gaps) == pytest.approx([0.1])


def test_response_started_only_once():
    tl = RequestTimeline(start=START)
    tl.response_started(100.05, 200, streamed=True)
    tl.response_started(100.07, 500, streamed=False)
    assert tl.ttfb == pytest.approx(0.05) and tl.status == 200 and tl.streamed


def test_nothing_known_before_events():
    tl = RequestTimeline(start=START)
    assert tl.ttfb is None and tl.ttft is None and tl.ttfat is None and tl.e2e is None
    assert tl.decode_seconds is None and tl.tpot is None and tl.tokens_per_second is None
    assert tl.output_tokens is None and tl.input_tokens is None
    assert tl.reasoning_tokens is None and tl.cached_input_tokens is None
    assert not tl.finished and tl.outcome is None


def test_streamed_request_with_no_tokens():
    tl = play([(100.05, ROLE), (100.1, DONE)], end=100.1)
    assert tl.ttft is None and tl.tpot is None
    assert tl.output_tokens == 0
    assert list(tl.gaps) == []
    assert tl.e2e == pytest.approx(0.1)


def test_non_streaming_response_figures():
    body = orjson.dumps(
        {
            "id": "chatcmpl-9",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Paris."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 20,
                "completion_tokens": 12,
                "total_tokens": 32,
                "prompt_tokens_details": {"cached_tokens": 16},
                "completion_tokens_details": {"reasoning_tokens": 4},
            },
        }
    )
    tl = RequestTimeline(start=START, method="POST", route="/v1/chat/completions", model=MODEL)
    tl.response_started(101.2, 200, streamed=False)
    tl.events(parse_openai_response(body), 101.25)
    assert tl.finish(Outcome.OK, 101.25)
    assert tl.ttfb == pytest.approx(1.2)
    assert tl.e2e == pytest.approx(1.25)
    assert tl.ttft is None and tl.tpot is None and tl.tokens_per_second is None
    assert tl.output_tokens == 12 and tl.input_tokens == 20
    assert tl.cached_input_tokens == 16 and tl.reasoning_tokens == 4
    assert tl.finish_reasons == ["stop"]
    assert tl.response_id == "chatcmpl-9"


def test_non_streaming_without_usage_has_no_token_count():
    tl = RequestTimeline(start=START)
    tl.response_started(100.5, 200, streamed=False)
    tl.events(parse_openai_response(b'{"id":"x","choices":[]}'), 100.6)
    assert tl.output_tokens is None


def test_parse_error_event_counted():
    tl = RequestTimeline(start=START)
    tl.events([ParseError("x"), ParseError("y")], 100.1)
    assert tl.parse_errors == 2
