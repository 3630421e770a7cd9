"""Sans-I/O Server-Sent Events decoder (WHATWG "event stream interpretation").

Bytes go in with :meth:`SSEDecoder.feed`, complete events come out; nothing here knows
about sockets or asyncio, so the proxy can feed it a *copy* of what it already relayed and
the tests can drive it one byte at a time.

Why bytes, not text: every SSE delimiter (CR, LF, ``:``, field names) is ASCII, and a
UTF-8 multi-byte sequence never contains an ASCII byte, so splitting on bytes is exactly
equivalent to decoding first and splitting on characters. It also means a character that
a TCP read cuts in half is simply carried in the buffer with the rest of its line, and the
dialects can hand ``data`` straight to orjson without a decode/encode round trip.

Bounded memory: a peer that never sends a line end (or piles up ``data:`` lines without a
blank line) must not make us buffer without limit. Past ``max_line_bytes`` of one line or
``max_event_bytes`` of one event the decoder drops what it holds, skips to the next line
end, ignores the rest of that event's ``data`` up to its blank line (so no truncated
fragment is dispatched as if whole), and reports one :class:`SSEOverflow`. The relayed
bytes are unaffected; only the measurement of that event is lost. Work is O(n) in the
bytes fed: each byte is scanned once for a line end, except the held-back tail of an
incomplete line, which is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent", "SSEOverflow", "DEFAULT_MAX_LINE_BYTES"]

DEFAULT_MAX_LINE_BYTES = 1 << 20  # 1 MiB: far above any real token chunk
_BOM = b"\xef\xbb\xbf"


@dataclass(slots=True)  # not frozen: a frozen constructor costs ~3x, on every event
class SSEEvent:
    """One dispatched event. ``data`` is the raw UTF-8 bytes of the joined data lines."""

    data: bytes
    event: str = "message"
    id: str | None = None
    retry: int | None = None


@dataclass(slots=True, frozen=True)
class SSEOverflow:
    """A line or event exceeded its bound and was discarded (bytes still relayed)."""

    reason: str


class SSEDecoder:
    """Incremental WHATWG SSE decoder: ``feed(bytes) -> events``, ``close() -> events``."""

    __slots__ = (
        "_tail",
        "_after_cr",
        "_skipping",
        "_started",
        "_data",
        "_data_size",
        "_has_data",
        "_discarding",
        "_event",
        "_last_id",
        "_retry",
        "_max_line",
        "_max_event",
    )

    def __init__(
        self,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int | None = None,
    ) -> None:
        if max_line_bytes <= 0:
            raise ValueError("max_line_bytes must be positive")
        self._max_line = max_line_bytes
        self._max_event = max_event_bytes if max_event_bytes is not None else 4 * max_line_bytes
        self._tail = b""  # an incomplete line carried to the next feed
        self._after_cr = False  # the last byte seen was CR: a leading LF is part of that line end
        self._skipping = False  # discarding an oversized line up to its end
        self._started = False  # the optional BOM is only honoured at the very start
        self._data: list[bytes] = []
        self._data_size = 0
        self._has_data = False
        self._discarding = False  # an overflow broke this event: ignore its data lines
        self._event = ""
        self._last_id: str | None = None  # "last event ID" persists across events
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent | SSEOverflow]:
        out: list[SSEEvent | SSEOverflow] = []
        if not chunk:
            return out
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return out
        buf = self._tail + chunk if self._tail else chunk
        self._tail = b""
        if not self._started:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._tail = buf  # could still be the start of a BOM
                return out
            self._started = True
            if buf.startswith(_BOM):
                buf = buf[3:]

        pos = 0
        end = len(buf)
        has_cr = b"\r" in buf
        while pos < end:
            if has_cr:
                lf = buf.find(b"\n", pos)
                cr = buf.find(b"\r", pos)
                if cr == -1:
                    nl = lf
                elif lf == -1:
                    nl = cr
                else:
                    nl = cr if cr < lf else lf
            else:
                nl = buf.find(b"\n", pos)
            if nl == -1:
                break
            line = buf[pos:nl]
            if buf[nl] == 13:  # CR: swallow a following LF (CRLF), even across feeds
                if nl + 1 < end:
                    pos = nl + 2 if buf[nl + 1] == 10 else nl + 1
                else:
                    self._after_cr = True
                    pos = end
            else:
                pos = nl + 1
            if self._skipping:
                self._skipping = False
                continue
            if len(line) > self._max_line:
                self._overflow(out, "line longer than %d bytes" % self._max_line)
                continue
            self._line(line, out)

        if pos < end:
            rest = buf[pos:]
            if self._skipping:
                return out
            if len(rest) > self._max_line:
                self._overflow(out, "line longer than %d bytes" % self._max_line)
                self._skipping = True
            else:
                self._tail = rest
        return out

    def close(self) -> list[SSEEvent | SSEOverflow]:
        """End of stream. Per the spec an event not ended by a blank line is discarded;
        an unterminated final line is still interpreted as a field (it may complete
        nothing, but `id:`/`retry:` state stays consistent)."""
        out: list[SSEEvent | SSEOverflow] = []
        if self._tail and not self._skipping:
            tail, self._tail = self._tail, b""
            if self._started or not _BOM.startswith(tail):
                self._line(tail, out)
        self._reset_event()
        return out

    # -- internals ---------------------------------------------------------------------

    def _overflow(self, out: list, reason: str) -> None:
        self._reset_event()
        self._discarding = True
        out.append(SSEOverflow(reason))

    def _reset_event(self) -> None:
        self._data = []
        self._data_size = 0
        self._has_data = False
        self._discarding = False
        self._event = ""

    def _line(self, line: bytes, out: list) -> None:
        if not line:
            # Blank line: dispatch. No data field at all means no event (spec step 1).
            if self._has_data:
                data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                out.append(SSEEvent(data, self._event or "message", self._last_id, self._retry))
            self._reset_event()
            return
        if line[0] == 58:  # ':' comment (keep-alives such as ": ping")
            return
        colon = line.find(b":")
        if colon == -1:
            name, value = line, b""
        else:
            name = line[:colon]
            value = line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            if self._discarding:
                return
            self._data_size += len(value) + 1
            if self._data_size > self._max_event:
                self._overflow(out, "event longer than %d bytes" % self._max_event)
                return
            self._data.append(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\0" not in value:
                self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry":
            if value and value.isdigit():
                self._retry = int(value)
        # any other field name is ignored, as the spec says
