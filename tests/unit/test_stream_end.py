"""A stream that ends cleanly without its protocol's end marker is not ``ok``.

For every dialect, a recorded-shape stream is replayed through the observer and the timeline
twice: whole (the end marker arrives: ``ok``) and cut just before the event that carries
the marker (what a server that died between two chunks leaves: ``error`` /
``upstream_stream_truncated``). The cut is found by the dialect itself: the longest prefix
of whole events that has not yet produced a :class:`StreamEnd`.
"""

from __future__ import annotations

import pytest

from sidecar.measure.observe import ResponseObserver
from sidecar.streams.protocols.openai import OpenAIStreamDialect
from sidecar.relay.routes import ROUTES, match_route
from sidecar.measure.timeline import STREAM_TRUNCATED, Outcome, RequestTimeline
from tests.fixtures.streams.harness import END_MARKER_STREAMS, cut_before_marker, load

STREAMS = END_MARKER_STREAMS
IDS = [f"{d}/{n}" for d, n, _, _ in STREAMS]


def cut(path: str, raw: bytes, ndjson: bool) -> bytes:
    return cut_before_marker(match_route(path)[0].stream_dialect, raw, ndjson)


def replay(path: str, content_type: str, chunks: list[bytes], status: int = 200, method: str = "POST") -> RequestTimeline:
    route, model = match_route(path)
    t = RequestTimeline(0.0, method, route.template, model or "m")
    observer = ResponseObserver(route, t, content_type)
    t.response_started(0.0, status, observer.streaming)
    for i, chunk in enumerate(chunks):
        observer.feed(chunk, 0.01 * (i + 1))
    observer.close(1.0)
    t.finish(Outcome.OK if status < 500 else Outcome.ERROR, 1.0, None if status < 500 else "upstream_status")
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
    t = replay("/v2/models/ensemble/generate_stream", "text/event-stream; charset=utf-8", [raw[: len(raw) // 2]])
    assert t.stream_tokens > 0 and not t.end_marker_expected
    assert t.outcome is Outcome.OK


@pytest.mark.parametrize(
    "status,method,outcome",
    [(204, "POST", Outcome.OK), (200, "HEAD", Outcome.OK), (429, "POST", Outcome.OK), (503, "POST", Outcome.ERROR)],
)
def test_bodiless_and_error_statuses_keep_their_outcome(status, method, outcome):
    t = replay("/v1/chat/completions", "text/event-stream", [], status=status, method=method)
    assert t.outcome is outcome and t.error_type != STREAM_TRUNCATED


def test_error_event_wins_over_truncation():
    """An in-stream error then a clean end: the server said why, so that is the cause."""
    t = replay("/v1/chat/completions", "text/event-stream", [b'data: {"error":{"message":"boom","type":"x"}}\n\n'])
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
    observer.feed(b'{"id":"x","model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}', 0.1)
    observer.close(0.2)
    t.finish(Outcome.OK, 0.2)
    assert t.outcome is Outcome.OK
