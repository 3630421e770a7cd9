"""HTTP/1.1 response framing rules for the sans-I/O upstream parser (sidecar.relay.data.http1).

Every case runs the way h11 tests its readers: the whole input in one feed, one byte at a
time, and at random split points (hypothesis), with bytes after the end of the message.
Bad peer input must raise ProtocolError and nothing else; h11 is a reference oracle for
generated valid responses when it is installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings, strategies as st

from sidecar.base.speedups import chunk_payload
from sidecar.relay.data import http1
from sidecar.relay.data.http1 import (
    _SIZE,
    ProtocolError,
    ResponseHead,
    ResponseParser,
    request_head,
)

try:  # the reference oracle: not a requirement, usually present through httpx
    import h11
except ImportError:  # pragma: no cover
    h11 = None
needs_h11 = pytest.mark.skipif(h11 is None, reason="h11 (the reference parser) is not installed")

FAST = settings(max_examples=200, deadline=None)
SLOW = settings(max_examples=100, deadline=None)  # per example: several full parses
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
LENGTH5 = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"


# -- drivers ---------------------------------------------------------------------------


@dataclass
class Parsed:
    head: ResponseHead | None
    body: bytes
    done_before_eof: bool
    done: bool
    keep_alive: bool
    trailing: bytes


def run(chunks, *, eof: bool = True, **kw) -> Parsed:
    """Feed ``chunks``; then, if asked, ``feed_eof()``. Checks the per-feed invariants."""
    parser = ResponseParser(**kw)
    body = []
    for chunk in chunks:
        pieces = parser.feed(chunk)
        assert isinstance(pieces, list)
        assert all(type(p) is bytes and p for p in pieces), "pieces are non-empty bytes"
        if pieces:
            assert parser.head is not None, "body before the head"
        body += pieces
        if not parser.done:
            assert not parser.keep_alive
    done_before_eof = parser.done
    if eof:
        body += parser.feed_eof()
        assert parser.done
    return Parsed(
        parser.head,
        b"".join(body),
        done_before_eof,
        parser.done,
        parser.keep_alive,
        parser.trailing,
    )


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def split_at(data: bytes, cuts) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def draw_chunks(draw, data: bytes) -> list[bytes]:
    chunks = split_at(data, draw(st.lists(st.integers(0, len(data)), max_size=12)))
    if draw(st.booleans()):  # empty feeds are legal and change nothing
        chunks.insert(draw(st.integers(0, len(chunks))), b"")
    return chunks


WAYS = {"whole": lambda raw: [raw], "bytewise": bytewise}


def outcome(chunks, **kw):
    """A comparable summary: the parse, or where the ProtocolError was raised."""
    parser = ResponseParser(**kw)
    body = []
    try:
        for chunk in chunks:
            body += parser.feed(chunk)
    except ProtocolError:
        return ("error", "feed")
    before = parser.done
    try:
        body += parser.feed_eof()
    except ProtocolError:
        return ("error", "eof")
    head = parser.head
    return (
        head.version,
        head.status,
        head.reason,
        head.headers,
        head.chunked,
        head.length,
        b"".join(body),
        before,
        parser.keep_alive,
        parser.trailing,
    )


# -- valid responses, as cases with their expected view ---------------------------------


@dataclass(frozen=True)
class Ok:
    id: str
    raw: bytes
    body: bytes = b""
    status: int = 200
    reason: str = "OK"
    version: str = "1.1"
    head_keep_alive: bool = True
    chunked: bool = False
    length: int | None = None
    trailing: bytes = b""
    eof: bool = False  # close-delimited: only feed_eof() ends it
    no_body: bool = False  # the request was HEAD
    headers: tuple | None = None  # checked exactly when given
    heads: int = 1  # interim heads + the final one

    @property
    def keep_alive(self) -> bool:
        return self.head_keep_alive and not self.trailing


def chunk(data: bytes, size: str | None = None, ext: bytes = b"") -> bytes:
    return (
        (size if size is not None else f"{len(data):x}").encode() + ext + b"\r\n" + data + b"\r\n"
    )


NEXT = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"  # the start of another response
UTF8_VALUE = "Zoë – 日本語 🚀"

OK_CASES = [
    Ok("length", LENGTH5 + b"hello", b"hello", length=5, headers=(("Content-Length", "5"),)),
    Ok(
        "length_binary_body",
        b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n\r\n\r\n\x00\xff0\n",
        b"\r\n\r\n\x00\xff0\n",
        length=8,
    ),
    Ok("length_zero", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", length=0),
    Ok(
        "length_list_same",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
        b"hello",
        length=5,
    ),
    Ok(
        "length_two_headers_same",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\nContent-Length: 5\r\n\r\nhello",
        b"hello",
        length=5,
    ),
    Ok(
        "length_ows", b"HTTP/1.1 200 OK\r\nContent-Length: \t 5 \t\r\n\r\nhello", b"hello", length=5
    ),
    Ok(
        "length_leading_zeros",
        b"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n\r\nhello",
        b"hello",
        length=5,
    ),
    Ok("length_name_case", b"HTTP/1.1 200 OK\r\ncOnTeNt-LeNgTh: 2\r\n\r\nhi", b"hi", length=2),
    Ok(
        "chunked",
        CHUNKED + chunk(b"hello") + chunk(b" world") + b"0\r\n\r\n",
        b"hello world",
        chunked=True,
    ),
    Ok("chunked_no_data", CHUNKED + b"0\r\n\r\n", chunked=True),
    Ok(
        "chunked_te_case_ows",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding:  ChUnKeD \r\n\r\n" + chunk(b"x") + b"0\r\n\r\n",
        b"x",
        chunked=True,
    ),
    Ok(
        "chunked_upper_hex",
        CHUNKED + chunk(b"0123456789", "A") + chunk(b"x" * 26, "1A") + b"0\r\n\r\n",
        b"0123456789" + b"x" * 26,
        chunked=True,
    ),
    Ok(
        "chunked_lower_hex",
        CHUNKED + chunk(b"0123456789", "a") + chunk(b"y" * 0xFE, "fe") + b"0\r\n\r\n",
        b"0123456789" + b"y" * 0xFE,
        chunked=True,
    ),
    Ok(
        "chunked_leading_zeros",
        CHUNKED + chunk(b"hello", "0005") + b"000\r\n\r\n",
        b"hello",
        chunked=True,
    ),
    Ok(
        "chunked_15_hex_digits",
        CHUNKED + chunk(b"hello", "000000000000005") + b"0\r\n\r\n",
        b"hello",
        chunked=True,
    ),
    Ok("chunked_large", CHUNKED + chunk(b"z" * 5000) + b"0\r\n\r\n", b"z" * 5000, chunked=True),
    Ok(
        "chunked_crlf_in_data",
        CHUNKED + chunk(b"\r\n0\r\n\r\n") + b"0\r\n\r\n",
        b"\r\n0\r\n\r\n",
        chunked=True,
    ),
    Ok(
        "chunk_ext",
        CHUNKED + chunk(b"hello", ext=b";name=value") + chunk(b"!", ext=b";a;b=c") + b"0\r\n\r\n",
        b"hello!",
        chunked=True,
    ),
    Ok(
        "chunk_ext_quoted",
        CHUNKED + chunk(b"hello", ext=b';q="a;b\\"c"') + b"0\r\n\r\n",
        b"hello",
        chunked=True,
    ),
    Ok(
        "chunk_ext_bws",
        CHUNKED + chunk(b"hello", ext=b" ;a=b") + chunk(b"!", ext=b"\t \t;x") + b"0\r\n\r\n",
        b"hello!",
        chunked=True,
    ),
    Ok("last_chunk_ext", CHUNKED + chunk(b"hello") + b"0;final=1\r\n\r\n", b"hello", chunked=True),
    Ok(
        "trailers_discarded",
        CHUNKED + chunk(b"hello") + b'0\r\nX-Checksum: abc\r\nX-Usage: {"t": 3}\r\n\r\n',
        b"hello",
        chunked=True,
        headers=(("Transfer-Encoding", "chunked"),),
    ),
    Ok(
        "interim_100",
        b"HTTP/1.1 100 Continue\r\n\r\n" + LENGTH5 + b"hello",
        b"hello",
        length=5,
        heads=2,
        headers=(("Content-Length", "5"),),
    ),
    Ok(
        "interim_103_then_100",
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
        + CHUNKED
        + chunk(b"hi")
        + b"0\r\n\r\n",
        b"hi",
        chunked=True,
        heads=3,
        headers=(("Transfer-Encoding", "chunked"),),
    ),
    Ok(
        "interim_with_length_is_bodiless",
        b"HTTP/1.1 100 Continue\r\nContent-Length: 9\r\n\r\n" + LENGTH5 + b"hello",
        b"hello",
        length=5,
        heads=2,
    ),
    Ok(
        "interim_then_204",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
        status=204,
        reason="No Content",
        heads=2,
    ),
    Ok(
        "http10_length",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
        b"hi",
        version="1.0",
        head_keep_alive=False,
        length=2,
    ),
    Ok(
        "http10_keep_alive_header_ignored",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
        b"hi",
        version="1.0",
        head_keep_alive=False,
        length=2,
    ),
    Ok(
        "http10_close_delimited",
        b"HTTP/1.0 200 OK\r\n\r\nuntil close",
        b"until close",
        version="1.0",
        head_keep_alive=False,
        eof=True,
    ),
    Ok(
        "connection_close",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
        b"hi",
        head_keep_alive=False,
        length=2,
    ),
    Ok(
        "connection_close_in_list",
        b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, CLOSE\r\nContent-Length: 2\r\n\r\nhi",
        b"hi",
        head_keep_alive=False,
        length=2,
    ),
    Ok(
        "connection_close_second_header",
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nconnection: close\r\n"
        + CHUNKED[17:]
        + b"0\r\n\r\n",
        chunked=True,
        head_keep_alive=False,
    ),
    Ok(
        "connection_other_token",
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, closed\r\nContent-Length: 0\r\n\r\n",
        length=0,
    ),
    Ok(
        "close_delimited",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\ndata: 1\r\n\r\n0\r\n\r\n",
        b"data: 1\r\n\r\n0\r\n\r\n",
        head_keep_alive=False,
        eof=True,
    ),
    Ok(
        "close_delimited_empty",
        b"HTTP/1.1 200 OK\r\n\r\n",
        head_keep_alive=False,
        eof=True,
        headers=(),
    ),
    Ok("head_request_with_length", LENGTH5, no_body=True),
    Ok("head_request_chunked", CHUNKED, no_body=True),
    Ok("head_request_no_framing", b"HTTP/1.1 200 OK\r\n\r\n", no_body=True),
    Ok("head_request_then_bytes", LENGTH5 + b"hello", no_body=True, trailing=b"hello"),
    Ok("204", b"HTTP/1.1 204 No Content\r\n\r\n", status=204, reason="No Content"),
    Ok(
        "204_length_ignored",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        status=204,
        reason="No Content",
    ),
    Ok(
        "304",
        b'HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\nETag: "x"\r\n\r\n',
        status=304,
        reason="Not Modified",
    ),
    Ok(
        "304_chunked_header",
        b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        status=304,
        reason="Not Modified",
    ),
    Ok("trailing_after_length", LENGTH5 + b"hello" + NEXT, b"hello", length=5, trailing=NEXT),
    Ok(
        "trailing_after_chunked",
        CHUNKED + chunk(b"hi") + b"0\r\nT: 1\r\n\r\n" + NEXT,
        b"hi",
        chunked=True,
        trailing=NEXT,
    ),
    Ok(
        "trailing_after_length_zero",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n\r\n",
        length=0,
        trailing=b"\r\n",
    ),
    Ok(
        "trailing_after_204",
        b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1",
        status=204,
        reason="No Content",
        trailing=b"HTTP/1.1",
    ),
    Ok(
        "reason_empty_with_space",
        b"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n",
        reason="",
        length=0,
    ),
    Ok("reason_absent", b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", reason="", length=0),
    Ok(
        "reason_words",
        b"HTTP/1.1 503 Service Temporarily Unavailable\r\nContent-Length: 1\r\n\r\nx",
        b"x",
        status=503,
        reason="Service Temporarily Unavailable",
        length=1,
    ),
    Ok(
        "reason_obs_text",
        b"HTTP/1.1 200 Tr\xe8s bien\r\nContent-Length: 0\r\n\r\n",
        reason="Très bien",
        length=0,
    ),
    Ok(
        "status_599",
        b"HTTP/1.1 599 Odd\r\nContent-Length: 0\r\n\r\n",
        status=599,
        reason="Odd",
        length=0,
    ),
    Ok(
        "utf8_header_value",
        b"HTTP/1.1 200 OK\r\nX-Name: " + UTF8_VALUE.encode() + b"\r\nContent-Length: 0\r\n\r\n",
        length=0,
        headers=(("X-Name", UTF8_VALUE), ("Content-Length", "0")),
    ),
    Ok(
        "header_order_case_repeats_ows",
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nx-trace:\t t1 \t\r\nSET-COOKIE: b=2\r\nX-Empty:\r\n"
        b"X-Inner:  a  b  \r\nContent-Length: 0\r\n\r\n",
        length=0,
        headers=(
            ("Set-Cookie", "a=1"),
            ("x-trace", "t1"),
            ("SET-COOKIE", "b=2"),
            ("X-Empty", ""),
            ("X-Inner", "a  b"),
            ("Content-Length", "0"),
        ),
    ),
    Ok(
        "header_token_chars",
        b"HTTP/1.1 200 OK\r\n!#$%&'*+-.^_`|~09azAZ: v:w\r\nContent-Length: 0\r\n\r\n",
        length=0,
        headers=(("!#$%&'*+-.^_`|~09azAZ", "v:w"), ("Content-Length", "0")),
    ),
]
OK_IDS = [c.id for c in OK_CASES]


def nth_head_end(raw: bytes, n: int) -> int:
    pos = 0
    for _ in range(n):
        pos = raw.index(b"\r\n\r\n", pos) + 4
    return pos


def check_ok(case: Ok, got: Parsed) -> None:
    head = got.head
    assert head is not None
    assert (head.version, head.status, head.reason) == (case.version, case.status, case.reason)
    assert (head.chunked, head.length, head.keep_alive) == (
        case.chunked,
        case.length,
        case.head_keep_alive,
    )
    if case.headers is not None:
        assert tuple(head.headers) == case.headers
    assert got.body == case.body
    assert got.done_before_eof is not case.eof
    assert got.done
    assert got.trailing == case.trailing
    assert got.keep_alive is case.keep_alive


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("case", OK_CASES, ids=OK_IDS)
def test_valid(case, way):
    check_ok(case, run(WAYS[way](case.raw), no_body=case.no_body))


@FAST
@given(st.data())
def test_valid_random_splits(data):
    case = data.draw(st.sampled_from(OK_CASES))
    check_ok(case, run(draw_chunks(data.draw, case.raw), no_body=case.no_body))


@pytest.mark.parametrize("case", OK_CASES, ids=OK_IDS)
def test_valid_head_and_done_as_soon_as_their_last_byte_arrives(case):
    """Byte by byte: the head appears with its last byte, ``done`` with the message's
    last byte, and trailing bytes never count as body."""
    head_end = nth_head_end(case.raw, case.heads)
    end = len(case.raw) - len(case.trailing)
    parser = ResponseParser(no_body=case.no_body)
    for i, byte in enumerate(bytewise(case.raw), 1):
        pieces = parser.feed(byte)
        assert (parser.head is not None) is (i >= head_end), i
        assert parser.done is (not case.eof and i >= end), i
        if i <= head_end or i > end:
            assert pieces == []
    assert parser.feed_eof() == []
    assert parser.feed_eof() == []  # and again: nothing


def test_head_fields_and_get():
    parser = ResponseParser()
    assert (
        parser.head is None and not parser.done and not parser.keep_alive and parser.trailing == b""
    )
    assert parser.feed(
        b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nX-A: 1\r\nx-a: 2\r\n"
        b"Content-Length: 3\r\n\r\nno"
    ) == [b"no"]
    head = parser.head
    assert isinstance(head, ResponseHead)
    assert head.status == 404 and head.reason == "Not Found" and head.version == "1.1"
    assert head.get("content-type") == "text/plain"
    assert head.get("X-A") == "1"  # the first of the repeats
    assert head.get("missing") is None and head.get("missing", "d") == "d"
    assert head.length == 3 and not head.chunked
    assert "404" in repr(head)
    assert not parser.done
    assert parser.feed(b"!") == [b"!"]
    assert parser.done and parser.keep_alive


def test_header_values_round_trip_utf8_and_raw_bytes():
    raw_value = UTF8_VALUE.encode() + b" \xff\xfe\x80"  # not all valid UTF-8: surrogateescape
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nX-V: " + raw_value + b"\r\nContent-Length: 0\r\n\r\n")
    value = parser.head.get("x-v")
    assert value.startswith(UTF8_VALUE)
    assert value.encode("utf-8", "surrogateescape") == raw_value
    # and back out through request_head unchanged
    assert raw_value in request_head("GET", "/", "h", [("X-V", value)])


def test_utf8_value_split_inside_every_character():
    raw = b"HTTP/1.1 200 OK\r\nX-Name: " + UTF8_VALUE.encode() + b"\r\nContent-Length: 0\r\n\r\n"
    for cut in range(len(raw)):
        got = run([raw[:cut], raw[cut:]])
        assert got.head.get("X-Name") == UTF8_VALUE


def test_body_returned_by_the_feed_that_completes_the_head():
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n") == []
    assert parser.head is None
    assert parser.feed(b"\r\nhel") == [b"hel"]
    assert parser.head is not None
    assert parser.feed(b"lo") == [b"lo"]
    assert parser.feed(b"") == []
    assert parser.feed(b"world+more") == [b"world"]
    assert parser.done and parser.trailing == b"+more" and not parser.keep_alive


def test_trailing_accumulates_over_feeds():
    parser = ResponseParser()
    parser.feed(LENGTH5 + b"hello")
    assert parser.keep_alive
    assert parser.feed(b"a") == [] and parser.feed(b"bc") == [] and parser.feed(b"") == []
    assert parser.trailing == b"abc" and parser.done and not parser.keep_alive
    assert parser.feed_eof() == []


def test_close_delimited_keeps_relaying_until_eof():
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\n\r\n") == []
    assert parser.head.keep_alive is False
    for piece in (b"a", b"HTTP/1.1 200 OK\r\n", b"0\r\n\r\n"):
        assert parser.feed(piece) == [piece]
    assert not parser.done
    assert parser.feed_eof() == []
    assert parser.done and parser.trailing == b"" and not parser.keep_alive


# -- the hot path: one read, one chunk ----------------------------------------------------


def chunked_parser() -> ResponseParser:
    parser = ResponseParser()
    assert parser.feed(CHUNKED) == []
    return parser


@pytest.mark.parametrize("size_format", ["%x", "%X", "%02x", "%015X"])
def test_one_chunk_read_returns_exactly_its_data(size_format):
    parser = chunked_parser()
    for event in (b'data: {"t": "hello"}\n\n', b"x", b"\r\n", b"0\r\n\r\n", b"\r", b"e" * 300):
        assert parser.feed(chunk(event, size_format % len(event))) == [event]
    assert not parser.done
    assert parser.feed(b"0\r\n\r\n") == []
    assert parser.done and parser.keep_alive


def test_one_chunk_read_with_extension_returns_exactly_its_data():
    parser = chunked_parser()
    assert parser.feed(chunk(b"hello", ext=b";a=b")) == [b"hello"]
    assert parser.feed(chunk(b"world", ext=b" ;c")) == [b"world"]
    assert parser.feed(b"0\r\n\r\n") == []
    assert parser.done


def test_hot_path_shaped_reads_that_are_not_one_chunk():
    parser = chunked_parser()
    # one chunk and the start of the next
    assert parser.feed(chunk(b"hello") + b"3\r\nab") == [b"hello", b"ab"]
    assert parser.feed(b"c\r\n") == [b"c"]
    # the rest of a chunk then a whole one: the general path, because of the held state
    assert parser.feed(b"2\r\nx") == [b"x"]
    assert parser.feed(b"y\r\n" + chunk(b"zz")) == [b"y", b"zz"]
    # two whole chunks in one read
    assert parser.feed(chunk(b"1") + chunk(b"22")) == [b"1", b"22"]
    # a held partial size line, then a read that completes it with one chunk
    assert parser.feed(b"1") == []
    assert parser.feed(b"0\r\n" + b"s" * 16 + b"\r\n") == [b"s" * 16]
    # one chunk and the last chunk
    assert parser.feed(chunk(b"end") + b"0\r\n\r\n") == [b"end"]
    assert parser.done and parser.keep_alive


@pytest.mark.parametrize("bad_end", [b"\n\r", b"XX", b"\r\r", b"\n\n", b"!\r"])
def test_hot_path_shaped_read_with_bad_chunk_end_raises(bad_end):
    parser = chunked_parser()
    with pytest.raises(ProtocolError):
        parser.feed(b"5\r\nhello" + bad_end)


def test_content_length_reads_are_relayed_as_they_come():
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n") == []
    assert parser.feed(b"a") == [b"a"]
    assert parser.feed(b"") == []
    assert parser.feed(b"bcd") == [b"bcd"]
    assert parser.feed(b"ef") == [b"ef"]
    assert parser.done and parser.keep_alive


def test_hot_path_reads_skip_the_general_path(monkeypatch):
    """The reads the hot path is for are answered without the general path; the tests
    above and below check that both paths give the same answers."""
    parser = chunked_parser()
    other = ResponseParser()
    other.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")

    def general_path(self, data, out):
        raise AssertionError("general path taken")

    monkeypatch.setattr(ResponseParser, "_feed", general_path)
    assert parser.feed(chunk(b"data: {}\n\n")) == [b"data: {}\n\n"]
    assert parser.feed(chunk(b"x" * 0x1A3, "1A3")) == [b"x" * 0x1A3]
    assert other.feed(b"part") == [b"part"]
    with pytest.raises(AssertionError):
        parser.feed(chunk(b"ext", ext=b";a"))  # extensions are checked by the general path


chunk_data = st.binary(min_size=1, max_size=40)

EXTENSIONS = [b"", b"", b"", b";a", b';a=b;c="d;e"']
BWS_EXTENSIONS = [b" ;x", b"\t;y=1"]  # RFC 9112 allows BWS before ";"; h11 does not


@st.composite
def chunk_wire(draw, data: bytes, bws: bool = True) -> bytes:
    """One chunk as a server may write it: any hex case, leading zeros, extensions."""
    digits = draw(st.sampled_from(["%x", "%X"])) % len(data)
    if draw(st.booleans()):
        digits = "0" * draw(st.integers(1, 15 - len(digits))) + digits
    ext = draw(st.sampled_from(EXTENSIONS + BWS_EXTENSIONS if bws else EXTENSIONS))
    return digits.encode() + ext + b"\r\n" + data + b"\r\n"


@FAST
@given(st.lists(chunk_data, max_size=10), st.data())
def test_per_chunk_reads_agree_with_bytewise_and_whole(events, data):
    wires = [data.draw(chunk_wire(event)) for event in events]
    last = b"0\r\n" + data.draw(st.sampled_from([b"", b"T: 1\r\n"])) + b"\r\n"
    raw = CHUNKED + b"".join(wires) + last

    parser = chunked_parser()
    for event, wire in zip(events, wires, strict=True):
        assert parser.feed(wire) == [event]  # the hot path's promise
    assert parser.feed(last) == []
    assert parser.done and parser.keep_alive

    body = b"".join(events)
    for chunks in ([raw], bytewise(raw), draw_chunks(data.draw, raw)):
        got = run(chunks)
        assert got.body == body and got.done_before_eof and got.keep_alive and got.head.chunked


# -- generated valid responses: a model, byte-by-byte promptness, h11 ---------------------

token = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!#$%&'*+^`|~",
    min_size=1,
    max_size=12,
)
FRAMING_NAMES = {"content-length", "transfer-encoding", "connection"}
field_name = token.filter(lambda n: n.lower() not in FRAMING_NAMES)
value_char = st.characters(min_codepoint=0x21, max_codepoint=0x7E) | st.sampled_from("éü日本🚀")
field_value = st.lists(st.text(value_char, min_size=1, max_size=8), max_size=3).map(" ".join)
reason_text = st.lists(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=8),
    max_size=3,
).map(" ".join)


@dataclass
class Msg:
    segments: list[tuple[bytes, str]]  # (bytes, kind) kind: "head" | "body" | "frame"
    no_body: bool
    version: str
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool
    eof: bool
    chunked: bool
    length: int | None

    @property
    def raw(self) -> bytes:
        return b"".join(b for b, _ in self.segments)


@st.composite
def messages(draw, bws: bool = True) -> Msg:
    version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
    status = draw(st.sampled_from([200, 200, 201, 204, 304, 404, 429, 500, 503]))
    reason = draw(reason_text)
    no_body = draw(st.booleans()) and draw(st.booleans())
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    close = draw(st.booleans())
    events = draw(st.lists(chunk_data, max_size=6))
    headers = draw(st.lists(st.tuples(field_name, field_value), max_size=4))
    framing_headers = [("Connection", "close")] if close else []
    if framing == "length":
        framing_headers.append(("Content-Length", str(sum(map(len, events)))))
    elif framing == "chunked":
        framing_headers.append(("Transfer-Encoding", "chunked"))
    for item in framing_headers:
        headers.insert(draw(st.integers(0, len(headers))), item)
    has_body = not no_body and status not in (204, 304)

    segments = []
    for interim in draw(
        st.lists(
            st.sampled_from(
                [
                    b"HTTP/1.1 100 Continue\r\n\r\n",
                    b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n",
                ]
            ),
            max_size=2,
        )
    ):
        segments.append((interim, "head"))
    head = (
        f"HTTP/{version} {status} {reason}\r\n"
        + "".join(f"{n}: {v}\r\n" for n, v in headers)
        + "\r\n"
    )
    segments.append((head.encode(), "head"))
    if has_body:
        for event in events:
            if framing == "chunked":
                wire = draw(chunk_wire(event, bws))
                size_line = wire[: wire.index(b"\r\n") + 2]
                segments += [(size_line, "frame"), (event, "body"), (b"\r\n", "frame")]
            else:
                segments.append((event, "body"))
        if framing == "chunked":
            trailer = draw(st.lists(st.tuples(field_name, field_value), max_size=2))
            segments.append(
                (
                    b"0\r\n" + "".join(f"{n}: {v}\r\n" for n, v in trailer).encode() + b"\r\n",
                    "frame",
                )
            )
    eof = has_body and framing == "close"
    return Msg(
        segments,
        no_body,
        version,
        status,
        reason,
        headers,
        body=b"".join(events) if has_body else b"",
        keep_alive=version == "1.1" and not close and not eof,
        eof=eof,
        chunked=has_body and framing == "chunked",
        length=sum(map(len, events)) if has_body and framing == "length" else None,
    )


def check_msg(msg: Msg, got: Parsed) -> None:
    head = got.head
    assert (head.version, head.status, head.reason, head.headers) == (
        msg.version,
        msg.status,
        msg.reason,
        msg.headers,
    )
    assert (head.chunked, head.length) == (msg.chunked, msg.length)
    assert got.body == msg.body
    assert got.done_before_eof is not msg.eof
    assert got.keep_alive is msg.keep_alive
    assert got.trailing == b""


@SLOW
@given(messages(), st.data())
def test_generated_whole_bytewise_and_random_splits(msg, data):
    raw = msg.raw
    for chunks in ([raw], bytewise(raw), draw_chunks(data.draw, raw)):
        check_msg(msg, run(chunks, no_body=msg.no_body))
    extra = data.draw(st.binary(min_size=1, max_size=20))
    if not msg.eof:
        got = run(draw_chunks(data.draw, raw + extra), no_body=msg.no_body)
        assert got.body == msg.body and got.trailing == extra and not got.keep_alive


@SLOW
@given(messages())
def test_generated_body_bytes_are_never_held_back(msg):
    """Fed byte by byte, every body byte comes out of the very feed that brought it, the
    head appears with its last byte and ``done`` with the message's last byte."""
    head_end = 0
    offset = 0
    kinds = []
    for segment, kind in msg.segments:
        kinds += [kind] * len(segment)
        offset += len(segment)
        if kind == "head":
            head_end = offset
    parser = ResponseParser(no_body=msg.no_body)
    for i, (byte, kind) in enumerate(zip(bytewise(msg.raw), kinds, strict=True), 1):
        assert parser.feed(byte) == ([byte] if kind == "body" else [])
        assert (parser.head is not None) is (i >= head_end)
        assert parser.done is (not msg.eof and i == len(kinds))
    assert parser.feed_eof() == []
    assert parser.done


