"""A stream's repeating event, recognised from its bytes without decoding it again.

A token stream is one JSON object over and over with only the token's text changed; vLLM's
chunk is ``{"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,"model":…,
"choices":[{"index":0,"delta":{"content":"<text>"},"logprobs":null,"finish_reason":null}]}``
for every token. Decoding each one (orjson) and walking it (the dialect) was most of what
measuring cost per token in the relay (#27: ~4 of ~5 µs, by switching each part off).

:class:`EventTemplate` holds such a shape: the bytes before and after the token's text in
one event. Another event with the same bytes around a different *plain* text (non-empty,
valid UTF-8 with no quote, backslash or unprintable character: what a JSON string holds
verbatim) decodes to the same object but for that text. So a dialect whose events and state depend on
the text only through whether it is empty gives, from the same state, the same events for
it. :class:`~sidecar.streams.protocols._base.SSEJSONDialect` arms a template only after a
second event of the shape left its state as it found it and gave the same events (a fixed
point, so it holds for every later event of the shape), and drops it at the first event of
another shape (an escaped text in the same shape is decoded and keeps it while the state
does not move). The decoded path stays the oracle: tests feed both the same streams.
"""

from __future__ import annotations

__all__ = ["EventTemplate", "plain"]


def plain(text: bytes) -> bool:
    """Whether a JSON string holding ``text`` between its quotes decodes to exactly these
    bytes: valid UTF-8, no quote, no backslash, and every character printable (no control
    character; stricter than JSON, which only refuses U+0000 to U+001F, so an event with an
    unusual character is just decoded instead)."""
    try:
        chars = text.decode()
    except UnicodeDecodeError:
        return False
    return chars.isprintable() and '"' not in chars and "\\" not in chars


class EventTemplate:
    """The bytes of one event around its token text (see the module doc), as the event's
    data and as the whole SSE event a server writes (``data: <data>\\n\\n``)."""

    __slots__ = ("prefix", "suffix", "text", "events", "limit", "_event_prefix", "_event_suffix", "_start", "_tail")

    def __init__(self, prefix: bytes, suffix: bytes, text: bytes, events: tuple) -> None:
        self.prefix = prefix
        self.suffix = suffix
        self.text = text  # the text of the event it was learned from
        self.events = events  # what the dialect made of that event
        self.limit = 0  # the longest whole event matches_event takes (set by the dialect)
        self._event_prefix = b"data: " + prefix
        self._event_suffix = suffix + b"\n\n"
        self._start = len(self._event_prefix)
        self._tail = len(self._event_suffix)

    @classmethod
    def learn(cls, data: bytes, text: object, events: list) -> EventTemplate | None:
        """The template of ``data``, whose token text the dialect decoded as ``text``: None
        unless that text is plain and written verbatim exactly once in ``data``."""
        if type(text) is not str or not text:
            return None
        try:
            raw = text.encode()
        except UnicodeEncodeError:  # a lone surrogate (from a \\u escape): not plain
            return None
        if not plain(raw):
            return None
        needle = b'"' + raw + b'"'
        at = data.find(needle)
        if at < 0 or data.find(needle, at + 1) >= 0:
            return None
        return cls(data[: at + 1], data[at + 1 + len(raw) :], raw, tuple(events))

    def text_of(self, data: bytes) -> bytes | None:
        """``data``'s text if ``data`` has this shape around a plain text; else None."""
        end = len(data) - len(self.suffix)
        if end > len(self.prefix) and data.startswith(self.prefix) and data.endswith(self.suffix):
            text = data[len(self.prefix) : end]
            if plain(text):
                return text
        return None

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` has this shape around a plain text."""
        return _around(data, self.prefix, self.suffix)

    def frames(self, data: bytes) -> bool:
        """Whether ``data`` has this shape's bytes around whatever text (plain or not)."""
        return (
            len(data) >= len(self.prefix) + len(self.suffix)
            and data.startswith(self.prefix)
            and data.endswith(self.suffix)
        )

    def matches_event(self, chunk: bytes) -> bool:
        """Whether ``chunk`` is ``data: `` + data of this shape + ``\\n\\n``, at most
        :attr:`limit` bytes: then it is one whole SSE event with no other line in it (a
        plain text holds no CR or LF, and the learned bytes around it came from one such
        event), so the framing need not look. The hot path, once per token: written out
        rather than calling :func:`_around`."""
        end = len(chunk) - self._tail
        if self._start < end and len(chunk) <= self.limit and chunk.startswith(self._event_prefix):
            if chunk.endswith(self._event_suffix):
                try:
                    chars = chunk[self._start : end].decode()
                except UnicodeDecodeError:
                    return False
                return chars.isprintable() and '"' not in chars and "\\" not in chars
        return False


def _around(buf: bytes, prefix: bytes, suffix: bytes) -> bool:
    """Whether ``buf`` is ``prefix`` + a plain text + ``suffix``: the hot path, one token."""
    start = len(prefix)
    end = len(buf) - len(suffix)
    if end > start and buf.startswith(prefix) and buf.endswith(suffix):
        try:
            chars = buf[start:end].decode()
        except UnicodeDecodeError:
            return False
        return chars.isprintable() and '"' not in chars and "\\" not in chars
    return False
