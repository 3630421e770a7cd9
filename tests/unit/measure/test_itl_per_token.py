"""ITL is one observation per token, also for the token whose bytes are not a character yet.

vLLM streams one chunk per decode step; when a step's token ends inside a multi-byte
character (an emoji, most CJK text with a byte-level BPE), the chunk's ``content`` is ``""``
and the next chunk carries the whole character (vllm/entrypoints/openai/chat_completion/
serving.py: ``DeltaMessage(content=delta_text)`` with ``delta_text == ""`` while
``output.token_ids`` is not empty). Skipping that chunk merges two gaps into one: the ITL
count falls below the token count and a 2x gap shows up in the tail for every such
character. vLLM's own benchmark counts every chunk (``output.itl.append`` per chunk that has
choices); aiperf divides the decode time by the token count. The sidecar counts the chunk as
a token, but never as the first one (TTFT starts at text), nor a role or finish chunk.
"""

from __future__ import annotations

import pytest

from sidecar.base.outcomes import Outcome
from sidecar.base.routes import match_route
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.timeline import RequestTimeline


def chunk(delta: str, finish: str = "null") -> bytes:
    return (
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":'
        + delta.encode()
        + b',"logprobs":null,"finish_reason":'
        + finish.encode()
        + b"}]}\n\n"
    )


ROLE = chunk('{"role":"assistant","content":""}')
EMPTY = chunk('{"content":""}')
END = chunk("{}", '"stop"')
USAGE = b'data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n'
DONE = b"data: [DONE]\n\n"


def replay(chunks: list[bytes]) -> RequestTimeline:
    """One chunk per read, 10 ms apart, starting at t=0.1."""
    route, _ = match_route("/v1/chat/completions")
    t = RequestTimeline(0.0, "POST", route.template, "m")
    observer = ResponseObserver(route, t, "text/event-stream")
    t.response_started(0.0, 200, observer.streaming)
    for i, c in enumerate(chunks):
        observer.feed(c, 0.1 + 0.01 * i)
    observer.close(1.0)
    t.finish(Outcome.OK, 1.0)
    return t


def test_a_token_that_is_not_a_character_yet_is_one_itl_observation():
    # role, "H", (first half of "é"), "é", "!", finish, usage: 4 tokens as vLLM counts them
    t = replay(
        [
            ROLE,
            chunk('{"content":"H"}'),
            EMPTY,
            chunk('{"content":"\\u00e9"}'),
            chunk('{"content":"!"}'),
            END,
            USAGE,
            DONE,
        ]
    )
    assert t.stream_tokens == 4 and t.output_tokens == 4
    assert len(t.gaps) == 3  # one per token after the first
    assert list(t.gaps) == pytest.approx(
        [0.01, 0.01, 0.01]
    )  # no 2x gap where the character was split
    assert t.ttft == pytest.approx(0.11)  # the role chunk is not a token


def test_empty_content_before_the_first_token_does_not_start_ttft():
    t = replay([ROLE, EMPTY, chunk('{"content":"Hi"}'), END, DONE])
    assert t.ttft == pytest.approx(0.12)
    assert t.stream_tokens == 1


@pytest.mark.parametrize(
    "delta,finish",
    [
        ('{"role":"assistant","content":""}', "null"),
        ('{"content":""}', '"stop"'),
        ("{}", "null"),
        ('{"content":null}', "null"),
    ],
    ids=["role", "finish", "no-content", "null-content"],
)
def test_role_finish_and_contentless_chunks_are_not_tokens(delta, finish):
    t = replay(
        [chunk('{"content":"a"}'), chunk(delta, finish), chunk('{"content":"b"}'), END, DONE]
    )
    assert t.stream_tokens == 2 and len(t.gaps) == 1


def test_empty_content_beside_reasoning_counts_once():
    t = replay(
        [chunk('{"content":"a"}'), chunk('{"content":"","reasoning_content":"r"}'), END, DONE]
    )
    assert (t.stream_tokens, t.reasoning_stream_tokens) == (2, 1)
