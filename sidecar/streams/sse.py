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

Fast paths: this runs once per streamed token, so the common case is cheap. Between events
(``_idle``), a chunk of whole ``data: ...\n\n`` events is split with ``find`` instead of
line by line (:meth:`SSEDecoder._whole_events`), and :meth:`SSEDecoder.lone_data` gives a
one-event chunk's data to the dialects without building an event. Both hand anything else
to the general path, and both are tested against it (``tests/unit/streams/test_sse_fast_path.py``).
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
        "_idle",
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
        self._tail: bytes | bytearray = b""  # an incomplete line carried to the next feed
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
        # Nothing carried over and no event under way: the fast paths may run. Kept by
        # _settle at the end of the general path; False is always safe (just slower).
        self._idle = False

    def feed(self, chunk: bytes) -> list[SSEEvent | SSEOverflow]:
        out: list[SSEEvent | SSEOverflow] = []
        if self._idle and 13 not in chunk:  # no CR (an int operand makes `in` a bare memchr)
            # The common case: whole LF-ended events with nothing carried over.
            pos = self._whole_events(chunk, out)
            if pos < len(chunk):
                self._lines(chunk, pos, False, out)
            return out
        if not chunk:
            return out
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return out
        if self._tail and self._started and 10 not in chunk and 13 not in chunk:
            self._grow_tail(chunk, out)
            return out
        buf = b"".join((self._tail, chunk)) if self._tail else chunk
        self._tail = b""
        if not self._started:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._tail = buf  # could still be the start of a BOM
                return out
            self._started = True
            if buf.startswith(_BOM):
                buf = buf[3:]
        self._lines(buf, 0, 13 in buf, out)
        return out

    def lone_data(self, chunk: bytes) -> bytes | None:
        """``chunk``'s data if it is exactly one ``data: ...\\n\\n`` event and the decoder
        holds nothing; the event is then consumed. Otherwise ``None``, nothing consumed:
        call :meth:`feed`.

        For the dialects, which read only an event's ``data`` and type: nearly every chunk
        a server flushes is one such event, and this hands its data over without building
        an :class:`SSEEvent` and a list per token. Equivalence with :meth:`feed`: when idle
        (see :meth:`_whole_events`), a chunk of one LF-ended ``data`` line with no CR and
        within both bounds, then an empty line, is dispatched by :meth:`feed` as exactly
        ``SSEEvent(data, "message", last id, retry)`` and leaves every piece of state as it
        was, so returning ``data`` is the same event minus the fields the caller ignores
        (the type is always ``"message"``).

        A fresh decoder (nothing fed, nothing held) takes such a chunk too, and is started
        and idle after it, as :meth:`feed` leaves it: a chunk that begins with ``data:``
        begins with no BOM, so the BOM rule has nothing to hold back, and the first event of
        every stream costs no walk through the general path.
        """
        if not self._idle and (self._started or self._tail):
            return None
        end = len(chunk) - 2  # where the line's LF must be, followed by the blank line's LF
        if (
            chunk[:5] == b"data:"
            and chunk.find(b"\n", 5) == end
            and chunk[-1] == 10
            and 13 not in chunk
            and end <= self._max_line
        ):
            start = 6 if chunk[5] == 32 else 5  # chunk[5] is the LF when the value is empty
            if end - start < self._max_event:  # the general path counts len(value) + 1
                if not self._idle:  # fresh: started now, and (nothing held) idle
                    self._started = self._idle = True
                return chunk[start:end]
        return None

    def lone_limit(self, spaced: bool) -> int:
        """The longest chunk :meth:`lone_data` takes as ``data: <value>\\n\\n`` (``data:``
        without the space when not ``spaced``; no CR, no other LF) when the decoder is
        idle: the line and the value within their bounds. For a caller that checks such a
        chunk's shape itself and knows the decoder is idle (nothing but lone_data has run
        since it last returned a value)."""
        line, event = self._max_line + 2, self._max_event + (7 if spaced else 6)
        return line if line < event else event

    def close(self) -> list[SSEEvent | SSEOverflow]:
        """End of stream. Per the spec an event not ended by a blank line is discarded;
        an unterminated final line is still interpreted as a field (it may complete
        nothing, but `id:`/`retry:` state stays consistent)."""
        out: list[SSEEvent | SSEOverflow] = []
        if self._idle:  # nothing held, no event under way: nothing to end or reset
            return out
        if self._tail and not self._skipping:
            tail, self._tail = bytes(self._tail), b""
            if self._started or not _BOM.startswith(tail):
                self._line(tail, out)
        self._reset_event()
        self._settle()
        return out

    # -- internals ---------------------------------------------------------------------

    def _grow_tail(self, chunk: bytes, out: list[SSEEvent | SSEOverflow]) -> None:
        """An incomplete line grows by a chunk with no line end in it: append it in place,
        without copying or rescanning what is held, so a long line sent in small pieces costs
        O(n) in its length, not O(n^2) (a 1 MiB line in 200-byte pieces would rescan ~2.6 GB).
        """
        tail = self._tail
        if len(tail) + len(chunk) > self._max_line:
            self._tail = b""
            self._overflow(out, f"line longer than {self._max_line} bytes")
            self._skipping = True
            self._settle()
            return
        if type(tail) is not bytearray:
            tail = self._tail = bytearray(tail)
        tail += chunk

    def _settle(self) -> None:
        """Recompute :attr:`_idle` once the state may have changed (after the general path)."""
        self._idle = self._started and not (
            self._tail
            or self._after_cr
            or self._skipping
            or self._has_data
            or self._event
            or self._discarding
        )

    def _lines(self, buf: bytes, pos: int, has_cr: bool, out: list[SSEEvent | SSEOverflow]) -> None:
        """The general path: ``buf[pos:]`` starts at a line start; interpret every complete
        line, then hold back (or start skipping) an incomplete last one."""
        self._idle = False  # until _settle says otherwise, whatever happens below
        end = len(buf)
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
                self._overflow(out, f"line longer than {self._max_line} bytes")
                continue
            self._line(line, out)

        if pos < end and not self._skipping:
            rest = buf[pos:]
            if len(rest) > self._max_line:
                self._overflow(out, f"line longer than {self._max_line} bytes")
                self._skipping = True
            else:
                self._tail = rest
        self._settle()

    def _whole_events(self, buf: bytes, out: list[SSEEvent | SSEOverflow]) -> int:
        """Fast path: dispatch the leading ``data: ...\\n\\n`` events of ``buf``; return
        where the general path must take over (``len(buf)`` when nothing is left).

        Walking each line through :meth:`_line` costs more than the rest of the measuring
        together, and nearly every chunk is one or more such events. The caller comes here
        only when ``_idle`` (started, nothing carried over: no tail, no CR to pair with an
        LF, no line being skipped, no event under way) and ``buf`` has no CR, so ``buf``
        starts at a line start of a fresh event and every line ends at an LF. An LF-ended
        ``data`` line within ``max_line_bytes`` followed by an empty line is then, per the
        general path, one data value (one leading space removed) of at most
        ``max_event_bytes``, dispatched with the default type and the current ``id`` and
        ``retry``, after which the state is fresh again. Anything else (a comment, another
        field, several data lines, a bound exceeded, an event not complete yet) stops the
        loop at that event's first line, where the general path resumes in that same state.
        """
        pos = 0
        end = len(buf)
        while buf.startswith(b"data:", pos):
            nl = buf.find(b"\n", pos + 5)
            if nl == -1 or nl + 1 == end or buf[nl + 1] != 10 or nl - pos > self._max_line:
                break
            start = pos + 6 if buf[pos + 5] == 32 else pos + 5  # buf[pos + 5] may be the LF
            if nl - start >= self._max_event:  # the general path counts len(value) + 1
                break
            out.append(SSEEvent(buf[start:nl], "message", self._last_id, self._retry))
            pos = nl + 2
        return pos

    def _overflow(self, out: list[SSEEvent | SSEOverflow], reason: str) -> None:
        self._reset_event()
        self._discarding = True
        out.append(SSEOverflow(reason))

    def _reset_event(self) -> None:
        self._data = []
        self._data_size = 0
        self._has_data = False
        self._discarding = False
        self._event = ""

    def _line(self, line: bytes, out: list[SSEEvent | SSEOverflow]) -> None:
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
                self._overflow(out, f"event longer than {self._max_event} bytes")
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