h11_settings = settings(max_examples=150, deadline=None)


@needs_h11
@h11_settings
@given(messages(bws=False), st.data())
def test_agrees_with_h11(msg, data):
    conn = h11.Connection(h11.CLIENT)
    conn.send(
        h11.Request(method="HEAD" if msg.no_body else "GET", target="/", headers=[("Host", "u")])
    )
    conn.send(h11.EndOfMessage())
    chunks = draw_chunks(data.draw, msg.raw)
    for piece in chunks:
        if piece:
            conn.receive_data(piece)
    if msg.eof:
        conn.receive_data(b"")
    final, body, ended = None, b"", False
    while not ended:
        event = conn.next_event()
        if isinstance(event, h11.Response):
            final = event
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            ended = True
        else:
            assert isinstance(event, h11.InformationalResponse), event
    got = run(chunks, no_body=msg.no_body)
    assert final is not None
    head = got.head
    assert head.status == final.status_code
    assert head.reason.encode("latin-1") == final.reason
    assert head.version.encode() == final.http_version
    assert [(n.encode(), v.encode("utf-8", "surrogateescape")) for n, v in head.headers] == list(
        final.headers.raw_items()
    )
    assert got.body == body
    if not msg.eof:  # a close-delimited body ends the connection: h11 then says DONE, moot
        assert got.keep_alive is (conn.their_state is h11.DONE)


