"""Sans-I/O HTTP/1.1 for the upstream side: request heads out, response bytes in.

Why our own and not aiohttp's client: the relay wants the upstream's body *pushed* to it,
one decoded piece per socket read, straight from the connection's ``data_received``, so
that a token costs one read, one write and the measuring, with no future, task wake-up,
stream buffer or per-read timer in between (see :mod:`sidecar.relay.data.upstream`). Parsing is
the same job whoever does the I/O, so it lives here, free of sockets and asyncio, and is
tested whole, byte by byte and at random splits like every other parser in the project.

Scope is what a reverse proxy in front of one inference server needs (RFC 9112):

- status line ``HTTP/1.x NNN reason``, header fields, interim 1xx responses skipped;
- body framing by ``Transfer-Encoding: chunked`` (extensions ignored, trailers discarded),
  by ``Content-Length``, or by connection close; none for HEAD, 1xx, 204 and 304;
- keep-alive: whether the connection may carry another request afterwards.

Strict where leniency would let the client see something other than what the server
meant: line ends must be CRLF, a field name is a token with no space before the colon,
obsolete line folding, a transfer coding other than plain ``chunked``, conflicting or
malformed ``Content-Length``, and ``Transfer-Encoding`` together with ``Content-Length``
(RFC 9112 section 6.3: a smuggling sign) all raise :class:`ProtocolError`, the one error
type for bad peer input; the proxy turns it into a 502 before the response starts, or a
truncated stream after.

Bounded memory: the head may not exceed ``max_head_bytes``, a chunk-size line 4 KiB and a
trailer line ``max_head_bytes`` (at any split of the reads); body bytes are never held back: each feed
returns the body bytes it completes, so a piece is relayed as soon as its read arrives.
Work is O(n): every byte is looked at once, except a held partial head or size line.
"""

from __future__ import annotations

import re
from operator import itemgetter
from typing import TYPE_CHECKING

from ...base.speedups import chunk_payload, chunk_payloads, hex_size

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["ProtocolError", "ResponseHead", "ResponseParser", "lowered_names", "request_head"]

_CRLF = b"\r\n"
_MAX_SIZE_LINE = 4096  # a chunk-size line with extensions; a real one is "1a3\r\n"
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

# Parser states.
_HEAD, _LENGTH, _SIZE, _DATA, _DATA_END, _TRAILER, _CLOSE, _DONE = range(8)


class ProtocolError(Exception):
    """The upstream's bytes are not a well-framed HTTP/1.1 response.

    ``pieces``: body bytes the failing feed decoded before the fault, so the relay can
    still pass on every valid byte before it cuts the stream."""

    pieces: list[bytes] = []


class ResponseHead:
    """Status line and header fields of the final (non-1xx) response.

    ``headers`` keeps the server's order, spelling and repeats; values are decoded as
    UTF-8 with ``surrogateescape`` so valid UTF-8 round-trips exactly.
    """

    __slots__ = (
        "version",
        "status",
        "reason",
        "headers",
        "keep_alive",
        "chunked",
        "length",
        "raw_reason",
        "raw_fields",
        "names",
    )

    def __init__(
        self,
        version: str,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        raw_reason: bytes = b"",
        raw_fields: list[bytes] | None = None,
        names: list[str] | None = None,
    ) -> None:
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers
        # The bytes as received, for relaying the head unchanged: the status line after the
        # code (with its space, if any) and each header field line (without its CRLF).
        self.raw_reason = raw_reason
        self.raw_fields = raw_fields if raw_fields is not None else []
        # Each field's name in lower case, in order (lowered once, by the parser).
        self.names = names if names is not None else [name.lower() for name, _ in headers]
        self.keep_alive = True
        self.chunked = False
        self.length: int | None = None  # declared Content-Length, when framed by it

    def get(self, name: str, default: str | None = None) -> str | None:
        """First value of a header, case-insensitively."""
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return default

    def __repr__(self) -> str:
        return f"ResponseHead({self.status} {self.reason!r}, {len(self.headers)} headers)"


