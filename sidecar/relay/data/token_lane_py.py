"""The token lane in Python, for an install without a C compiler.

Without a lane every steady token takes the general Python path (seven functions
over as many objects: ``UpstreamConnection.data_received`` -> ``BodyRelay.chunk`` ->
``ResponseObserver.feed`` -> ``SSEJSONDialect.feed`` -> ``EventTemplate.matches`` ->
``RequestTimeline.events`` ...), and the sidecar uses about 1.9× nginx's CPU per token
against ~1.35× with C: an install where ``pip`` found no compiler would be a trap. What
makes the C lane pay is less the compiled code than keeping a token's notes in one object
(sidecar/relay/data/token_lane.py), and that holds in Python too: this lane makes the
same checks with the Python originals of the byte checks (:mod:`sidecar.base.speedups`'s
``chunk_payload_py`` and ``plain_at_py``) and keeps its notes in itself (two arrays and a
count), touching no other object's attributes per read. ``bench.micro_measure --no-c``,
the whole per-read path: 2.7 -> 1.3 µs a token (docs/performance.md).

Same API and semantics as ``TokenLane`` in ``_token_lane.c``, which :func:`token_lane.lane_for
<sidecar.relay.data.token_lane.lane_for>` builds where it was compiled (the module doc there
says when a lane is opened and what it may take). The oracle for both is the Python relay
path they stand for: tests/unit/relay/data/test_token_lane.py relays the same streams with lanes of
each kind and without, and compares the client's bytes and every figure.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, SupportsFloat, SupportsIndex

from ...base.speedups import hex_size, plain

if TYPE_CHECKING:
    from ...streams.protocols.template import EventTemplate

    Notes = Callable[[int, array[float], array[int], float], None]
    """A lane's hand-over: ``notes(sent, gaps, streams, last)`` (bytes written, the tokens'
    gaps and decoding counts, the last token's time)."""

__all__ = ["Decoding", "LaneTransport", "TokenLane", "text_lane"]

BATCH = 32
"""Tokens noted before they are handed over (the C lane's ``LANE_BATCH``)."""

_UINT_MAX = 0xFFFFFFFF  # the largest item of an ``array("I")``, the timeline's gap_streams
_ONE_CHAR_ESCAPE = re.compile(rb'\\["\\/bfnrt]')


class LaneTransport(Protocol):
    """What a lane asks of the client's transport: the three calls the relay makes per write."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    def get_write_buffer_size(self) -> int: ...


class Decoding(Protocol):
    """What a lane reads per token (:class:`~sidecar.measure.concurrency.DecodeConcurrency`):
    how many streams of the model are decoding now."""

    n: int


def text_lane(text: bytes) -> bool:
    """What a lane takes as its text (the C lane's ``text_lane``): :func:`~sidecar.base.speedups.plain`,
    or plain but for JSON's one-character escapes (``\\"`` ``\\\\`` ``\\/`` ``\\b`` ``\\f``
    ``\\n`` ``\\r`` ``\\t``; never ``\\u``). Each escape stands for one character whatever it
    is (the dialect asks only whether the text is empty), so it is replaced by a printable
    one and the rest judged by ``plain``; an escape is ASCII, so the replacement cannot make
    the bytes around it valid UTF-8. ``text`` is not empty (the lane's length check)."""
    return plain(text) or (b"\\" in text and plain(_ONE_CHAR_ESCAPE.sub(b"x", text)))


def _double(value: SupportsFloat | SupportsIndex) -> float:
    """``value`` as C's ``PyFloat_AsDouble`` reads it (a float, an int, anything with
    ``__float__`` or ``__index__``): ``float()`` would also parse a string."""
    if isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"must be a real number, not {type(value).__name__}")
    return float(value)


