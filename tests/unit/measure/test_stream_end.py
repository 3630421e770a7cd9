"""A stream that ends cleanly before generation finished is not ``ok``; one whose content
says generation finished is, end marker or not; a client that leaves after that got its
whole answer (``ok``, not ``cancelled``).

For every dialect, a recorded-shape stream is replayed through the observer and the timeline
twice: whole (the end marker arrives: ``ok``) and cut just before the event that carries
the marker (what a server that died between two chunks leaves: ``error`` /
``upstream_stream_truncated``). The cut is found by the dialect itself: the longest prefix
of whole events that has not yet produced a :class:`StreamEnd`.
"""

from __future__ import annotations

import pytest

from sidecar.base.outcomes import CLIENT_DISCONNECTED, STREAM_TRUNCATED, Outcome
from sidecar.base.routes import ROUTES, match_route
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.dialects import dialect_of
from sidecar.streams.protocols.openai import OpenAIStreamDialect
from tests.fixtures.streams.harness import (
    END_MARKER_STREAMS,
    FINISHED_BEFORE_MARKER,
    cut_before_marker,
    load,
    up_to_generation_done,
    without_marker,
)

STREAMS = END_MARKER_STREAMS
IDS = [f"{d}/{n}" for d, n, _, _ in STREAMS]


def cut(path: str, raw: bytes, ndjson: bool) -> bytes:
    return cut_before_marker(dialect_of(match_route(path)[0]).stream, raw, ndjson)


def replay(
    path: str,
    content_type: str,
    chunks: list[bytes],
    status: int = 200,
    method: str = "POST",
    outcome: Outcome | None = None,
    error_type: str | None = None,
) -> RequestTimeline:
    route, model = match_route(path)
    t = RequestTimeline(0.0, method, route.template, model or "m")
    observer = ResponseObserver(route, t, content_type)
    t.response_started(0.0, status, observer.streaming)
    for i, chunk in enumerate(chunks):
        observer.feed(chunk, 0.01 * (i + 1))
    observer.close(1.0)
    if outcome is not None:
        t.finish(outcome, 1.0, error_type)
    else:
        t.finish(
            Outcome.OK if status < 500 else Outcome.ERROR,
            1.0,
            None if status < 500 else "upstream_status",
        )
    return t


@pytest.mark.parametrize("where,name,path,ctype", STREAMS, ids=IDS)
def test_whole_stream_is_ok(where, name, path, ctype):
    raw = load(where, name)
    t = replay(path, ctype, [raw])
    assert t.streamed and t.saw_end_marker
    assert (t.outcome, t.error_type) == (Outcome.OK, None)


@pytest.mark.parametrize("where,name,path,ctype", STREAMS, ids=IDS)
def test_clean_end_without_marker_is_truncated(where, name, path, ctype):
    raw = load(where, name)
    short = cut(path, raw, ctype == "application/x-ndjson")
    assert 0 < len(short) < len(raw)
    t = replay(path, ctype, [short[i : i + 5] for i in range(0, len(short), 5)])
    assert not t.saw_end_marker
    assert (t.outcome, t.error_type) == (Outcome.ERROR, STREAM_TRUNCATED)


def test_empty_200_stream_is_truncated():
    t = replay("/v1/chat/completions", "text/event-stream", [])
    assert (t.outcome, t.error_type) == (Outcome.ERROR, STREAM_TRUNCATED)


