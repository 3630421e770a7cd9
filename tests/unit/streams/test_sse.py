"""WHATWG event-stream rules for the sans-I/O SSE decoder.

Every case runs the way h11 tests its readers: the whole input in one feed, one byte at a
time, at random split points (hypothesis), and with trailing incomplete data after it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from sidecar.streams.sse import SSEDecoder, SSEEvent, SSEOverflow

FAST = settings(max_examples=250, deadline=None)
BOM = b"\xef\xbb\xbf"


# -- drivers ---------------------------------------------------------------------------


def feed_chunks(chunks, *, close=True, **kw):
    dec = SSEDecoder(**kw)
    out = []
    for chunk in chunks:
        out += dec.feed(chunk)
    if close:
        out += dec.close()
    return out


def whole(data: bytes, **kw):
    return feed_chunks([data], **kw)


def bytewise(data: bytes, **kw):
    return feed_chunks([data[i : i + 1] for i in range(len(data))], **kw)


def split_at(data: bytes, cuts) -> list[bytes]:
    cuts = sorted(set(cuts))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def draw_chunks(draw, data: bytes) -> list[bytes]:
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=12))
    chunks = split_at(data, cuts)
    # Empty feeds are legal and must change nothing.
    if draw(st.booleans()):
        chunks.insert(draw(st.integers(0, len(chunks))), b"")
    return chunks


def ev(data: bytes | str, event: str = "message", id: str | None = None, retry: int | None = None):
    if isinstance(data, str):
        data = data.encode()
    return SSEEvent(data, event, id, retry)


# -- the rules, as (name, input, expected events) -------------------------------------

CASES = [
    ("lf", b"data: a\n\ndata: b\n\n", [ev("a"), ev("b")]),
    ("crlf", b"data: a\r\n\r\ndata: b\r\n\r\n", [ev("a"), ev("b")]),
    ("cr_only", b"data: a\r\rdata: b\r\r", [ev("a"), ev("b")]),
    ("mixed_line_ends", b"data: a\r\ndata: b\rdata: c\n\r\n", [ev("a\nb\nc")]),
    # CRLF is one line end: "data: a\r\n" then "data: b" must not see a blank line between.
    ("crlf_is_one_line_end", b"data: a\r\ndata: b\r\n\r\n", [ev("a\nb")]),
    ("multiline_data", b"data: one\ndata: two\ndata: three\n\n", [ev("one\ntwo\nthree")]),
    ("data_without_colon", b"data\n\n", [ev("")]),
    ("data_without_colon_joins", b"data\ndata: x\n\n", [ev("\nx")]),
    ("empty_data_field", b"data:\n\n", [ev("")]),
    ("data_no_space", b"data:abc\n\n", [ev("abc")]),
    ("data_one_space_stripped", b"data: abc\n\n", [ev("abc")]),
    ("data_only_one_space_stripped", b"data:  two spaces\n\n", [ev(" two spaces")]),
    ("data_colon_in_value", b'data: {"a": "b:c"}\n\n', [ev('{"a": "b:c"}')]),
    ("comment_keepalive", b": ping\n\n: ping\n\n", []),
    ("bare_colon_comment", b":\n\n", []),
    ("comment_inside_event", b"data: a\n: ping\ndata: b\n\n", [ev("a\nb")]),
    ("event_field", b"event: delta\ndata: x\n\n", [ev("x", event="delta")]),
    ("event_type_resets", b"event: delta\ndata: x\n\ndata: y\n\n", [ev("x", "delta"), ev("y")]),
    ("empty_event_is_message", b"event:\ndata: x\n\n", [ev("x")]),
    ("event_last_wins", b"event: a\nevent: b\ndata: x\n\n", [ev("x", "b")]),
    ("id_field", b"id: 7\ndata: x\n\n", [ev("x", id="7")]),
    ("id_persists", b"id: 7\ndata: x\n\ndata: y\n\n", [ev("x", id="7"), ev("y", id="7")]),
    ("id_last_wins", b"id: 1\ndata: x\n\nid: 2\ndata: y\n\n", [ev("x", id="1"), ev("y", id="2")]),
    (
        "id_with_nul_ignored",
        b"id: 1\ndata: x\n\nid: 2\x003\ndata: y\n\n",
        [ev("x", id="1"), ev("y", id="1")],
    ),
    ("id_empty_resets", b"id: 1\ndata: x\n\nid\ndata: y\n\n", [ev("x", id="1"), ev("y", id="")]),
    # The id buffer is set even by an event that is never dispatched.
    ("id_without_data_persists", b"id: 9\n\ndata: y\n\n", [ev("y", id="9")]),
    ("retry_digits", b"retry: 3000\ndata: x\n\n", [ev("x", retry=3000)]),
    ("retry_not_digits", b"retry: 3s\nretry: -1\nretry:\nretry:  5\ndata: x\n\n", [ev("x")]),
    (
        "retry_persists",
        b"retry: 10\ndata: x\n\ndata: y\n\n",
        [ev("x", retry=10), ev("y", retry=10)],
    ),
    ("unknown_fields_ignored", b"foo: bar\nDATA: no\ndata : no\ndata: yes\n\n", [ev("yes")]),
    ("no_data_no_dispatch", b"event: ping\n\nid: 3\nretry: 5\n\n", []),
    ("blank_lines_only", b"\n\n\r\n\r\r\n", []),
    ("bom_stripped", BOM + b"data: a\n\n", [ev("a")]),
    ("bom_only_once", BOM + BOM + b"data: a\n\ndata: b\n\n", [ev("b")]),
    ("bom_later_not_stripped", b"data: a\n\n" + BOM + b"data: b\n\n", [ev("a")]),
    ("utf8_multibyte", "data: héllo 世界 🎉\n\n".encode(), [ev("héllo 世界 🎉")]),
    ("utf8_event_and_id", "event: ünï\nid: ид\ndata: x\n\n".encode(), [ev("x", "ünï", "ид")]),
    ("nul_in_data_kept", b"data: a\x00b\n\n", [ev(b"a\x00b")]),
    ("unterminated_event_dropped", b"data: a\n\ndata: b\n", [ev("a")]),
    ("unterminated_line_dropped", b"data: a\n\ndata: b", [ev("a")]),
    ("unterminated_after_cr", b"data: a\r\rdata: b\r", [ev("a")]),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("name,data,expected", CASES, ids=IDS)
def test_whole(name, data, expected):
    assert whole(data) == expected


@pytest.mark.parametrize("name,data,expected", CASES, ids=IDS)
def test_one_byte_at_a_time(name, data, expected):
    assert bytewise(data) == expected


@pytest.mark.parametrize("name,data,expected", CASES, ids=IDS)
def test_dispatched_on_blank_line_not_at_close(name, data, expected):
    assert feed_chunks([data], close=False) == expected


@pytest.mark.parametrize(
    "trailing",
    [b"data: never", b"data: never\n", b"data: nev", b"event: x\nid", b"\xe4\xb8", BOM[:2]],
)
@pytest.mark.parametrize("name,data,expected", CASES, ids=IDS)
def test_trailing_incomplete_data(name, data, expected, trailing):
    assert whole(data + trailing) == expected
    assert bytewise(data + trailing) == expected


@FAST
@given(st.data())
def test_random_splits(data):
    name, raw, expected = data.draw(st.sampled_from(CASES))
    assert feed_chunks(draw_chunks(data.draw, raw)) == expected


# -- line ends split across feeds -------------------------------------------------------


def test_cr_then_lf_in_next_chunk_is_one_line_end():
    # Were CR and LF two line ends, "data: a" would be dispatched alone by a phantom
    # blank line and "b" would arrive as a second event.
    assert feed_chunks([b"data: a\r", b"\ndata: b\r\n\r\n"]) == [ev("a\nb")]


def test_cr_then_lone_lf_chunk():
    assert feed_chunks([b"data: a\r", b"\n", b"data: b\r", b"\n", b"\r", b"\n"]) == [ev("a\nb")]


def test_cr_then_empty_chunk_then_lf():
    assert feed_chunks([b"data: a\r", b"", b"\n", b"data: b\r\n\r\n"]) == [ev("a\nb")]


def test_cr_then_cr_is_blank_line():
    assert feed_chunks([b"data: a\r", b"\rdata: b\r\r"]) == [ev("a"), ev("b")]


def test_lf_after_consumed_crlf_is_blank_line():
    # CR | LF LF: the first LF completes CRLF, the second is the blank line.
    assert feed_chunks([b"data: a\r", b"\n\n"]) == [ev("a")]


# -- BOM ------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_bom_split_across_feeds(cut):
    data = BOM + b"data: a\n\n"
    assert feed_chunks([data[:cut], data[cut:]]) == [ev("a")]


def test_bom_bytewise_with_empty_feeds():
    assert feed_chunks([b"", b"\xef", b"", b"\xbb", b"\xbf", b"data: a\n\n"]) == [ev("a")]


def test_partial_bom_then_close_yields_nothing():
    assert feed_chunks([b"\xef\xbb"]) == []


def test_bom_not_stripped_after_first_feed():
    assert feed_chunks([b"data: a\n\n", BOM + b"data: b\n\n"]) == [ev("a")]


# -- UTF-8 split inside a character ------------------------------------------------------


def test_utf8_split_inside_every_character():
    text = "data: ∑ 𝔘 日本語 é\n\n"
    raw = text.encode()
    for cut in range(1, len(raw)):
        out = feed_chunks([raw[:cut], raw[cut:]])
        assert out == [ev("∑ 𝔘 日本語 é")]
        assert out[0].data.decode("utf-8") == "∑ 𝔘 日本語 é"


# -- bounded buffers ----------------------------------------------------------------------

MAX_LINE = 64


def overflow_stream(long_len: int, eol: bytes = b"\n") -> tuple[bytes, list]:
    data = (
        b"data: before"
        + eol
        + eol
        + b"data: "
        + b"x" * long_len
        + eol
        + eol
        + b"data: after"
        + eol
        + eol
    )
    return data, [ev("before"), SSEOverflow, ev("after")]


def normalise(out):
    return [type(o) if isinstance(o, SSEOverflow) else o for o in out]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("driver", [whole, bytewise], ids=["whole", "bytewise"])
def test_long_line_one_overflow_then_resumes(driver, eol):
    data, expected = overflow_stream(10 * MAX_LINE, eol)
    assert normalise(driver(data, max_line_bytes=MAX_LINE)) == expected


def test_line_exactly_at_bound_is_fine():
    line = b"data: " + b"y" * (MAX_LINE - 6)
    assert len(line) == MAX_LINE
    assert bytewise(line + b"\n\n", max_line_bytes=MAX_LINE) == [ev("y" * (MAX_LINE - 6))]
    assert normalise(bytewise(line + b"z\n\n", max_line_bytes=MAX_LINE)) == [SSEOverflow]


@FAST
@given(st.data())
def test_long_line_random_splits(data):
    eol = data.draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    long_len = data.draw(st.integers(MAX_LINE, 6 * MAX_LINE))
    raw, expected = overflow_stream(long_len, eol)
    assert normalise(feed_chunks(draw_chunks(data.draw, raw), max_line_bytes=MAX_LINE)) == expected


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 50, MAX_LINE + 1, 3 * MAX_LINE])
def test_long_line_in_small_chunks_memory_bounded(chunk_size):
    raw, expected = overflow_stream(100 * MAX_LINE)
    dec = SSEDecoder(max_line_bytes=MAX_LINE)
    out = []
    for i in range(0, len(raw), chunk_size):
        out += dec.feed(raw[i : i + chunk_size])
        assert len(dec._tail) <= MAX_LINE + chunk_size
        assert len(dec._tail) <= MAX_LINE  # in fact never beyond the bound itself
    out += dec.close()
    assert normalise(out) == expected


def test_endless_line_reports_once():
    dec = SSEDecoder(max_line_bytes=MAX_LINE)
    out = []
    for _ in range(1000):
        out += dec.feed(b"z" * 17)
        assert len(dec._tail) <= MAX_LINE
    out += dec.feed(b"\n\ndata: ok\n\n")
    assert normalise(out) == [SSEOverflow, ev("ok")]


def test_long_line_mid_event_discards_the_event():
    # The event lost a data line: dispatching the remaining lines would be a fragment.
    raw = b"data: a\ndata: " + b"x" * 200 + b"\ndata: b\n\ndata: next\n\n"
    for driver in (whole, bytewise):
        assert normalise(driver(raw, max_line_bytes=MAX_LINE)) == [SSEOverflow, ev("next")]


def test_long_comment_line_overflows_too():
    raw = b": " + b"p" * 500 + b"\n\ndata: ok\n\n"
    assert normalise(bytewise(raw, max_line_bytes=MAX_LINE)) == [SSEOverflow, ev("ok")]


@pytest.mark.parametrize("driver", [whole, bytewise], ids=["whole", "bytewise"])
def test_event_over_max_event_bytes_overflows_once(driver):
    line = b"data: " + b"x" * 40 + b"\n"  # 41 bytes of data each, well under the line bound
    raw = line * 5 + b"\n" + b"data: after\n\n"
    out = driver(raw, max_line_bytes=MAX_LINE, max_event_bytes=100)
    assert normalise(out) == [SSEOverflow, ev("after")]
    assert "event" in out[0].reason


def test_event_within_max_event_bytes():
    line = b"data: " + b"x" * 40 + b"\n"
    raw = line * 2 + b"\n"
    assert whole(raw, max_line_bytes=MAX_LINE, max_event_bytes=100) == [
        ev(("x" * 40 + "\n") + "x" * 40)
    ]


def test_endless_event_reports_once_and_holds_nothing():
    dec = SSEDecoder(max_line_bytes=MAX_LINE, max_event_bytes=256)
    out = []
    for _ in range(2000):
        out += dec.feed(b"data: 0123456789\n")
        assert dec._data_size <= 256 + 16
    out += dec.feed(b"\ndata: ok\n\n")
    assert normalise(out) == [SSEOverflow, ev("ok")]


def test_default_event_bound_is_four_lines():
    dec = SSEDecoder(max_line_bytes=10)
    assert dec._max_event == 40


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_bound_fails_at_construction(bad):
    with pytest.raises(ValueError):
        SSEDecoder(max_line_bytes=bad)


def test_overflow_at_close_in_unterminated_tail():
    # An unterminated tail is interpreted at close; exceeding the event bound there is
    # reported, and still nothing is dispatched.
    out = feed_chunks(
        [b"data: " + b"x" * 40 + b"\ndata: " + b"y" * 40],
        max_line_bytes=MAX_LINE,
        max_event_bytes=60,
    )
    assert normalise(out) == [SSEOverflow]


# -- properties ---------------------------------------------------------------------------

line_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=20
)
event_name = st.one_of(st.none(), line_text.filter(bool))
events_strategy = st.lists(
    st.tuples(event_name, st.lists(line_text, min_size=1, max_size=3)), max_size=8
)
EOLS = [b"\n", b"\r\n", b"\r"]


@FAST
@given(st.data())
def test_roundtrip_any_events_any_line_ends_any_splits(data):
    events = data.draw(events_strategy)
    mixed = data.draw(st.booleans())
    style = data.draw(st.sampled_from(EOLS))

    last = [b""]

    def eol():
        if not mixed:
            return style
        choice = data.draw(st.sampled_from(EOLS))
        if last[0] == b"\r" and choice == b"\n":
            choice = b"\r\n"  # CR then LF would be one CRLF line end, not two
        last[0] = choice
        return choice

    raw = b""
    if data.draw(st.booleans()):
        raw += BOM
    expected = []
    for name, lines in events:
        if data.draw(st.booleans()):
            raw += b": keep-alive" + eol()
        if name is not None:
            raw += b"event: " + name.encode() + eol()
        for line in lines:
            raw += b"data: " + line.encode() + eol()
        raw += eol()
        expected.append(ev("\n".join(lines), name or "message"))

    assert whole(raw) == expected
    assert feed_chunks(draw_chunks(data.draw, raw)) == expected


@FAST
@given(st.binary(max_size=300), st.data())
def test_any_bytes_any_split_never_raises(raw, data):
    max_line = data.draw(st.sampled_from([1, 4, 16, 1 << 20]))
    out = feed_chunks(draw_chunks(data.draw, raw), max_line_bytes=max_line)
    assert all(isinstance(o, (SSEEvent, SSEOverflow)) for o in out)


# Fragments that make the fuzzer hit real structure: fields, line ends, BOM, UTF-8.
FRAGMENTS = [
    b"data",
    b"data:",
    b": ",
    b"event:",
    b"id:",
    b"retry:",
    b"7",
    b"x",
    b"\r",
    b"\n",
    b"\r\n",
    b" ",
    b":",
    BOM,
    BOM[:2],
    b"\xe6\x97",
    b"\xa5",
    b"\x00",
    b"y" * 20,
]


@FAST
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40), st.data())
def test_split_invariance_structured_fuzz(fragments, data):
    raw = b"".join(fragments)
    max_line = data.draw(st.sampled_from([8, 24, 1 << 20]))
    max_event = data.draw(st.sampled_from([None, 30]))
    kw = {"max_line_bytes": max_line, "max_event_bytes": max_event}
    expected = whole(raw, **kw)
    assert feed_chunks(draw_chunks(data.draw, raw), **kw) == expected
    assert bytewise(raw, **kw) == expected