class TokenLane:
    """One stream's steady token read in one call: ``take(read)`` writes a read that is one
    whole HTTP chunk holding the armed event (``prefix`` + a text :func:`text_lane` takes
    + ``suffix``, at most ``limit`` bytes) to the client as it came and notes the token
    (its gap since the last one, ``decoding.n``, the bytes), when the client's buffer is
    empty, its transport open and no progress check is due; else it answers False, having
    done nothing but read the clock. ``notes(sent, gaps, streams, last)`` gets each batch
    of :data:`BATCH` and what is noted at ``flush()``. A measuring failure switches the lane
    off (``off``); an exception from the client's write goes to the caller.

    The whole-chunk check is :func:`~sidecar.base.speedups.chunk_payload_py`'s, made on the
    read in place (its size rule is the same :func:`~sidecar.base.speedups.hex_size`), and
    the text check :func:`~sidecar.base.speedups.plain`'s: the payload is not copied, and
    the template's bytes are compared where the chunk holds them
    (tests/unit/relay/data/test_token_lane.py checks it takes exactly the reads
    ``chunk_payload_py`` and the template's check take)."""

    __slots__ = (
        "_clock", "_write", "_is_closing", "_buffer_size", "_decoding", "_notes", "_memo",
        "_prefix", "_closing_bytes", "_start", "_cut", "_least", "_limit", "_kind", "_longest",
        "_check_at", "_last", "_open", "_off", "_count", "_sent", "_handed", "_gaps", "_streams",
    )  # fmt: skip

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        transport: LaneTransport,
        decoding: Decoding,
        notes: Notes,
        memo: EventTemplate,
        prefix: bytes,
        suffix: bytes,
        limit: int,
        kind: int,
        high_water: int,
        yield_after: int,
    ) -> None:
        if type(prefix) is not bytes or type(suffix) is not bytes:
            raise TypeError("prefix and suffix must be bytes")
        if not 0 <= kind <= 2:
            raise ValueError("kind: 0 answer, 1 reasoning, 2 other")
        if not callable(clock) or not callable(notes):
            raise TypeError("clock and notes must be callable")
        self._write = transport.write
        self._is_closing = transport.is_closing
        self._buffer_size = transport.get_write_buffer_size
        self._clock, self._decoding, self._notes, self._memo = clock, decoding, notes, memo
        self._prefix = prefix
        self._closing_bytes = suffix + b"\r\n"  # the event's end and the chunk's
        self._start = len(prefix)  # the text's start, from the payload's
        self._cut = len(suffix) + 2  # the text's end, from the read's
        self._least = len(prefix) + len(suffix)  # a payload must be longer: a text not empty
        self._limit, self._kind = limit.__index__(), kind
        # The longest read taken: under yield_after (the connection yields after such a
        # read) and at most high_water (the relay's flow check after the write cannot fire).
        self._longest = min(yield_after.__index__() - 1, high_water.__index__())
        self._check_at = self._last = 0.0
        self._open = self._off = False
        self._count = self._sent = self._handed = 0
        self._gaps, self._streams = array("d"), array("I")

    def take(self, data: bytes) -> bool:
        """True when ``data`` was relayed and noted here; False (nothing done) for the
        Python path to take."""
        if not self._open or data.__class__ is not bytes:
            return False
        try:
            # One whole chunk ("1a3\r\n" + payload + "\r\n") whose payload is prefix + a
            # text + suffix, at most limit bytes (EventTemplate.matches).
            n = len(data)
            eol = data.find(b"\r\n", 0, 17)
            if eol <= 0 or n > self._longest:
                return False
            if not (data.startswith(self._prefix, eol + 2) and data.endswith(self._closing_bytes)):
                return False
            size = n - eol - 4
            if not self._least < size <= self._limit:
                return False
            digits = data[:eol]
            if (
                digits != b"%x" % size and hex_size(digits) != size
            ):  # the usual spelling, else the rule
                return False
            if not text_lane(data[eol + 2 + self._start : n - self._cut]):
                return False
            now = self._clock()
            if now >= self._check_at:
                return False
            if self._is_closing() is not False:
                return False
            # An empty buffer before the write leaves at most this read (<= high_water)
            # after it: the relay's flow check after the write cannot fire.
            if self._buffer_size():
                return False
            k = self._decoding.n
            if k.__class__ is not int or not 0 <= k <= 0xFFFFFFFF:  # _UINT_MAX
                if not isinstance(k, int) or k < 0:
                    raise TypeError(f"decoding.n: {k!r} is not a count")
                if k > _UINT_MAX:
                    return False  # not an "I" array's item: the Python path says so
        except Exception:
            self._failed()
            return False
        self._write(data)
        if self._count == BATCH:
            try:
                self._hand_over()
            except Exception:
                self._failed()
                return True
        self._gaps.append(now - self._last)
        self._streams.append(k)
        self._count += 1
        self._last = now
        self._sent += n
        return True

    def open(self, check_at: float, last_token: float | None) -> bool:
        """Take reads again, the next token's gap counted from ``last_token`` (the
        timeline's), until a progress check is due at ``check_at`` (the relay's; it checks
        everything else before calling). False when switched off, or before the first token."""
        if self._off:
            return False
        at = _double(check_at)
        if self._count or self._sent:
            raise RuntimeError("open() with notes not handed over")
        if last_token is None:
            return False  # no token yet: the Python path records the first
        self._last = _double(last_token)
        self._check_at = at
        self._open = True
        return True

    def flush(self) -> None:
        """Stop taking reads, and hand the notes over."""
        self._open = False
        try:
            self._hand_over()
        except Exception:
            self._failed()

    def _hand_over(self) -> None:
        """The notes, handed to ``notes(sent, gaps, streams, last)`` and forgotten here
        (nothing noted: nothing handed)."""
        count, sent = self._count, self._sent
        gaps, streams = self._gaps, self._streams
        self._count = self._sent = 0
        self._handed += count
        if not count and not sent:
            return
        self._gaps, self._streams = array("d"), array("I")
        self._notes(sent, gaps, streams, self._last)

    def _failed(self) -> None:
        """A failure in measuring (a bug: tests pin what is read) switches the lane off for
        good; the read was relayed regardless."""
        self._off = True
        self._open = False

    @property
    def taken(self) -> int:
        """Reads taken in all."""
        return self._handed + self._count

    @property
    def off(self) -> bool:
        """Switched off by an error in measuring."""
        return self._off

    @property
    def is_open(self) -> bool:
        """Taking reads."""
        return self._open

    @property
    def pending(self) -> int:
        """Tokens noted, not yet handed over."""
        return self._count

    @property
    def memo(self) -> EventTemplate:
        """The template it stands for."""
        return self._memo
