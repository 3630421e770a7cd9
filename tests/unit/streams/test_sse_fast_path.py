"""The SSE decoder's fast paths against its general path: same events, same state, always.

``SSEDecoder.feed`` takes whole ``data: ...\\n\\n`` events without walking their lines
(``_whole_events``), and ``lone_data`` hands a one-event chunk's data to the dialects
without building an event. ``GeneralOnly`` is the same decoder with both turned off, so
it is the general path alone (which ``test_sse.py`` holds to the WHATWG rules). Every
property drives the two side by side and compares, after *each* feed and at close, the
events returned and every piece of decoder state: not only the same events in the end, but
dispatched at the same feed, with the same id/retry/type, and leaving the same state for
whatever comes next.

The streams are built to exercise the switch between the paths: mostly plain events, cut
mostly at event boundaries (where the fast path runs), mixed with comments, other fields,
multi-line data, blank lines, CR and CRLF line ends, a BOM, UTF-8, and lines and events at
and past their bounds.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from sidecar.streams.protocols.openai import OpenAIStreamDialect
from sidecar.streams.sse import SSEDecoder, SSEEvent

FAST = settings(max_examples=400, deadline=None)
BOM = b"\xef\xbb\xbf"
STATE = tuple(s for s in SSEDecoder.__slots__ if s != "_idle")


class GeneralOnly(SSEDecoder):
    """The decoder with its fast paths switched off: the reference. Never idle, so ``feed``
    never enters its fast branch at all (not even its test for one) and ``lone_data``
    always declines."""

    __slots__ = ()

    def _settle(self) -> None:
        self._idle = False


def state(decoder: SSEDecoder) -> dict:
    return {name: getattr(decoder, name) for name in STATE}


def idle_is_honest(decoder: SSEDecoder) -> bool:
    """``_idle`` may be stale False (only slower), never stale True."""
    clean = decoder._started and not (
        decoder._tail
        or decoder._after_cr
        or decoder._skipping
        or decoder._has_data
        or decoder._event
        or decoder._discarding
    )
    return clean or not decoder._idle


# -- streams that switch between the paths --------------------------------------------------

text = st.one_of(
    st.sampled_from(
        ["", " ", "x", "[DONE]", '{"choices":[]}', "a:b", "  two", "héllo 世界", "\x00"]
    ),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=30),
).map(str.encode)
eol = st.sampled_from([b"\n"] * 6 + [b"\r\n", b"\r"])
plain_event = st.builds(
    lambda sep, value: b"data:" + sep + value + b"\n\n", st.sampled_from([b" ", b"", b"  "]), text
)
other_piece = st.one_of(
    st.builds(
        lambda v, e: b"data: " + v + e, text, eol
    ),  # a data line not (yet) followed by a blank line
    st.builds(lambda v, e: b": " + v + e, text, eol),  # comment
    st.builds(lambda v, e: b"event: " + v + e, text, eol),
    st.builds(lambda v, e: b"id: " + v + e, st.sampled_from([b"7", b"", b"a\x00b", b"x"]), eol),
    st.builds(lambda v, e: b"retry: " + v + e, st.sampled_from([b"10", b"3s", b""]), eol),
    st.builds(
        lambda v, e: b"data" + v + e, st.sampled_from([b"", b":", b"x"]), eol
    ),  # odd data fields
    st.builds(lambda v, e: b"data: " + v + e + e, text, eol),  # a whole event, any line end
    eol,  # a blank line
    st.sampled_from([b"\r", b"\n", b"\r\n", BOM, b"\xe6\x97", b"dat", b"data: x" * 12]),
    st.builds(
        lambda a, b: b"data: " + a + b"\r" + b + b"\n\n", text, text
    ),  # a CR inside: two lines
)
BOUNDS = [(1 << 20, None), (16, None), (40, None), (64, 20), (8, 8), (1, None), (30, 31)]
bounds = st.sampled_from(BOUNDS)


def near_bounds(bound: tuple[int, int | None]) -> st.SearchStrategy[bytes]:
    """Plain events whose line is at, just under or just over ``max_line_bytes`` (the line is
    ``data:``, an optional space and the value) or whose value is at, just under or just
    over ``max_event_bytes`` (which counts the value plus one). Just over comes first:
    hypothesis draws the first few choices most often."""
    line, event = bound
    sizes: list[int] = []
    for d in (1, 0, -1):
        if event is not None:
            sizes.append(event - 1 + d)
        if line < 1 << 20:
            sizes += [line - 6 + d, line - 5 + d]
    return st.builds(
        lambda sep, n: b"data:" + sep + b"y" * n + b"\n\n",
        st.sampled_from([b" ", b""]),
        st.sampled_from(list(dict.fromkeys(n for n in sizes if n >= 0)) or [0]),
    )


@st.composite
def chunked_stream(draw, bound: tuple[int, int | None] = (1 << 20, None)) -> list[bytes]:
    """Pieces fed one per chunk (a server's flushes read one by one), grouped into chunks
    mostly at piece boundaries (reads that caught several flushes), or cut anywhere."""
    piece = st.one_of(plain_event, plain_event, near_bounds(bound), near_bounds(bound), other_piece)
    pieces = draw(st.lists(piece, max_size=25))
    if draw(st.booleans()):
        pieces.insert(0, BOM)
    mode = draw(st.sampled_from(["each", "grouped", "cut"]))
    if mode == "each":
        return pieces
    if mode == "cut":
        raw = b"".join(pieces)
        cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=12))))
        return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    chunks: list[bytes] = []
    current = b""
    for p in pieces:
        if draw(st.integers(0, 9)) == 0 and len(p) > 1:  # a read boundary inside the piece
            cut = draw(st.integers(1, len(p) - 1))
            chunks.append(current + p[:cut])
            current = p[cut:]
        else:
            current += p
        if draw(st.booleans()):  # end this chunk here (at a piece boundary)
            chunks.append(current)
            current = b""
        if draw(st.integers(0, 15)) == 0:
            chunks.append(b"")  # empty reads are legal
    chunks.append(current)
    return chunks


# -- properties -----------------------------------------------------------------------------


@FAST
@given(st.data(), bounds)
def test_feed_fast_path_equals_general_path(data, bound):
    chunks = data.draw(chunked_stream(bound))
    max_line, max_event = bound
    fast = SSEDecoder(max_line, max_event)
    ref = GeneralOnly(max_line, max_event)
    for chunk in chunks:
        assert fast.feed(chunk) == ref.feed(chunk), chunk
        assert state(fast) == state(ref)
        assert idle_is_honest(fast)
    assert fast.close() == ref.close()
    assert state(fast) == state(ref)


@FAST
@given(st.data(), bounds)
def test_lone_data_is_the_event_feed_would_dispatch(data, bound):
    """The dialects' driver: ``lone_data`` first, ``feed`` when it declines."""
    chunks = data.draw(chunked_stream(bound))
    max_line, max_event = bound
    fast = SSEDecoder(max_line, max_event)
    ref = GeneralOnly(max_line, max_event)
    for chunk in chunks:
        data = fast.lone_data(chunk)
        got = (
            fast.feed(chunk)
            if data is None
            else [SSEEvent(data, "message", fast._last_id, fast._retry)]
        )
        assert got == ref.feed(chunk), chunk
        assert state(fast) == state(ref)
        assert idle_is_honest(fast)
    assert fast.close() == ref.close()


@FAST
@given(st.lists(plain_event, min_size=1, max_size=10), st.data())
def test_event_aligned_plain_streams(events, data):
    """The steady state of a real stream: every chunk one or more whole plain events."""
    fast, ref, lone = SSEDecoder(), GeneralOnly(), SSEDecoder()
    got_fast, got_ref, got_lone = [], [], []
    i = 0
    while i < len(events):
        n = data.draw(st.integers(1, 3))
        chunk = b"".join(events[i : i + n])
        i += n
        got_fast += fast.feed(chunk)
        got_ref += ref.feed(chunk)
        value = lone.lone_data(chunk)
        got_lone += lone.feed(chunk) if value is None else [SSEEvent(value)]
    assert got_fast == got_ref == got_lone
    assert len(got_ref) == len(events)


# -- when the fast paths decline ---------------------------------------------------------------


def started(**kw) -> SSEDecoder:
    dec = SSEDecoder(**kw)
    assert dec.feed(b": hello\n\n") == []  # the first feed takes the general path (BOM rule)
    return dec


def test_a_fresh_decoder_takes_a_first_event_that_starts_with_data():
    """No BOM can precede a chunk that begins with ``data:``: the first event is taken and
    the decoder is started and idle, as ``feed`` would leave it."""
    dec, ref = SSEDecoder(), GeneralOnly()
    assert dec.lone_data(b"data: a\n\n") == b"a"
    assert ref.feed(b"data: a\n\n") == [SSEEvent(b"a")]
    assert state(dec) == state(ref) and dec._idle
    assert dec.lone_data(b"data: b\n\n") == b"b"


@pytest.mark.parametrize("first", [BOM + b"data: a\n\n", BOM[:2], b"\n", b": hi\n\n", b"dat"])
def test_a_fresh_decoder_leaves_anything_else_to_feed(first):
    """A BOM (whole or a part of one held back), or any other first line: declined, nothing
    consumed, and the decoder still as new."""
    dec = SSEDecoder()
    assert dec.lone_data(first) is None
    assert state(dec) == state(SSEDecoder())
    if first == BOM[:2]:
        dec.feed(first)  # held: it may be the start of a BOM
        assert dec.lone_data(b"data: a\n\n") is None


@pytest.mark.parametrize(
    "chunk,data",
    [
        (b"data: x\n\n", b"x"),
        (b"data:x\n\n", b"x"),
        (b"data:  x\n\n", b" x"),
        (b"data:\n\n", b""),
        (b"data: \n\n", b""),
        (b"data: a:b\n\n", b"a:b"),
        (b"data: [DONE]\n\n", b"[DONE]"),
    ],
)
def test_lone_data_takes(chunk, data):
    assert started().lone_data(chunk) == data


@pytest.mark.parametrize(
    "chunk",
    [
        b"",
        b"data: x\n",  # the blank line has not arrived
        b"data: x\ny",  # nor here: a line, then the start of the next
        b"data: x",
        b"data: x\r\n\r\n",
        b"data: x\r\r",
        b"data: a\rb\n\n",  # a CR inside is a line end
        b"data: a\n\ndata: b\n\n",  # two events: feed's fast path takes these
        b"data: a\ndata: b\n\n",  # two data lines
        b": ping\n\n",
        b"event: e\ndata: x\n\n",
        b"id: 1\ndata: x\n\n",
        b"data: x\n\n\n",
        b"\ndata: x\n\n",
        b"data\n\n",
        b"Data: x\n\n",
        BOM + b"data: x\n\n",
    ],
)
def test_lone_data_declines(chunk):
    dec = started()
    assert dec.lone_data(chunk) is None
    ref = GeneralOnly()
    ref.feed(b": hello\n\n")
    assert dec.feed(chunk) == ref.feed(chunk)


@pytest.mark.parametrize("setup", [b"event: e\n", b"data: a\n", b"data: a", b"data: a\r", b": com"])
def test_lone_data_declines_while_something_is_carried(setup):
    dec = started()
    dec.feed(setup)
    assert dec.lone_data(b"data: x\n\n") is None


def test_lone_data_respects_both_bounds():
    # A line of 8 bytes is within max_line_bytes=8; 9 is over it.
    assert started(max_line_bytes=8).lone_data(b"data: ab\n\n") == b"ab"
    assert started(max_line_bytes=8).lone_data(b"data: abc\n\n") is None
    # An event's data counts len(value) + 1 against max_event_bytes.
    assert started(max_event_bytes=3).lone_data(b"data: ab\n\n") == b"ab"
    assert started(max_event_bytes=3).lone_data(b"data: abc\n\n") is None
    dec = started(max_event_bytes=3)
    assert [type(e).__name__ for e in dec.feed(b"data: abc\n\n")] == ["SSEOverflow"]


@pytest.mark.parametrize("line,event", [(16, None), (8, 8), (64, 20)])
def test_feed_fast_path_at_the_bounds(line, event):
    """Several events per chunk, values around both bounds: same as the general path."""
    sizes = [line - 7, line - 6, line - 5, line - 4] + (
        [event - 2, event - 1, event] if event else []
    )
    chunk = b"".join(
        b"data:" + sep + b"y" * n + b"\n\n" for n in sizes if n >= 0 for sep in (b" ", b"")
    )
    dec, ref = started(max_line_bytes=line, max_event_bytes=event), GeneralOnly(line, event)
    ref.feed(b": hello\n\n")
    assert dec.feed(chunk) == ref.feed(chunk)
    assert state(dec) == state(ref)


def test_feed_fast_path_hands_over_mid_chunk():
    """Plain events, then a comment and a partial event: the general path takes over at the
    comment, and the next chunk completes the event."""
    dec, ref = started(), GeneralOnly()
    ref.feed(b": hello\n\n")
    chunk = b"data: a\n\ndata: b\n\n: ping\ndata: c\n\ndata: d"
    assert dec.feed(chunk) == ref.feed(chunk) == [SSEEvent(b"a"), SSEEvent(b"b"), SSEEvent(b"c")]
    assert dec.feed(b"\n\n") == ref.feed(b"\n\n") == [SSEEvent(b"d")]
    assert dec.lone_data(b"data: e\n\n") == b"e"


def test_id_and_retry_carry_into_fast_path_events():
    dec = started()
    dec.feed(b"id: 7\nretry: 10\n\n")
    assert dec.feed(b"data: a\n\ndata: b\n\n") == [
        SSEEvent(b"a", id="7", retry=10),
        SSEEvent(b"b", id="7", retry=10),
    ]


# -- the dialect on top: the same events whichever path the framing took ---------------------


class GeneralOnlyOpenAI(OpenAIStreamDialect):
    __slots__ = ()

    def __init__(self, max_line_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes)
        self._sse = GeneralOnly(max_line_bytes) if max_line_bytes else GeneralOnly()


@FAST
@given(st.data(), st.sampled_from([None, 16, 64]))
def test_dialect_events_equal_with_and_without_fast_paths(data, max_line):
    chunks = data.draw(chunked_stream((max_line or 1 << 20, None)))
    fast, ref = OpenAIStreamDialect(max_line), GeneralOnlyOpenAI(max_line)
    for chunk in chunks:
        assert fast.feed(chunk) == ref.feed(chunk)
    assert fast.close() == ref.close()
