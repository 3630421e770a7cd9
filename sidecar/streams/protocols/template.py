"""A stream's repeating event, recognised from its bytes without decoding it again.

A token stream is one JSON object over and over with only the token's text changed; vLLM's
chunk is ``{"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,"model":…,
"choices":[{"index":0,"delta":{"content":"<text>"},"logprobs":null,"finish_reason":null}]}``
for every token. Decoding each one (orjson) and walking it (the dialect) was most of what
measuring cost per token in the relay (~4 of ~5 µs, by switching each part off).

:class:`EventTemplate` holds such a shape: the bytes before and after the token's text in
one event. Another event with the same bytes around a different *plain* text (non-empty,
valid UTF-8 with no quote, backslash or unprintable character: what a JSON string holds
verbatim) decodes to the same object but for that text. So a dialect whose events and
state depend on the text only through whether it is empty gives, from the same state, the
same events for it. The plain check is in C where built (:mod:`sidecar.base.speedups`). :class:`~sidecar.streams.protocols._base.SSEJSONDialect` arms a template only once an
event of the shape is known to leave its state as it found it (a fixed point, so it holds
for every later event of the shape) with its text in the one place the bytes say: at once
when the dialect knows the event that taught it to be such a fixed point (it settled it)
and the event holds no backslash (every string in it written verbatim, so the text's one
verbatim occurrence is its field), else after a second event of the shape with another text
gave the same events and left the state as it was. It drops
the template at the first event of another shape (an escaped text in the same shape is
decoded and keeps it while the state does not move). The decoded path stays the oracle:
tests feed both the same streams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...base.speedups import plain, plain_at
from .events import Tokens

if TYPE_CHECKING:
    from .events import DialectEvent

__all__ = ["EventTemplate", "plain"]


class EventTemplate:
    """The bytes of one whole SSE event around its token text (see the module doc): the
    ``data:`` field as the server spells it, the data's bytes before the text, and after it
    the rest of the data and the blank line. Only these two byte strings are kept per stream
    (a few hundred bytes); every check is on the chunk as it came."""

    __slots__ = (
        "text", "events", "one_token", "limit", "spaced", "prefix", "suffix", "_start", "_tail",
    )  # fmt: skip

    def __init__(
        self, prefix: bytes, suffix: bytes, text: bytes | None, events: tuple[DialectEvent, ...]
    ) -> None:
        self.text = text  # the text of the event it was learned from (dropped once armed)
        self.events = _shared(events)  # what the dialect made of that event
        # The kind of the one token the event is, when it is exactly that (what a token lane
        # stands for: sidecar/relay/data/token_lane.py); else None.
        first = events[0] if events else None
        self.one_token = (
            first.kind if type(first) is Tokens and first.count == 1 and events[1:] == () else None
        )
        self.limit = 0  # the longest event matches() takes (the framing's bound, set on arming)
        # Whether the server writes ``data: `` with its optional space (the framing's bound
        # counts the value from after it).
        self.spaced = prefix[:6] == b"data: "
        self.prefix = prefix  # the event's bytes before the text: b"data: " + the data's up to it
        self.suffix = suffix  # the event's bytes after the text: the rest of the data + b"\n\n"
        self._start = len(prefix)
        self._tail = -len(suffix)  # where the suffix starts, from the end (never 0: "\n\n")

    @classmethod
    def learn(
        cls, chunk: bytes, data: bytes, text: object, events: list[DialectEvent]
    ) -> EventTemplate | None:
        """The template of ``chunk``, one SSE event whose data is ``data`` (``data:``, the
        optional space, ``data``, the blank line: as ``SSEDecoder.lone_data`` takes it) and
        whose token text the dialect decoded as ``text``: None unless that text is plain and
        written verbatim exactly once in ``data``."""
        if type(text) is not str or not text:
            return None
        try:
            raw = text.encode()
        except UnicodeEncodeError:  # a lone surrogate (from a \\u escape): not plain
            return None
        size = len(raw)
        if not plain_at(raw, 0, size):
            return None
        needle = b'"' + raw + b'"'
        at = data.find(needle)
        if at < 0 or data.find(needle, at + 1) >= 0:
            return None
        field = 6 if chunk[5] == 32 else 5  # b"data: " or b"data:", as the server spells it
        at += field + 1
        return cls(chunk[:at], chunk[at + size :], raw, tuple(events))

    # The checks below compare slices (``chunk[:start] == prefix``) rather than call
    # ``startswith``/``endswith``: the same bytes compared, and no call on the per-event path.

    def text_of(self, chunk: bytes) -> bytes | None:
        """``chunk``'s text if it has this shape around a plain text; else None."""
        start, tail = self._start, self._tail
        end = len(chunk) + tail
        if (
            end > start
            and chunk[:start] == self.prefix
            and chunk[tail:] == self.suffix
            and plain_at(chunk, start, end)
        ):
            return chunk[start:end]
        return None

    def frames(self, chunk: bytes) -> bool:
        """Whether ``chunk`` has this shape's bytes around whatever text (plain or not)."""
        start, tail = self._start, self._tail
        return (
            len(chunk) + tail >= start
            and chunk[:start] == self.prefix
            and chunk[tail:] == self.suffix
        )

    def matches(self, chunk: bytes) -> bool:
        """Whether ``chunk`` has this shape around a plain text, at most :attr:`limit` bytes:
        then it is one whole SSE event with no other line in it (a plain text holds no CR or
        LF, and the learned bytes around it came from one such event) that the framing's
        fast path would take, so the framing need not look. The hot path, once per token."""
        size = len(chunk)
        start, tail = self._start, self._tail
        if start < size + tail and size <= self.limit and chunk[:start] == self.prefix:
            if chunk[tail:] == self.suffix:
                return plain_at(chunk, start, size + tail)  # in C where built
        return False


_SHARED: list[tuple[DialectEvent, ...]] = []


def _shared(events: tuple[DialectEvent, ...]) -> tuple[DialectEvent, ...]:
    """One tuple per distinct events value (nearly always one answer token), not one per
    stream; events are never mutated, so sharing is safe. Learning is rare and the values
    few: a short list, scanned (events compare by value but do not hash)."""
    for known in _SHARED:
        if known == events:
            return known
    if len(_SHARED) < 32:
        _SHARED.append(events)
    return events
