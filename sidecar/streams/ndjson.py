"""Sans-I/O newline-delimited JSON framing (Ollama's ``application/x-ndjson`` streams).

Bytes go in with :meth:`NDJSONDecoder.feed`, complete lines come out as ``bytes``; nothing
here knows about sockets or asyncio, so the proxy can feed it a copy of what it relayed and
the tests can drive it one byte at a time.

Rules:
- A line ends at LF. A CR right before the LF is part of the line end (CRLF), so it is
  dropped; a CR anywhere else is data (JSON never contains a raw CR outside whitespace).
- Blank lines (empty, or only spaces, tabs and CRs) carry nothing and are skipped.
- At :meth:`NDJSONDecoder.close` an unterminated last line is still a line: a server that
  omits the final newline has still sent a whole object.

Why bytes, not text: LF is ASCII and never occurs inside a UTF-8 multi-byte sequence, so a
character that a TCP read cuts in half simply waits in the buffer with the rest of its line,
and the dialect hands the complete line to orjson without a decode/encode round trip.

Bounded memory, as in :mod:`sidecar.streams.sse`: a peer that never sends a line end must not make
us buffer without limit. Past ``max_line_bytes`` of one line (CRLF excluded; the buffer may
hold one byte more, the CR whose LF has not arrived yet) the decoder drops what it holds,
reports one :class:`NDJSONOverflow`, and discards the rest of that line up to its LF; the
next line parses normally. The relayed bytes are unaffected; only the measurement
of that line is lost. Work is O(n) in the bytes fed: each byte is scanned once for a line
end, and the pieces of a line split across feeds are joined once, when it completes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NDJSONDecoder", "NDJSONOverflow", "DEFAULT_MAX_LINE_BYTES"]

DEFAULT_MAX_LINE_BYTES = 1 << 20  # 1 MiB: far above any real token chunk
_BLANK = b" \t\r"


@dataclass(slots=True, frozen=True)
class NDJSONOverflow:
    """A line exceeded ``max_line_bytes`` and was discarded (bytes still relayed)."""

    reason: str


class NDJSONDecoder:
    """Incremental NDJSON line splitter: ``feed(bytes) -> lines``, ``close() -> lines``."""

    __slots__ = ("_parts", "_size", "_skipping", "_max_line")

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes <= 0:
            raise ValueError("max_line_bytes must be positive")
        self._max_line = max_line_bytes
        self._parts: list[bytes] = []  # pieces of the incomplete current line
        self._size = 0  # bytes held in _parts
        self._skipping = False  # discarding an oversized line up to its LF

    def feed(self, chunk: bytes) -> list[bytes | NDJSONOverflow]:
        out: list[bytes | NDJSONOverflow] = []
        if not chunk:
            return out
        pos = 0
        find = chunk.find
        while True:
            nl = find(b"\n", pos)
            if nl == -1:
                if not self._skipping and pos < len(chunk):
                    self._hold(chunk[pos:], out)
                return out
            piece = chunk[pos:nl]
            pos = nl + 1
            if self._skipping:
                self._skipping = False
                continue
            if self._parts:
                self._parts.append(piece)
                line = b"".join(self._parts)
                self._parts = []
                self._size = 0
            else:
                line = piece
            self._line(line, out)

    def close(self) -> list[bytes | NDJSONOverflow]:
        """End of stream: an unterminated final line is emitted if it holds anything."""
        out: list[bytes | NDJSONOverflow] = []
        if self._parts:
            line = b"".join(self._parts)
            self._parts = []
            self._size = 0
            self._line(line, out)
        self._skipping = False
        return out

    # -- internals ---------------------------------------------------------------------

    def _hold(self, rest: bytes, out: list[bytes | NDJSONOverflow]) -> None:
        self._size += len(rest)
        # One byte of slack: the held part may end with the CR of a CRLF still to come,
        # which is not part of the line. The complete line is checked exactly in _line.
        if self._size > self._max_line + 1:
            self._parts = []
            self._size = 0
            self._skipping = True
            out.append(NDJSONOverflow(f"line longer than {self._max_line} bytes"))
        else:
            self._parts.append(rest)

    def _line(self, line: bytes, out: list[bytes | NDJSONOverflow]) -> None:
        if line[-1:] == b"\r":
            line = line[:-1]
        if len(line) > self._max_line:
            out.append(NDJSONOverflow(f"line longer than {self._max_line} bytes"))
            return
        if not line.strip(_BLANK):
            return
        out.append(line)
