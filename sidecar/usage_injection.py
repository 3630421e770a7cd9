"""Exact token counts for clients that did not ask for them, invisibly.

An OpenAI-style streaming request without ``stream_options.include_usage`` gets no
``usage`` from the server, so output tokens could only be estimated (one per delta) and
input tokens not at all. The sidecar therefore asks for usage on the client's behalf
(:func:`request_with_usage`) and removes the one extra usage-only event from what it
relays (:class:`UsageEventFilter`), so the client receives exactly the bytes it would have
received without the sidecar while the metrics carry the server's exact counts.

The filter is sans-I/O. It relays whole SSE events: bytes of an event that is not complete
yet are held until its blank line arrives. That adds no delay a client could notice, since
an SSE client cannot act on an event before its blank line either, and servers write one
whole event per flush. Only an event whose data is a JSON object with ``"choices": []``
and a ``usage`` object is dropped; everything else, including anything unparseable, passes
byte for byte.
"""

from __future__ import annotations

import re

import orjson

__all__ = ["request_with_usage", "UsageEventFilter"]

# A blank line ends an event: two line ends in a row, in any of the three styles.
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


def request_with_usage(doc: dict) -> dict | None:
    """The request with ``stream_options.include_usage`` set, or None to leave it as is.

    Untouched: non-streaming requests, requests that already say include_usage (true or
    false: an explicit false is the client's choice), and malformed stream_options.
    """
    if doc.get("stream") is not True:
        return None
    options = doc.get("stream_options")
    if options is None:
        options = {}
    elif type(options) is not dict or "include_usage" in options:
        return None
    return {**doc, "stream_options": {**options, "include_usage": True}}


class UsageEventFilter:
    """Relays SSE bytes event by event, dropping the usage-only event."""

    __slots__ = ("_held", "_limit", "_passthrough", "dropped")

    def __init__(self, max_held_bytes: int = 1 << 20) -> None:
        self._held = b""
        self._limit = max_held_bytes
        self._passthrough = False  # gave up filtering: relay everything untouched
        self.dropped = 0

    def feed(self, chunk: bytes) -> bytes:
        if self._passthrough:
            return chunk
        # Fast path, nearly every chunk: whole LF-framed events that mention no usage.
        # (`13 in` is a bare memchr, and find() beats `in` for a substring: same answers.)
        if not self._held and chunk[-2:] == b"\n\n" and 13 not in chunk and chunk.find(b'"usage"') == -1:
            return chunk
        data = self._held + chunk if self._held else chunk
        last = None
        for last in _EVENT_END.finditer(data):
            pass
        if last is None:
            if len(data) > self._limit:
                # No event end in sight (not SSE, or a hostile stream): stop holding bytes.
                self._passthrough = True
                self._held = b""
                return data
            self._held = data
            return b""
        cut = last.end()
        # A CR ending the buffer may be the first half of a CRLF: keep it with the tail.
        self._held = data[cut:]
        complete = data[:cut]
        if b'"usage"' not in complete or b'"choices"' not in complete:
            return complete
        return self._without_usage_events(complete)

    def close(self) -> bytes:
        """End of stream: whatever is held (an unterminated event) is relayed as is."""
        held, self._held = self._held, b""
        return held

    def _without_usage_events(self, complete: bytes) -> bytes:
        out: list[bytes] = []
        start = 0
        for m in _EVENT_END.finditer(complete):
            event = complete[start : m.end()]
            start = m.end()
            if _is_usage_only(event):
                self.dropped += 1
            else:
                out.append(event)
        return b"".join(out)


def _is_usage_only(event: bytes) -> bool:
    if b'"usage"' not in event or b'"choices"' not in event:
        return False
    lines = event.splitlines()
    data = [line[5:] for line in lines if line.startswith(b"data:")]
    others = [line for line in lines if line and not line.startswith(b"data:")]
    if len(data) != 1 or others:
        return False
    try:
        doc = orjson.loads(data[0])
    except orjson.JSONDecodeError:
        return False
    return type(doc) is dict and doc.get("choices") == [] and type(doc.get("usage")) is dict