# -- bad peer input: ProtocolError, and nothing else -------------------------------------

# (id, raw, when) - "feed": some feed raises, before any EOF; "eof": only feed_eof() can tell.
ERRORS = [
    # line ends
    ("lf_only_head", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", "feed"),
    ("lf_only_status_line", b"HTTP/1.1 200 OK\n", "feed"),
    ("lf_header_line", b"HTTP/1.1 200 OK\r\nA: b\nC: d\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("lf_head_end", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n", "feed"),
    ("lf_head_end_after_crlf", b"HTTP/1.1 200 OK\r\nContent-Length: 0\n\r\n", "feed"),
    ("cr_only_header_line", b"HTTP/1.1 200 OK\r\nA: b\rC: d\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("lf_size_line", CHUNKED + b"5\nhello\r\n0\r\n\r\n", "feed"),
    ("lf_last_chunk", CHUNKED + b"0\n\n", "feed"),
    ("lf_after_last_chunk", CHUNKED + b"0\r\n\n", "feed"),
    ("lf_after_chunk_data", CHUNKED + b"5\r\nhello\n0\r\n\r\n", "feed"),
    ("lf_in_chunk_ext", CHUNKED + b"5;a\nb\r\nhello\r\n0\r\n\r\n", "feed"),
    ("cr_in_chunk_ext", CHUNKED + b"5;a\rb\r\nhello\r\n0\r\n\r\n", "feed"),
    ("lf_trailer_line", CHUNKED + b"0\r\nX: y\n\r\n", "feed"),
    ("cr_trailer_line", CHUNKED + b"0\r\nX: y\rZ: 1\r\n\r\n", "feed"),
    # status line
    ("empty_status_line", b"\r\nHTTP/1.1 200 OK\r\n\r\n", "feed"),
    ("leading_space", b" HTTP/1.1 200 OK\r\n\r\n", "feed"),
    ("no_status_code", b"HTTP/1.1 OK\r\n\r\n", "feed"),
    ("two_digit_status", b"HTTP/1.1 20 OK\r\n\r\n", "feed"),
    ("four_digit_status", b"HTTP/1.1 2000 OK\r\n\r\n", "feed"),
    ("letters_status", b"HTTP/1.1 abc OK\r\n\r\n", "feed"),
    ("signed_status", b"HTTP/1.1 +20 OK\r\n\r\n", "feed"),
    ("negative_status", b"HTTP/1.1 -20 OK\r\n\r\n", "feed"),
    ("status_000", b"HTTP/1.1 000 Zero\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("status_099", b"HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n", "feed"),
    # RFC 9110 has five classes: 600-999 is no response (nor a ``code`` label value)
    ("status_600", b"HTTP/1.1 600 Six\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("status_799", b"HTTP/1.1 799 Custom\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("status_999", b"HTTP/1.1 999 High\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("unicode_digit_status", "HTTP/1.1 ２00 OK\r\n\r\n".encode(), "feed"),
    ("double_space", b"HTTP/1.1  200 OK\r\n\r\n", "feed"),
    ("tab_separator", b"HTTP/1.1\t200 OK\r\n\r\n", "feed"),
    ("tab_before_reason", b"HTTP/1.1 200\tOK\r\n\r\n", "feed"),
    ("lowercase_http", b"http/1.1 200 OK\r\n\r\n", "feed"),
    ("http_1_2", b"HTTP/1.2 200 OK\r\n\r\n", "feed"),
    ("http_1_10", b"HTTP/1.10 200 OK\r\n\r\n", "feed"),
    ("http_2_0", b"HTTP/2.0 200 OK\r\n\r\n", "feed"),
    ("http_2", b"HTTP/2 200 OK\r\n\r\n", "feed"),
    ("http_0_9_ish", b"HTTP/0.9 200 OK\r\n\r\n", "feed"),
    ("icy", b"ICY 200 OK\r\n\r\n", "feed"),
    ("nul_in_reason", b"HTTP/1.1 200 O\x00K\r\n\r\n", "feed"),
    ("cr_in_reason", b"HTTP/1.1 200 O\rK\r\n\r\n", "feed"),
    ("request_not_response", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "feed"),
    (
        "switching_protocols",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        "feed",
    ),
    (
        "switching_protocols_after_100",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\n\r\n",
        "feed",
    ),
    # header fields
    ("space_before_colon", b"HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n", "feed"),
    ("tab_before_colon", b"HTTP/1.1 200 OK\r\nX\t: 0\r\n\r\n", "feed"),
    ("space_in_name", b"HTTP/1.1 200 OK\r\nContent Length: 0\r\n\r\n", "feed"),
    ("paren_in_name", b"HTTP/1.1 200 OK\r\nBad(name): x\r\n\r\n", "feed"),
    ("slash_in_name", b"HTTP/1.1 200 OK\r\nBad/name: x\r\n\r\n", "feed"),
    ("utf8_name", "HTTP/1.1 200 OK\r\nNaïve: x\r\n\r\n".encode(), "feed"),
    ("nul_in_name", b"HTTP/1.1 200 OK\r\nX\x00: x\r\n\r\n", "feed"),
    ("empty_name", b"HTTP/1.1 200 OK\r\n: x\r\n\r\n", "feed"),
    ("no_colon", b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "feed"),
    ("obs_fold_space", b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("obs_fold_tab", b"HTTP/1.1 200 OK\r\nX: a\r\n\tb\r\nContent-Length: 0\r\n\r\n", "feed"),
    (
        "obs_fold_with_colon",
        b"HTTP/1.1 200 OK\r\nX: a\r\n b: c\r\nContent-Length: 0\r\n\r\n",
        "feed",
    ),
    ("fold_first_line", b"HTTP/1.1 200 OK\r\n X: a\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("nul_in_value", b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n", "feed"),
    ("cr_in_value", b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n", "feed"),
    # framing
    (
        "te_and_cl",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        "feed",
    ),
    (
        "cl_and_te",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        "feed",
    ),
    (
        "te_and_cl_zero",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n0\r\n\r\n",
        "feed",
    ),
    ("gzip_chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "feed"),
    (
        "gzip_then_chunked_headers",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
        "feed",
    ),
    ("chunked_gzip", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "feed"),
    ("chunked_twice", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "feed"),
    ("te_identity", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n", "feed"),
    ("te_empty", b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n", "feed"),
    ("te_chunked_param", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", "feed"),
    ("te_xchunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n", "feed"),
    ("cl_negative", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "feed"),
    ("cl_plus", b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", "feed"),
    ("cl_conflicting_list", b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!", "feed"),
    (
        "cl_conflicting_headers",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        "feed",
    ),
    (
        "cl_same_number_spelled_differently",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 05\r\n\r\nhello",
        "feed",
    ),
    ("cl_empty_list_member", b"HTTP/1.1 200 OK\r\nContent-Length: 5,\r\n\r\nhello", "feed"),
    ("cl_letters", b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", "feed"),
    ("cl_hex", b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\nhello", "feed"),
    ("cl_exponent", b"HTTP/1.1 200 OK\r\nContent-Length: 1e1\r\n\r\n", "feed"),
    ("cl_inner_space", b"HTTP/1.1 200 OK\r\nContent-Length: 1 0\r\n\r\n", "feed"),
    ("cl_underscore", b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n", "feed"),
    ("cl_empty", b"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n", "feed"),
    ("cl_fullwidth_digit", "HTTP/1.1 200 OK\r\nContent-Length: ５\r\n\r\nhello".encode(), "feed"),
    ("cl_arabic_indic_digit", "HTTP/1.1 200 OK\r\nContent-Length: ٥\r\n\r\nhello".encode(), "feed"),
    ("cl_superscript_digit", "HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\nhi".encode(), "feed"),
    ("chunk_size_0x", CHUNKED + b"0x5\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_negative", CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_plus", CHUNKED + b"+5\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_empty", CHUNKED + b"\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_only_ext", CHUNKED + b";a=b\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_leading_space", CHUNKED + b" 5\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_inner_space", CHUNKED + b"5 5\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_not_hex", CHUNKED + b"g\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_underscore", CHUNKED + b"1_0\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_unicode_digit", CHUNKED + "５\r\nhello\r\n0\r\n\r\n".encode(), "feed"),
    ("chunk_size_16_hex_digits", CHUNKED + b"0000000000000005\r\nhello\r\n0\r\n\r\n", "feed"),
    ("chunk_size_huge", CHUNKED + b"ffffffffffffffffffff\r\nhello", "feed"),
    ("chunk_data_too_long", CHUNKED + b"5\r\nhello!\r\n0\r\n\r\n", "feed"),
    ("chunk_data_too_short", CHUNKED + b"5\r\nhell\r\n0\r\n\r\n", "feed"),
    ("chunk_data_no_crlf", CHUNKED + b"5\r\nhello0\r\n\r\n", "feed"),
    ("chunk_data_then_cr_x", CHUNKED + b"5\r\nhello\rX", "feed"),
    ("size_line_too_long", CHUNKED + b"5;" + b"a" * 5000 + b"\r\nhello\r\n0\r\n\r\n", "feed"),
    ("size_line_endless", CHUNKED + b"5;" + b"a" * 5000, "feed"),
    # cut short
    ("eof_nothing", b"", "eof"),
    ("eof_mid_status_line", b"HTTP/1.1 20", "eof"),
    ("eof_mid_head", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", "eof"),
    ("eof_mid_head_end", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r", "eof"),
    ("eof_after_interim", b"HTTP/1.1 100 Continue\r\n\r\n", "eof"),
    ("eof_length_no_body", LENGTH5, "eof"),
    ("eof_length_mid_body", LENGTH5 + b"hell", "eof"),
    ("eof_chunked_no_body", CHUNKED, "eof"),
    ("eof_chunked_mid_size_line", CHUNKED + b"1", "eof"),
    ("eof_chunked_mid_ext", CHUNKED + b"5;a=", "eof"),
    ("eof_chunked_mid_data", CHUNKED + b"5\r\nhel", "eof"),
    ("eof_chunked_after_data", CHUNKED + b"5\r\nhello", "eof"),
    ("eof_chunked_after_data_cr", CHUNKED + b"5\r\nhello\r", "eof"),
    ("eof_chunked_between_chunks", CHUNKED + b"5\r\nhello\r\n", "eof"),
    ("eof_chunked_after_last_chunk", CHUNKED + b"0\r\n", "eof"),
    ("eof_chunked_mid_trailer", CHUNKED + b"0\r\nX: y\r\n", "eof"),
    ("eof_chunked_mid_final_crlf", CHUNKED + b"0\r\n\r", "eof"),
]
ERROR_IDS = [e[0] for e in ERRORS]


def expect_error(chunks, when: str, **kw) -> None:
    parser = ResponseParser(**kw)
    if when == "feed":
        with pytest.raises(ProtocolError):
            for piece in chunks:
                parser.feed(piece)
    else:
        for piece in chunks:
            parser.feed(piece)
        assert not parser.done
        with pytest.raises(ProtocolError):
            parser.feed_eof()


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name,raw,when", ERRORS, ids=ERROR_IDS)
def test_error(name, raw, when, way):
    expect_error(WAYS[way](raw), when)


@FAST
@given(st.data())
def test_error_random_splits(data):
    name, raw, when = data.draw(st.sampled_from(ERRORS))
    expect_error(draw_chunks(data.draw, raw), when)


def test_head_request_responses_are_still_validated():
    # A HEAD response has no body whatever its headers say; its head must still be valid.
    for raw in (
        b"HTTP/1.1 200 OK\nContent-Length: 5\n\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
    ):
        expect_error([raw], "feed", no_body=True)


# -- bounds -------------------------------------------------------------------------------

MAX_HEAD = 128


def head_of_size(n: int, status: bytes = b"200 OK") -> bytes:
    """A head whose bytes before the final CRLFCRLF number exactly ``n``."""
    start = b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nX-Pad: "
    assert n >= len(start)
    return start + b"p" * (n - len(start)) + b"\r\n\r\n"


@pytest.mark.parametrize("way", WAYS)
def test_head_at_the_bound_parses_at_any_split(way):
    raw = head_of_size(MAX_HEAD)
    got = run(WAYS[way](raw), max_head_bytes=MAX_HEAD)
    assert got.done and got.head.get("x-pad").startswith("p")
    for cut in range(len(raw)):
        assert run([raw[:cut], raw[cut:]], max_head_bytes=MAX_HEAD).done


@pytest.mark.parametrize("way", WAYS)
def test_head_over_the_bound_raises(way):
    expect_error(WAYS[way](head_of_size(MAX_HEAD + 1)), "feed", max_head_bytes=MAX_HEAD)


@pytest.mark.parametrize("way", WAYS)
def test_endless_head_raises_before_eof(way):
    raw = b"HTTP/1.1 200 OK\r\nX: " + b"y" * (3 * MAX_HEAD)
    expect_error(WAYS[way](raw), "feed", max_head_bytes=MAX_HEAD)


def test_endless_head_memory_bounded():
    parser = ResponseParser(max_head_bytes=MAX_HEAD)
    parser.feed(b"HTTP/1.1 200 OK\r\n")
    fed = 0
    with pytest.raises(ProtocolError):
        for n in range(1, 1000):
            fed = n
            parser.feed(b"X-Header: value\r\n")
            assert len(parser._buf) <= MAX_HEAD + 3
    assert fed <= MAX_HEAD // 17 + 1


def test_bound_is_per_head_interim_heads_do_not_add_up():
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: " + b"l" * (MAX_HEAD - 40) + b"\r\n\r\n"
    raw = interim * 5 + head_of_size(MAX_HEAD)
    for chunks in ([raw], bytewise(raw)):
        assert run(chunks, max_head_bytes=MAX_HEAD).done


def test_default_head_bound_is_64_kib():
    assert run([head_of_size(64 << 10)]).done
    expect_error([head_of_size((64 << 10) + 1)], "feed")


SIZE_LINE = 4096  # chunk-size line bound, its CRLF included


def size_line(total: int) -> bytes:
    """A chunk-size line for 5 bytes of data, ``total`` bytes long with its CRLF."""
    return b"5;" + b"e" * (total - 4) + b"\r\n"


@pytest.mark.parametrize("way", WAYS)
def test_size_line_at_the_bound(way):
    raw = CHUNKED + size_line(SIZE_LINE) + b"hello\r\n0\r\n\r\n"
    assert run(WAYS[way](raw)).body == b"hello"


@pytest.mark.parametrize("way", WAYS)
def test_size_line_over_the_bound(way):
    expect_error(WAYS[way](CHUNKED + size_line(SIZE_LINE + 1) + b"hello\r\n0\r\n\r\n"), "feed")


@FAST
@given(st.integers(SIZE_LINE - 3, SIZE_LINE + 3), st.data())
def test_size_line_bound_does_not_depend_on_splits(total, data):
    raw = CHUNKED + size_line(total) + b"hello\r\n0\r\n\r\n"
    assert outcome(draw_chunks(data.draw, raw)) == outcome([raw])


@pytest.mark.parametrize("way", WAYS)
def test_trailer_line_at_and_over_the_bound(way):
    line = b"T: " + b"t" * (MAX_HEAD - 3)
    assert len(line) == MAX_HEAD
    ok = CHUNKED + b"1\r\nx\r\n0\r\n" + line + b"\r\n\r\n"
    assert run(WAYS[way](ok), max_head_bytes=MAX_HEAD).body == b"x"
    expect_error(
        WAYS[way](CHUNKED + b"0\r\n" + line + b"t\r\n\r\n"), "feed", max_head_bytes=MAX_HEAD
    )
    expect_error(WAYS[way](CHUNKED + b"0\r\n" + line * 3), "feed", max_head_bytes=MAX_HEAD)


@FAST
@given(st.integers(MAX_HEAD - 5, MAX_HEAD + 5), st.integers(MAX_HEAD - 5, MAX_HEAD + 5), st.data())
def test_head_and_trailer_bounds_do_not_depend_on_splits(head_size, trailer_size, data):
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Pad: "
    raw += b"p" * (head_size - len(raw)) + b"\r\n\r\n"
    raw += b"1\r\nx\r\n0\r\nT: " + b"t" * (trailer_size - 3) + b"\r\n\r\n"
    expected = outcome([raw], max_head_bytes=MAX_HEAD)
    assert outcome(draw_chunks(data.draw, raw), max_head_bytes=MAX_HEAD) == expected
    assert outcome(bytewise(raw), max_head_bytes=MAX_HEAD) == expected
    assert (expected[0] == "error") is (head_size > MAX_HEAD or trailer_size > MAX_HEAD)


# -- fuzz: ProtocolError or a parse, the same at any split --------------------------------

# Fragments that make the fuzzer reach real structure: heads, framing, chunks, line ends.
FRAGMENTS = [
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.0 204 X\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 101 S\r\n",
    b"Content-Length: 3\r\n",
    b"Content-Length: 0\r\n",
    b"Content-Length: 3, 3\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Connection: close\r\n",
    b"X: y\r\n",
    b" fold\r\n",
    b"\r\n",
    b"\r",
    b"\n",
    b"\r\n\r\n",
    b"0\r\n",
    b"3\r\n",
    b"a;e=1\r\n",
    b"abc",
    b"x" * 9,
    b";",
    b" ",
    b"\x00",
    b"\xff",
    b"5",
    b"F",
    b":",
]


@FAST
@given(st.binary(max_size=200), st.booleans(), st.data())
def test_fuzz_any_bytes(raw, no_body, data):
    expected = outcome([raw], no_body=no_body)  # only ProtocolError may escape
    assert outcome(draw_chunks(data.draw, raw), no_body=no_body) == expected


@FAST
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=30), st.booleans(), st.data())
def test_fuzz_structured_split_invariance(fragments, no_body, data):
    raw = b"".join(fragments)
    max_head = data.draw(st.sampled_from([24, 64, 64 << 10]))
    expected = outcome([raw], no_body=no_body, max_head_bytes=max_head)
    assert (
        outcome(draw_chunks(data.draw, raw), no_body=no_body, max_head_bytes=max_head) == expected
    )
    assert outcome(bytewise(raw), no_body=no_body, max_head_bytes=max_head) == expected


@SLOW
@given(messages(), st.data())
def test_fuzz_mutated_valid_responses(msg, data):
    raw = bytearray(msg.raw)
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        at = data.draw(st.integers(0, len(raw)))
        if op == "insert":
            raw[at:at] = data.draw(
                st.sampled_from([b"\r", b"\n", b"\r\n", b" ", b"\x00", b";", b"0", b"a"])
            )
        elif raw and at < len(raw):
            if op == "flip":
                raw[at] = data.draw(st.integers(0, 255))
            else:
                del raw[at]
    raw = bytes(raw)
    expected = outcome([raw], no_body=msg.no_body)
    assert outcome(draw_chunks(data.draw, raw), no_body=msg.no_body) == expected
    assert outcome(bytewise(raw), no_body=msg.no_body) == expected


# -- request_head ---------------------------------------------------------------------------


def test_request_head_exact_bytes():
    assert request_head("GET", "/v1/models", "upstream:8000", []) == (
        b"GET /v1/models HTTP/1.1\r\nHost: upstream:8000\r\n\r\n"
    )


def test_request_head_host_first_order_and_repeats_kept():
    headers = [
        ("Content-Type", "application/json"),
        ("X-A", "1"),
        ("accept", "*/*"),
        ("x-a", "2"),
        ("X-Empty", ""),
    ]
    assert request_head("POST", "/v1/chat/completions?x=1", "[::1]:8080", headers) == (
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n"
        b"Host: [::1]:8080\r\n"
        b"Content-Type: application/json\r\nX-A: 1\r\naccept: */*\r\nx-a: 2\r\nX-Empty: \r\n\r\n"
    )


def test_request_head_accepts_any_iterable():
    assert (
        request_head("GET", "/", "h", iter([("A", "b")]))
        == b"GET / HTTP/1.1\r\nHost: h\r\nA: b\r\n\r\n"
    )


def test_request_head_encodes_utf8_and_raw_bytes():
    raw = b"\xff\xfe"
    value = UTF8_VALUE + raw.decode("utf-8", "surrogateescape")
    assert request_head("GET", "/", "h", [("X", value)]).endswith(
        b"X: " + UTF8_VALUE.encode() + raw + b"\r\n\r\n"
    )


@pytest.mark.parametrize(
    "name,value",
    [
        ("X", "a\r\nEvil: 1"),
        ("X", "a\rb"),
        ("X", "a\nb"),
        ("X", "\r\n"),
        ("X\r\nEvil", "1"),
        ("X\n", "1"),
        ("X\r", "1"),
        ("X:Y", "1"),
        (":", "1"),
    ],
)
def test_request_head_refuses_line_breaks_and_colons_in_fields(name, value):
    with pytest.raises(ValueError):
        request_head("GET", "/", "h", [("Ok", "fine"), (name, value)])


@needs_h11
@SLOW
@given(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS"]),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789/-_.~%?=&", min_size=0, max_size=30).map(
        lambda t: "/" + t
    ),
    st.lists(
        st.tuples(
            field_name.filter(lambda n: n.lower() != "host"),
            st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=10),
        ),
        max_size=6,
    ),
)
def test_request_head_agrees_with_h11(method, target, headers):
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(request_head(method, target, "upstream:8000", headers))
    request = conn.next_event()
    assert isinstance(request, h11.Request)
    assert (request.method, request.target, request.http_version) == (
        method.encode(),
        target.encode(),
        b"1.1",
    )
    assert list(request.headers.raw_items()) == [(b"Host", b"upstream:8000")] + [
        (n.encode(), v.encode()) for n, v in headers
    ]


def test_protocol_error_carries_the_body_decoded_before_the_fault():
    """The relay passes on every valid byte before it cuts a broken stream."""
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"4\r\ngood\r\n3\r\nok!\r\nzz\r\nbad\r\n")
    assert info.value.pieces == [b"good", b"ok!"]


@pytest.mark.parametrize(
    "read, piece",
    [
        (b"5\r\nhello\r\n", b"hello"),
        (b"0005\r\nhello\r\n", b"hello"),  # leading zeros: still one well-formed chunk
        (b"A\r\n0123456789\r\n", b"0123456789"),
        (b"5;ext=1\r\nhello\r\n", None),  # an extension: only the general path knows them
        (b"5\r\nhello\r\n3\r\nabc\r\n", None),  # two chunks
        (b"5\r\nhel", None),  # part of one
        (b"0\r\n\r\n", None),  # the last chunk ends the body: not a piece
        (b"5\r\nhelloXY", None),  # bad chunk end: for feed() to refuse
        (b"+5\r\nhello\r\n", None),
        (b"1_0\r\n0123456789abcdef\r\n", None),  # int() would accept the underscore
    ],
)
def test_between_chunks_one_whole_chunk_is_exactly_that_chunk(read, piece):
    """Between chunks, ``chunk_payload(read)`` is the payload of a read that is one whole
    chunk (what the upstream connection asks of every read), and the parser is untouched."""
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert parser.between_chunks
    assert chunk_payload(read) == piece
    if piece is not None:
        general = ResponseParser()
        general.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert general.feed(read) == [piece] and general.between_chunks
    # Either way the parser's state is unchanged: feeding a chunk afterwards works.
    assert parser.feed(b"3\r\nabc\r\n") == [b"abc"]
    assert parser.between_chunks and chunk_payload(b"3\r\nabc\r\n") == b"abc"


def test_not_between_chunks_outside_chunked_bodies():
    parser = ResponseParser()
    assert not parser.between_chunks  # still in the head
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n")
    assert not parser.between_chunks
    assert parser.feed(b"5\r\nhello\r\n") == [b"5\r\nhello\r\n"]


@FAST
@given(st.data())
def test_between_chunks_is_the_parsers_state_after_any_feed(data):
    """The attribute is kept as the state moves: after every feed, at any split of any
    response, it says what the state does (between two chunks, nothing partial held)."""
    body = b"".join(
        b"%x\r\n%b\r\n" % (len(p), p)
        for p in data.draw(st.lists(st.binary(min_size=1, max_size=9), max_size=4))
    )
    raw = data.draw(
        st.sampled_from(
            [
                CHUNKED + body + b"0\r\n\r\n",
                CHUNKED + body + b"0\r\nT: 1\r\n\r\n",
                CHUNKED + body + b"1;e=1\r\nx\r\n0\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
                CHUNKED + body + b"zz\r\n",
            ]
        )
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    parser = ResponseParser()
    for start, stop in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        try:
            parser.feed(raw[start:stop])
        except ProtocolError:
            break
        finally:
            assert parser.between_chunks is (parser._state == _SIZE and not parser._buf)
        if parser.between_chunks:
            found = parser.whole_chunks(raw[stop:])
            assert found is None or parser.done or parser.between_chunks
            break


@pytest.mark.parametrize(
    "read, pieces",
    [
        (b"5\r\nhello\r\n", [b"hello"]),
        (b"5\r\nhello\r\n3\r\nabc\r\n", [b"hello", b"abc"]),
        (b"5\r\nhello\r\nA\r\n0123456789\r\n1\r\nx\r\n", [b"hello", b"0123456789", b"x"]),
        (b"5\r\nhello\r\n3\r\nab", None),  # part of the second
        (b"5\r\nhello\r\n3;e\r\nabc\r\n", None),  # an extension in the second
        (b"5\r\nhello\r\n3\r\nabcXY", None),  # bad end of the second
        (b"5\r\nhello\r\n1_0\r\n0123456789abcdef\r\n", None),
        (b"5\r\nhello\r\n\r\n", None),  # an empty size line
        (b"", None),
    ],
)
def test_whole_chunks_answers_only_for_whole_well_formed_chunks_back_to_back(read, pieces):
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert parser.whole_chunks(read) == pieces
    if pieces is not None:
        # The same pieces the general path gives for that read, and the state is unchanged.
        general = ResponseParser()
        general.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert general.feed(read) == pieces
    assert parser.feed(b"3\r\nabc\r\n") == [b"abc"]
    assert parser.whole_chunks(b"3\r\nabc\r\n3\r\ndef\r\n") == [b"abc", b"def"]


@pytest.mark.parametrize(
    "read, pieces",
    [
        (b"5\r\nhello\r\n0\r\n\r\n", [b"hello"]),
        (b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n", [b"hello", b"abc"]),
        (b"0\r\n\r\n", []),  # the last chunk alone
        (b"5\r\nhello\r\n000\r\n\r\n", [b"hello"]),  # leading zeros: still the last chunk
        (b"5\r\nhello\r\n0\r\n\r\nX", None),  # bytes after the body: feed() keeps them
        (b"5\r\nhello\r\n0\r\nT: 1\r\n\r\n", None),  # a trailer: only feed() reads them
        (b"5\r\nhello\r\n0;e\r\n\r\n", None),  # an extension on the last chunk
        (b"5\r\nhello\r\n0\r\n\r", None),  # part of the end
        (b"5\r\nhello\r\n0\r\n", None),
        (b"0\r\n\n", None),  # a bare LF: feed() refuses it
    ],
)
def test_whole_chunks_ending_with_the_last_chunk_end_the_body_as_feed_does(read, pieces):
    """A read that ends the body exactly is answered without the general path, and leaves
    the parser as the general path does (done, nothing trailing, keep-alive); any other
    ending is the general path's."""
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert parser.whole_chunks(read) == pieces
    general = ResponseParser()
    general.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    if pieces is None:
        assert not parser.done and parser.between_chunks  # nothing happened
        return
    assert general.feed(read) == pieces
    assert parser.done and general.done
    assert parser.keep_alive and general.keep_alive
    assert parser.trailing == general.trailing == b""
    assert parser.feed(b"late") == [] and parser.trailing == b"late"  # past the end, as feed's


def test_whole_chunks_is_none_mid_chunk_and_outside_chunked_bodies():
    parser = ResponseParser()
    assert parser.whole_chunks(b"5\r\nhello\r\n") is None  # still in the head
    parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
    assert parser.whole_chunks(b"3\r\nabc\r\n") is None  # inside a chunk
    assert parser.feed(b"lo\r\n3\r\nabc\r\n") == [b"lo", b"abc"]


# -- a head's fields: one pattern for a valid block, the line-by-line checks for any other --

_NAMES = ["Content-Type", "x-a", "K", "a-b.c~d"]
_VALUE_PARTS = [
    "", " ", "\t", "  ", "v a l", "chunked", ",", ":", "\u212a", "\u0130", "\u03a3", "caf\udce9",
    "=",
]  # fmt: skip
_FAULTS = ["\0", "\r", "\n", " ", "\t", "\u212a", "\u0130", "(", ""]


@st.composite
def field_blocks(draw) -> str:
    """Valid field lines (blanks anywhere in the values, characters whose lower case is
    ASCII or longer), and often one fault put anywhere in one of them: NUL, a bare CR or
    LF, a blank or non-token character (in a name: invalid; in a value: kept), or the
    line's colon taken out."""
    lines = [
        draw(st.sampled_from(_NAMES))
        + ":"
        + "".join(draw(st.lists(st.sampled_from(_VALUE_PARTS), max_size=5)))
        for _ in range(draw(st.integers(1, 5)))
    ]
    if draw(st.booleans()):
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        fault = draw(st.sampled_from(_FAULTS))
        if fault:
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + fault + line[at:]
        else:
            lines[i] = line.replace(":", "", 1)
    return "\r\n".join(lines)


@settings(max_examples=800, deadline=None)
@given(field_blocks())
def test_fields_pattern_agrees_with_the_line_by_line_checks(text):
    """Any block (valid or not, blanks anywhere, characters whose lower case is ASCII or
    longer): the fields and lowered names of the line-by-line checks, or their error."""
    block = text.encode("utf-8", "surrogateescape")
    try:
        expected = http1._checked_fields(block.decode("utf-8", "surrogateescape"))
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as got:
            http1._fields(block)
        assert str(got.value) == str(exc)
    else:
        assert http1._fields(block) == expected


def test_fields_pattern_is_linear_on_long_runs_of_blanks():
    """No backtracking on a field with long runs of blanks, valid or not: a 60 KiB block
    reads in well under a second (a backtracking pattern takes minutes)."""
    import time

    for block in (b"x: a" + b" " * 60_000 + b"b", b"x: a" + b" \t" * 30_000 + b"\0"):
        start = time.perf_counter()
        try:
            http1._fields(block)
        except ProtocolError:
            pass
        assert time.perf_counter() - start < 0.5
