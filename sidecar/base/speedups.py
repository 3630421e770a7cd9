"""Three byte checks on the relay's per-read path, in C where the optional extension was
built (``sidecar/base/_speedups.c``, compiled at install when a C compiler is there), else
in Python. The Python versions here are the originals and the oracle:
tests/unit/base/test_speedups.py feeds both the same bytes.

Why C for these: with the repeating event recognised from its bytes, what is left of the
measuring per token is mostly byte work in Python (the chunk's size line parsed with
slices, ``int`` and a set; the token text decoded to check it), which C does in one call
(docs/performance.md has the measurements). A read of several chunks (a busy upstream's,
or a stream's last events and its end together) costs three calls a chunk in Python and
one call in C.

``IN_C`` says which is in use (the tests and the image check read it). The token lane, the
steady token read in one call, is C beside its one user (sidecar/relay/data/token_lane.py)
and shares these checks' C (``_bytes.h``): one compiler builds both or neither.
"""

from __future__ import annotations

__all__ = [
    "IN_C", "HEX_DIGITS", "hex_size", "size_line", "chunk_payload", "chunk_payloads", "plain_at",
    "chunk_payload_py", "chunk_payloads_py", "plain_at_py", "plain",
]  # fmt: skip

HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
"""The bytes of a chunk size line (HTTP/1.1 allows no other: no sign, no ``0x``, no space)."""


def hex_size(digits: bytes) -> int | None:
    """The size a chunk's size line states: 1 to 15 hex digits and nothing else, else None.
    The one chunk-size rule in Python (http1.py's parser and the originals here use it; the
    C's ``whole_chunk`` is checked against it through :func:`chunk_payload_py`)."""
    if 0 < len(digits) <= 15 and HEX_DIGITS.issuperset(digits):
        return int(digits, 16)
    return None


def size_line(data: bytes, pos: int) -> tuple[int, int] | None:
    """A bare size line (no extension) at ``data[pos:]``: (its size, where the payload
    starts), or None. :func:`hex_size`'s rule: its CRLF within 17 bytes is 1 to 15 digits
    (no call for the length on the per-chunk path)."""
    eol = data.find(b"\r\n", pos, pos + 17)
    if eol > pos and HEX_DIGITS.issuperset(digits := data[pos:eol]):
        return int(digits, 16), eol + 2
    return None


def chunk_payload_py(data: bytes) -> bytes | None:
    """``data``'s payload if ``data`` is exactly one whole HTTP/1.1 chunk with a non-zero
    size and no extension (a size line of 1 to 15 hex digits, CRLF, the payload, CRLF);
    else None."""
    line = size_line(data, 0)
    if line is not None:
        size, start = line
        end = start + size
        if size and len(data) == end + 2 and data[end:] == b"\r\n":
            return data[start:end]
    return None


def chunk_payloads_py(data: bytes) -> tuple[list[bytes], bool] | None:
    """The payloads of ``data`` if it is whole, well-formed chunks back to back (each a
    size line of 1 to 15 hex digits with no extension, CRLF, the payload, CRLF), possibly
    ending with the body's last chunk exactly (a zero size line, CRLF, CRLF, nothing
    after): ``(payloads, whether the last chunk ended it)``; else None (also for no bytes).
    A busy upstream's reads coalesce several events; this reads them in one call."""
    pieces: list[bytes] = []
    pos = 0
    end = len(data)
    while pos < end:
        line = size_line(data, pos)
        if line is None:  # an extension or garbage: the general path
            return None
        size, start = line
        stop = start + size
        if stop == start:  # the last chunk: the end of the body if nothing follows it
            if stop + 2 != end or data[stop:] != b"\r\n":
                return None
            return pieces, True
        if stop + 2 > end or data[stop : stop + 2] != b"\r\n":
            return None
        pieces += (data[start:stop],)  # (+= a tuple: no method call a chunk)
        pos = stop + 2
    return (pieces, False) if pieces else None


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


def plain_at_py(buf: bytes, start: int, end: int) -> bool:
    """Whether ``buf[start:end]`` is :func:`plain` and not empty (the C version decodes the
    UTF-8 in place and asks CPython's own printable table, without a copy)."""
    return start < end and plain(buf[start:end])


try:
    from ._speedups import chunk_payload, chunk_payloads, plain_at

    IN_C = True
except ImportError:  # built without a C compiler: the originals
    plain_at, chunk_payload, chunk_payloads = plain_at_py, chunk_payload_py, chunk_payloads_py
    IN_C = False

SPEEDUPS_MISSING = (
    "the C speedups are not loaded (installed without a C compiler?): the relay uses about "
    "twice the CPU per token; reinstall where gcc and Python's headers are (the image has them)"
)
"""What ``--version`` and the start line say when ``IN_C`` is False."""
