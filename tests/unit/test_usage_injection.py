"""Usage injection: the request rewrite and the relay filter that hides its extra event."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.usage_injection import UsageEventFilter, request_with_usage

CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
LAST = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
DONE = b"data: [DONE]\n\n"
# A chunk that mentions usage but is not usage-only (continuous usage stats) must stay.
CONTINUOUS = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'


def run(stream: bytes, splits: list[int]) -> tuple[bytes, int]:
    f = UsageEventFilter()
    out = []
    prev = 0
    for cut in sorted(set(splits)) + [len(stream)]:
        out.append(f.feed(stream[prev:cut]))
        prev = cut
    out.append(f.close())
    return b"".join(out), f.dropped


def test_request_rewrite():
    assert request_with_usage({"stream": True, "model": "m"}) == {
        "stream": True,
        "model": "m",
        "stream_options": {"include_usage": True},
    }
    assert request_with_usage({"stream": True, "stream_options": {"continuous_usage_stats": True}})[
        "stream_options"
    ] == {"continuous_usage_stats": True, "include_usage": True}
    assert request_with_usage({"stream": False}) is None
    assert request_with_usage({"model": "m"}) is None
    assert request_with_usage({"stream": True, "stream_options": {"include_usage": False}}) is None  # client chose
    assert request_with_usage({"stream": True, "stream_options": {"include_usage": True}}) is None
    assert request_with_usage({"stream": True, "stream_options": "junk"}) is None


def test_drops_only_the_usage_only_event():
    stream = CHUNK + CONTINUOUS + LAST + USAGE + DONE
    out, dropped = run(stream, [])
    assert out == CHUNK + CONTINUOUS + LAST + DONE
    assert dropped == 1


def test_crlf_and_cr_streams():
    for eol in (b"\r\n", b"\r"):
        stream = (CHUNK + USAGE + DONE).replace(b"\n", eol)
        out, dropped = run(stream, [])
        assert out == (CHUNK + DONE).replace(b"\n", eol)
        assert dropped == 1


def test_byte_by_byte():
    stream = CHUNK + LAST + USAGE + DONE
    out, dropped = run(stream, list(range(1, len(stream))))
    assert out == CHUNK + LAST + DONE and dropped == 1


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_splits_keep_every_other_byte(data):
    stream = CHUNK * 3 + b": keep-alive\n\n" + CONTINUOUS + LAST + USAGE + DONE
    splits = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    out, dropped = run(stream, splits)
    assert out == CHUNK * 3 + b": keep-alive\n\n" + CONTINUOUS + LAST + DONE
    assert dropped == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10))
def test_anything_without_a_usage_event_passes_unchanged(blob, splits):
    stream = blob.replace(b"usage", b"us_ge")
    out, _ = run(stream, [s for s in splits if s <= len(stream)])
    assert out == stream


def test_unterminated_and_garbage_pass_through():
    stream = CHUNK + b'data: {"choices":[],"usage":{"x":1}}'  # no blank line: not a complete event
    out, dropped = run(stream, [])
    assert out == stream and dropped == 0
    bad = b'data: {"choices":[],"usage":{broken\n\n'
    assert run(bad, [])[0] == bad


def test_no_event_end_in_sight_stops_holding():
    f = UsageEventFilter(max_held_bytes=100)
    assert f.feed(b"x" * 60) == b""
    assert f.feed(b"y" * 60) == b"x" * 60 + b"y" * 60  # released, then pass-through
    assert f.feed(USAGE) == USAGE