def test_triton_has_no_marker_so_a_clean_end_is_ok():
    raw = load("triton", "trtllm_ensemble.txt")
    t = replay(
        "/v2/models/ensemble/generate_stream",
        "text/event-stream; charset=utf-8",
        [raw[: len(raw) // 2]],
    )
    assert t.stream_tokens > 0 and not t.end_marker_expected
    assert t.outcome is Outcome.OK


@pytest.mark.parametrize(
    "status,method,outcome",
    [
        (204, "POST", Outcome.OK),
        (200, "HEAD", Outcome.OK),
        (429, "POST", Outcome.OK),
        (503, "POST", Outcome.ERROR),
    ],
)
def test_bodiless_and_error_statuses_keep_their_outcome(status, method, outcome):
    t = replay("/v1/chat/completions", "text/event-stream", [], status=status, method=method)
    assert t.outcome is outcome and t.error_type != STREAM_TRUNCATED


def test_error_event_wins_over_truncation():
    """An in-stream error then a clean end: the server said why, so that is the cause."""
    t = replay(
        "/v1/chat/completions",
        "text/event-stream",
        [b'data: {"error":{"message":"boom","type":"x"}}\n\n'],
    )
    assert (t.outcome, t.error_type) == (Outcome.ERROR, "stream_error")


def test_compressed_stream_is_not_judged():
    """Bytes the sidecar cannot read (gzip) say nothing about a marker: left ok."""
    route = ROUTES["/v1/chat/completions"]
    t = RequestTimeline(0.0, "POST", route.template, "m")
    observer = ResponseObserver(route, t, "text/event-stream", content_encoding="gzip")
    t.response_started(0.0, 200, observer.streaming)
    observer.feed(b"\x1f\x8b\x08\x00garbage", 0.1)
    observer.close(0.2)
    t.finish(Outcome.OK, 0.2)
    assert t.outcome is Outcome.OK


def test_stream_the_observer_gave_up_on_is_not_judged(monkeypatch):
    """A dialect bug stops the reading; a missing marker is then unknown, not missing."""
    route = ROUTES["/v1/chat/completions"]
    t = RequestTimeline(0.0, "POST", route.template, "m")
    observer = ResponseObserver(route, t, "text/event-stream")
    t.response_started(0.0, 200, observer.streaming)

    def boom(self, obj, event, out):
        raise RuntimeError("dialect bug")

    monkeypatch.setattr(OpenAIStreamDialect, "_object", boom)
    observer.feed(b"data: {}\n\n", 0.1)
    observer.close(0.2)
    t.finish(Outcome.OK, 0.2)
    assert (t.outcome, t.parse_errors) == (Outcome.OK, 1)


def test_non_streamed_json_needs_no_marker():
    route = ROUTES["/v1/chat/completions"]
    t = RequestTimeline(0.0, "POST", route.template, "m")
    observer = ResponseObserver(route, t, "application/json")
    t.response_started(0.0, 200, observer.streaming)
    observer.feed(
        b'{"id":"x","model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}',
        0.1,
    )
    observer.close(0.2)
    t.finish(Outcome.OK, 0.2)
    assert t.outcome is Outcome.OK


# -- generation finished without the marker (transformers serve never sends [DONE]) ----------

FINISHED_IDS = [f"{d}/{n}" for d, n, _, _ in FINISHED_BEFORE_MARKER]


@pytest.mark.parametrize("where,name,path,ctype", FINISHED_BEFORE_MARKER, ids=FINISHED_IDS)
def test_finished_stream_without_marker_is_ok(where, name, path, ctype):
    """Every choice has its finish_reason (Anthropic: the stop_reason), no end marker: ok."""
    short = without_marker(dialect_of(match_route(path)[0]).stream, load(where, name), False)
    t = replay(path, ctype, [short[i : i + 7] for i in range(0, len(short), 7)])
    assert not t.saw_end_marker and t.generation_done
    assert (t.outcome, t.error_type) == (Outcome.OK, None)


# transformers serve 5.23's shape: no role chunk, finish_reason and usage on the last chunk.
_TRANSFORMERS_SERVE = (
    b'data: {"id":"r","choices":[{"delta":{"content":"He"},"index":0}],"created":1,"model":"m@main",'
    b'"object":"chat.completion.chunk","system_fingerprint":""}\n\n'
    b'data: {"id":"r","choices":[{"delta":{"content":"llo"},"index":0}],"created":1,"model":"m@main",'
    b'"object":"chat.completion.chunk","system_fingerprint":""}\n\n'
    b'data: {"id":"r","choices":[{"delta":{},"finish_reason":"length","index":0}],"created":1,"model":"m@main",'
    b'"object":"chat.completion.chunk","system_fingerprint":"","usage":{"completion_tokens":2,'
    b'"prompt_tokens":5,"total_tokens":7}}\n\n'
)


def test_transformers_serve_shape_is_ok_and_its_usage_counts():
    t = replay("/v1/chat/completions", "text/event-stream", [_TRANSFORMERS_SERVE])
    assert (t.outcome, t.error_type) == (Outcome.OK, None)
    assert (t.output_tokens, t.input_tokens, t.stream_tokens) == (2, 5, 2)


def test_transformers_serve_shape_stopped_mid_answer_is_truncated():
    mid = _TRANSFORMERS_SERVE[: _TRANSFORMERS_SERVE.rindex(b"data: ")]
    t = replay("/v1/chat/completions", "text/event-stream", [mid])
    assert (t.outcome, t.error_type) == (Outcome.ERROR, STREAM_TRUNCATED)


def _chunk(*choices: str) -> bytes:
    return b'data: {"id":"c","model":"m","choices":[' + ",".join(choices).encode() + b"]}\n\n"


_ROLE = '{"index":%d,"delta":{"role":"assistant","content":""},"finish_reason":null}'
_TEXT = '{"index":%d,"delta":{"content":"x"},"finish_reason":null}'
_END = '{"index":%d,"delta":{},"finish_reason":"stop"}'
_USAGE_ONLY = b'data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n'


@pytest.mark.parametrize(
    "stream,outcome",
    [
        # n=2: one choice finished, the other still going when the server stopped.
        (
            [
                _chunk(_ROLE % 0, _ROLE % 1),
                _chunk(_TEXT % 0),
                _chunk(_TEXT % 1),
                _chunk(_END % 0),
                _chunk(_TEXT % 1),
            ],
            Outcome.ERROR,
        ),
        # n=2: both finished, in separate chunks, a usage-only chunk after: ok.
        (
            [
                _chunk(_ROLE % 0, _ROLE % 1),
                _chunk(_TEXT % 0, _TEXT % 1),
                _chunk(_END % 1),
                _chunk(_END % 0),
                _USAGE_ONLY,
            ],
            Outcome.OK,
        ),
        # n=2 without role chunks: choice 1 appeared before choice 0 finished.
        ([_chunk(_TEXT % 0), _chunk(_TEXT % 1), _chunk(_END % 0)], Outcome.ERROR),
        ([_chunk(_TEXT % 0), _chunk(_TEXT % 1), _chunk(_END % 0), _chunk(_END % 1)], Outcome.OK),
        # A finish_reason that is null or empty is not a finish.
        ([_chunk(_TEXT % 0), _chunk('{"index":0,"delta":{},"finish_reason":""}')], Outcome.ERROR),
        # Only a usage chunk after content, no finish_reason: the answer may be cut.
        ([_chunk(_TEXT % 0), _USAGE_ONLY], Outcome.ERROR),
    ],
    ids=[
        "n2-one-open",
        "n2-both-then-usage",
        "n2-no-role-one-open",
        "n2-no-role-both",
        "empty-reason",
        "usage-no-reason",
    ],
)
def test_every_choice_must_finish(stream, outcome):
    t = replay("/v1/chat/completions", "text/event-stream", stream)
    assert t.outcome is outcome
    assert t.error_type == (None if outcome is Outcome.OK else STREAM_TRUNCATED)


def test_anthropic_without_stop_reason_is_truncated():
    raw = load("anthropic", "basic.txt")
    cut = raw[: raw.index(b"event: message_delta")]
    t = replay("/v1/messages", "text/event-stream", [cut])
    assert (t.outcome, t.error_type) == (Outcome.ERROR, STREAM_TRUNCATED)


# -- a client that leaves after the end got its whole answer ---------------------------------


@pytest.mark.parametrize("where,name,path,ctype", STREAMS, ids=IDS)
def test_client_leaving_after_the_marker_is_ok(where, name, path, ctype):
    t = replay(
        path, ctype, [load(where, name)], outcome=Outcome.CANCELLED, error_type=CLIENT_DISCONNECTED
    )
    assert (t.outcome, t.error_type) == (Outcome.OK, None)


@pytest.mark.parametrize("where,name,path,ctype", FINISHED_BEFORE_MARKER, ids=FINISHED_IDS)
def test_client_leaving_once_generation_finished_is_ok(where, name, path, ctype):
    """Every choice finished, the usage chunk and [DONE] not yet relayed: still the whole answer."""
    done = up_to_generation_done(dialect_of(match_route(path)[0]).stream, load(where, name), False)
    t = replay(path, ctype, [done], outcome=Outcome.CANCELLED, error_type=CLIENT_DISCONNECTED)
    assert (t.outcome, t.error_type) == (Outcome.OK, None)


@pytest.mark.parametrize("where,name,path,ctype", STREAMS, ids=IDS)
def test_client_leaving_mid_answer_is_cancelled(where, name, path, ctype):
    cut = cut_before_marker(
        dialect_of(match_route(path)[0]).stream, load(where, name), ctype == "application/x-ndjson"
    )
    t = replay(path, ctype, [cut], outcome=Outcome.CANCELLED, error_type=CLIENT_DISCONNECTED)
    assert (t.outcome, t.error_type) == (Outcome.CANCELLED, CLIENT_DISCONNECTED)


def test_client_that_stopped_reading_after_the_marker_is_still_cancelled():
    """A send timeout: the marker may still sit unread in the sidecar's buffer."""
    raw = load("openai", "vllm032_chat_no_usage.txt")
    t = replay(
        "/v1/chat/completions",
        "text/event-stream",
        [raw],
        outcome=Outcome.CANCELLED,
        error_type="client_send_timeout",
    )
    assert (t.outcome, t.error_type) == (Outcome.CANCELLED, "client_send_timeout")


def test_client_leaving_after_an_error_event_and_marker_is_an_error():
    stream = [b'data: {"error":{"message":"boom","type":"x"}}\n\n', b"data: [DONE]\n\n"]
    t = replay(
        "/v1/chat/completions",
        "text/event-stream",
        stream,
        outcome=Outcome.CANCELLED,
        error_type=CLIENT_DISCONNECTED,
    )
    assert (t.outcome, t.error_type) == (Outcome.ERROR, "stream_error")


def test_client_leaving_a_complete_5xx_stream_is_an_upstream_error():
    raw = load("openai", "vllm032_chat_no_usage.txt")
    t = replay(
        "/v1/chat/completions",
        "text/event-stream",
        [raw],
        status=503,
        outcome=Outcome.CANCELLED,
        error_type=CLIENT_DISCONNECTED,
    )
    assert (t.outcome, t.error_type) == (Outcome.ERROR, "upstream_status")
