"""A long unterminated line sent in small pieces must cost O(n), not O(n^2).

A hostile or broken upstream can hold an incomplete line of up to ``max_line_bytes``
(1 MiB) and send it 200 bytes at a time. If each feed copied and rescanned everything held,
that is ~2.6 GB of copying and scanning for one line, all on the event loop. The decoder
instead appends a piece with no line end in place: the held buffer is one object that only
grows, and every byte is scanned once.
"""

from __future__ import annotations

import random

from sidecar.streams.sse import SSEDecoder, SSEEvent, SSEOverflow


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_held_line_grows_in_place_without_copies():
    decoder = SSEDecoder()
    line = b"data: " + b"x" * ((1 << 20) - 100)
    pieces = _pieces(line, 200)
    decoder.feed(pieces[0])
    decoder.feed(pieces[1])
    held = decoder._tail
    copies = 0
    for piece in pieces[2:]:
        assert decoder.feed(piece) == []
        copies += decoder._tail is not held
    assert copies == 0, "each piece copied the held line: quadratic in the line's length"
    assert len(held) == len(line)
    (event,) = decoder.feed(b"\n\n")
    assert event == SSEEvent(line[6:])


def test_in_place_growth_gives_the_same_events_as_whole_feeding():
    rng = random.Random(7)
    stream = (
        b"data: "
        + b"a" * 5000
        + b"\n\n"
        + b": comment "
        + b"c" * 3000
        + b"\r\n"
        + b"event: big\r\ndata: "
        + "é".encode() * 4000
        + b"\r\n\r\n"
        + b"data: "
        + b"z" * 20_000
        + b"\n\n"  # past the bound below: an overflow, then on
        + b"data: tail\n\n"
    )
    whole = SSEDecoder(max_line_bytes=10_000).feed(stream)
    for size in (1, 7, 200, 4096):
        decoder = SSEDecoder(max_line_bytes=10_000)
        got = [e for piece in _pieces(stream, size) for e in decoder.feed(piece)]
        assert got == whole, size
    for _ in range(20):
        decoder = SSEDecoder(max_line_bytes=10_000)
        cuts = sorted(rng.sample(range(1, len(stream)), 50))
        parts = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        assert [e for p in parts for e in decoder.feed(p)] == whole
    assert sum(isinstance(e, SSEOverflow) for e in whole) == 1
    assert whole[-1] == SSEEvent(b"tail")


def test_a_line_growing_past_the_bound_is_dropped_and_not_held():
    decoder = SSEDecoder(max_line_bytes=1000)
    out = []
    for piece in _pieces(b"data: " + b"y" * 5000, 100):
        out += decoder.feed(piece)
    assert [type(e) for e in out] == [SSEOverflow]
    assert len(decoder._tail) == 0
    assert decoder.feed(b"\n\ndata: ok\n\n") == [SSEEvent(b"ok")]