class ResponseParser:
    """One response on one connection: ``feed(bytes) -> body pieces``, then ``feed_eof()``.

    ``head`` is set by the feed that completes the head (the body bytes that came with it
    are returned by that same feed); ``done`` once the body is complete. Bytes after the
    end of the message are kept in ``trailing`` (a well-behaved server sends none before
    the next request; if it did, the connection is not reused).

    ``between_chunks``: between two chunks of a chunked body, nothing partial held. A read
    that is one whole, well-formed chunk is then exactly that chunk: ``chunk_payload(read)``
    (sidecar/base/speedups.py) is its payload and the parser stays as it is, between chunks
    (what :meth:`feed` does first; the upstream connection does the same for each read, the
    shape of almost every read of a token stream, without a call to ask). It also means the
    read is a complete chunk with no extension (a size line of 1 to 15 hex digits), which
    the relay may pass on to a chunked client as it is. A plain attribute, kept as the
    state moves: read once a read, asked nothing.
    """

    __slots__ = (
        "head",
        "done",
        "trailing",
        "between_chunks",
        "_state",
        "_buf",
        "_remaining",
        "_no_body",
        "_max_head",
    )

    def __init__(self, *, no_body: bool = False, max_head_bytes: int = 64 << 10) -> None:
        self.head: ResponseHead | None = None
        self.done = False
        self.trailing = b""
        self.between_chunks = False
        self._state = _HEAD
        self._buf = b""  # a partial head, size line or trailer section
        self._remaining = 0  # body bytes still expected (Content-Length or current chunk)
        self._no_body = no_body  # the request was HEAD: whatever the headers say, no body
        self._max_head = max_head_bytes

    @property
    def keep_alive(self) -> bool:
        """The connection may carry another request once this response is done."""
        return self.done and not self.trailing and self.head is not None and self.head.keep_alive

    def whole_chunks(self, data: bytes) -> list[bytes] | None:
        """For a read that is whole, well-formed data chunks back to back (what a busy
        upstream's coalesced reads look like), possibly ending with the body's last chunk
        exactly (``0`` CRLF CRLF: no extension, no trailer, nothing after): their payloads,
        and the parser's state what :meth:`feed` leaves for that read (between chunks, or
        ``done``); else None and nothing happened, so call :meth:`feed`.

        Unless the read ended the body, the relay may then pass ``data`` on to a chunked
        client as it is, in one write.
        """
        if not self.between_chunks:
            return None
        found = chunk_payloads(data)  # in C where built (sidecar/base/speedups.py)
        if found is None:
            return None
        pieces, last = found
        if last:
            self._finish()
        return pieces

    def feed(self, data: bytes) -> list[bytes]:
        if self.between_chunks:
            piece = chunk_payload(data)
            if piece is not None:
                return [piece]
        elif self._state == _LENGTH and len(data) < self._remaining:
            self._remaining -= len(data)
            return [data] if data else []
        out: list[bytes] = []
        try:
            self._feed(data, out)
        except ProtocolError as exc:
            exc.pieces = out
            raise
        finally:
            self.between_chunks = self._state == _SIZE and not self._buf
        return out

    def feed_eof(self) -> list[bytes]:
        """The connection was closed by the server. Ends a close-delimited body; anywhere
        else it means the response was cut short, which raises :class:`ProtocolError`."""
        if self._state == _CLOSE:
            self._finish()
            return []
        if self._state == _DONE:
            return []
        if self._state == _HEAD:
            raise ProtocolError("connection closed before a complete response head")
        raise ProtocolError("connection closed before the end of the response body")

    # -- the general path ------------------------------------------------------------------

    def _feed(self, data: bytes, out: list[bytes]) -> None:
        if self._buf:
            data = self._buf + data
            self._buf = b""
        pos = 0
        end = len(data)
        while pos < end:
            state = self._state
            if state == _LENGTH:
                take = min(self._remaining, end - pos)
                out.append(data if take == end and pos == 0 else data[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._finish()
            elif state == _SIZE:
                eol = data.find(_CRLF, pos, pos + _MAX_SIZE_LINE)
                if eol == -1:
                    if end - pos >= _MAX_SIZE_LINE:
                        raise ProtocolError("chunk-size line too long")
                    if b"\n" in data[pos:]:  # no CRLF in it, so a bare LF: never wait on it
                        raise ProtocolError("chunk-size line not ended by CRLF")
                    self._buf = data[pos:]
                    return
                self._remaining = _chunk_size(data[pos:eol])
                pos = eol + 2
                self._state = _DATA if self._remaining else _TRAILER
            elif state == _DATA:
                take = min(self._remaining, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_END
            elif state == _DATA_END:
                if end - pos < 2:
                    if data[pos:] != b"\r":
                        raise ProtocolError("chunk data not followed by CRLF")
                    self._buf = data[pos:]
                    return
                if data[pos : pos + 2] != _CRLF:
                    raise ProtocolError("chunk data not followed by CRLF")
                pos += 2
                self._state = _SIZE
            elif state == _TRAILER:
                # Trailer fields up to an empty line; read and dropped (never relayed: the
                # client's response is re-framed, and trailers are rarely meaningful here).
                eol = data.find(_CRLF, pos)
                if eol == -1:
                    # + 1: a held line may end in the CR of its CRLF (same limit at any split)
                    if end - pos > self._max_head + 1:
                        raise ProtocolError("trailer section too long")
                    if b"\n" in data[pos:]:
                        raise ProtocolError("trailer line not ended by CRLF")
                    self._buf = data[pos:]
                    return
                if eol - pos > self._max_head:
                    raise ProtocolError("trailer section too long")
                if b"\r" in data[pos:eol] or b"\n" in data[pos:eol]:
                    raise ProtocolError("trailer line not ended by CRLF")
                line_empty = eol == pos
                pos = eol + 2
                if line_empty:
                    self._finish()
            elif state == _CLOSE:
                out.append(data if pos == 0 else data[pos:])
                pos = end
            elif state == _HEAD:
                pos = self._head(data, pos)
                if pos < 0:
                    return
            else:  # _DONE: anything more is not part of this response
                self.trailing += data[pos:]
                return

    def _finish(self) -> None:
        self._state = _DONE
        self.done = True
        self.between_chunks = False

    def _head(self, data: bytes, pos: int) -> int:
        """Parse one head (interim or final) from ``data[pos:]``; return the position after
        it, or -1 when the head is incomplete (then it is held in the buffer)."""
        stop = data.find(b"\r\n\r\n", pos)
        if stop == -1:
            # + 3: a held head may end in part of its CRLFCRLF (same limit at any split)
            if len(data) - pos > self._max_head + 3:
                raise ProtocolError(f"response head larger than {self._max_head} bytes")
            if data.count(b"\n", pos) != data.count(b"\r\n", pos):  # a bare LF: never wait on it
                raise ProtocolError("response head line not ended by CRLF")
            self._buf = data[pos:]
            return -1
        if stop - pos > self._max_head:
            raise ProtocolError(f"response head larger than {self._max_head} bytes")
        status_line, crlf, block = data[pos:stop].partition(_CRLF)
        version, status, reason = _status_line(status_line)
        if crlf:
            raw_fields = block.split(_CRLF)
            headers, lowered = _fields(block)
        else:
            raw_fields, headers, lowered = [], [], []
        after = stop + 4
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("the upstream switched protocols, which is not relayed")
            return after  # interim response (100 Continue, 103 Early Hints): skip it
        head = ResponseHead(version, status, reason, headers, status_line[12:], raw_fields, lowered)
        self._frame(head, lowered)
        self.head = head
        return after

    def _frame(self, head: ResponseHead, lowered: list[str]) -> None:
        """Decide how the body is delimited (RFC 9112 section 6.3). ``lowered``: the
        header names in lower case, in order."""
        coding: list[str] = []
        lengths: list[str] = []
        connection: list[str] = []
        for lower, (_, value) in zip(lowered, head.headers, strict=True):
            if lower == "transfer-encoding":
                if value == "chunked":  # (what a server sends: the general rule's answer)
                    coding += ("chunked",)
                else:
                    coding.extend(v.strip().lower() for v in value.split(","))
            elif lower == "content-length":
                lengths.extend(v.strip() for v in value.split(","))
            elif lower == "connection":
                connection.extend(v.strip().lower() for v in value.split(","))
        head.keep_alive = head.version == "1.1" and "close" not in connection
        if self._no_body or head.status in (204, 304):
            self._finish()
            return
        if coding:
            if lengths:
                raise ProtocolError("response has both Transfer-Encoding and Content-Length")
            if coding != ["chunked"]:
                raise ProtocolError(f"unsupported transfer coding: {', '.join(coding)}")
            head.chunked = True
            self._state = _SIZE
            return
        if lengths:
            if len(set(lengths)) != 1 or not lengths[0].isdigit() or not lengths[0].isascii():
                raise ProtocolError("invalid Content-Length")
            head.length = self._remaining = int(lengths[0])
            if self._remaining:
                self._state = _LENGTH
            else:
                self._finish()
            return
        head.keep_alive = False  # the body ends when the server closes the connection
        self._state = _CLOSE


_STATUS_CLASSES = (b"1", b"2", b"3", b"4", b"5")


def _status_line(line: bytes) -> tuple[str, int, str]:
    # (Slices and comparisons, no method calls, but the code's digits and the reason's text.)
    if (
        line[:7] != b"HTTP/1."
        or not line[11:12]  # shorter than 12 bytes
        or line[8:9] != b" "
        or line[12:13] not in (b" ", b"")
    ):
        raise ProtocolError("invalid status line")
    minor = line[7:8]
    code = line[9:12]
    # 100-599: RFC 9110 defines no other class, and a code outside them is not a response
    # a client can act on (nor a ``code`` label value).
    if minor not in (b"0", b"1") or not code.isdigit() or code[:1] not in _STATUS_CLASSES:
        raise ProtocolError("invalid status line")
    reason = line[13:]
    if b"\r" in reason or b"\n" in reason or b"\0" in reason:
        raise ProtocolError("invalid status line")
    return "1.1" if minor == b"1" else "1.0", int(code), reason.decode("latin-1")


_TCHAR_TEXT = frozenset(chr(c) for c in _TCHAR)
_TCHARS = r"[-!#$%&'*+.^_`|~0-9A-Za-z]"  # _TCHAR as a class (ASCII ranges only)
# A block every line of which is a valid field: what the line-by-line checks accept, as one
# match (possessive: no backtracking, linear in the block).
_VALID_BLOCK = re.compile(rf"{_TCHARS}++:[^\r\n\0]*+(?:\r\n{_TCHARS}++:[^\r\n\0]*+)*+")
# In a valid block, each field: its name and its value without the blanks around it (a run
# of blanks is part of the value only when more of the value follows it).
_FIELD = re.compile(
    rf"({_TCHARS}++):[ \t]*+((?:[^ \t\r\n]++|[ \t]++(?=[^ \t\r\n]))*+)[ \t]*+(?:\r\n|\Z)"
)
_NAME = re.compile(rf"^{_TCHARS}++(?=:)", re.MULTILINE)  # each line's name, in a valid block


def _fields(block: bytes) -> tuple[list[tuple[str, str]], list[str]]:
    """The header fields of a head's ``block`` (its lines after the status line, CRLF
    between them), in order, and their names in lower case. The block is decoded once
    (UTF-8 with ``surrogateescape``: split at the ASCII CRLF, colon and blanks, it decodes to
    what each name and value decode to alone). A block that is all valid fields (what a
    server sends) is read with one pattern; any other is checked line by line, in order, as
    RFC 9112 asks, for the first line's error."""
    text = block.decode("utf-8", "surrogateescape")
    if _VALID_BLOCK.fullmatch(text) is not None:
        # Lowering changes no ASCII name's length, and makes no line end: the same names.
        return _FIELD.findall(text), _NAME.findall(text.lower())
    return _checked_fields(text)


def _checked_fields(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """:func:`_fields` line by line: the first invalid line raises its error."""
    lines = text.split("\r\n")
    names = text.lower().split("\r\n")
    fields: list[tuple[str, str]] = []
    lowered: list[str] = []
    for i, line in enumerate(lines):
        colon = line.find(":")
        if colon <= 0:
            if line[:1] in (" ", "\t"):
                raise ProtocolError("obsolete line folding in a response header")
            raise ProtocolError("invalid response header line")
        name = line[:colon]
        if not _TCHAR_TEXT.issuperset(name):
            raise ProtocolError("invalid response header name")
        value = line[colon + 1 :].strip(" \t")
        if "\r" in value or "\n" in value or "\0" in value:
            raise ProtocolError("invalid character in a response header value")
        fields += ((name, value),)
        lowered += (names[i][:colon],)
    return fields, lowered


def _chunk_size(line: bytes) -> int:
    semi = line.find(b";")
    digits = (line if semi == -1 else line[:semi]).rstrip(b" \t")
    if b"\r" in line or b"\n" in line:  # in an extension: a bare line end
        raise ProtocolError("chunk-size line not ended by CRLF")
    size = hex_size(digits)
    if size is None:
        raise ProtocolError("invalid chunk size")
    return size


_FIELD_NAME = itemgetter(0)


def lowered_names(fields: list[tuple[str, str]]) -> list[str]:
    """Each field's name in lower case, in order, lowered as one string (no call a field).
    A name is a token, with no line end in it (the parsers refuse any other, and
    :func:`request_head` refuses to write one)."""
    return "\n".join(map(_FIELD_NAME, fields)).lower().split("\n") if fields else []


def request_head(method: str, target: str, host: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """Serialise a request head. ``headers``: (name, value) pairs, already filtered of
    hop-by-hop fields; ``Host`` is the upstream's, written first as RFC 9110 asks."""
    parts = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent")
        parts += (f"{name}: {value}\r\n",)  # (+= a tuple: no method call a header)
    parts += ("\r\n",)
    return "".join(parts).encode("utf-8", "surrogateescape")
