"""The sans-I/O NDJSON line splitter: every way of cutting the bytes gives the same lines."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from sidecar.streams.ndjson import DEFAULT_MAX_LINE_BYTES, NDJSONDecoder, NDJSONOverflow
from tests.fixtures.streams.harness import FAST, load, split_at

LINES = [b'{"a":1}', b'{"b":"\\u003c\xc3\xa9\xe6\x97\xa5"}', b"[1,2]", b'"x"', b"not json at all"]


def run(chunks, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> list:
    d = NDJSONDecoder(max_line_bytes)
    out: list = []
    for c in chunks:
        out += d.feed(c)
    return out + d.close()


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_lines_every_way(eol):
    data = eol.join(LINES) + eol
    assert run([data]) == LINES
    assert run(bytewise(data)) == LINES
    for cut in range(len(data) + 1):
        assert run([data[:cut], data[cut:]]) == LINES


def test_mixed_line_ends():
    assert run([b"a\r\nb\nc\r\n"]) == [b"a", b"b", b"c"]


def test_unterminated_last_line_is_emitted_at_close():
    d = NDJSONDecoder()
    assert d.feed(b'{"a":1}\n{"b":') == [b'{"a":1}']
    assert d.feed(b"2}") == []
    assert d.close() == [b'{"b":2}']
    assert d.close() == []


def test_unterminated_last_line_with_cr_only():
    assert run([b"a\nb\r"]) == [b"a", b"b"]


@pytest.mark.parametrize("blank", [b"", b" ", b"\t", b"\r", b" \t \r"])
def test_blank_lines_are_skipped(blank):
    assert run([b"a\n" + blank + b"\n" + blank + b"\nb\n"]) == [b"a", b"b"]
    assert run([b"a\n" + blank]) == [b"a"]


def test_cr_inside_a_line_is_data():
    assert run([b"a\rb\n"]) == [b"a\rb"]


def test_only_one_trailing_cr_is_stripped():
    assert run([b"a\r\r\n"]) == [b"a\r"]


def test_empty_feed_and_empty_stream():
    d = NDJSONDecoder()
    assert d.feed(b"") == []
    assert d.close() == []


def test_utf8_split_inside_a_character_is_carried():
    line = '{"t":"日本"}'.encode()
    data = line + b"\n"
    cut = data.index("日".encode()) + 2
    assert run([data[:cut], data[cut:]]) == [line]


def test_ollama_fixture_lines():
    raw = load("ollama", "generate.ndjson")
    lines = raw.split(b"\n")[:-1]
    assert run([raw]) == lines
    assert run(bytewise(raw)) == lines


# -- bounded memory ---------------------------------------------------------------------------


def test_overlong_line_in_one_feed_is_reported_once_and_skipped():
    out = run([b"ok\n" + b"x" * 100 + b"\nnext\n"], max_line_bytes=10)
    assert out == [b"ok", NDJSONOverflow("line longer than 10 bytes"), b"next"]


def test_overlong_line_across_feeds_is_reported_once_and_skipped():
    chunks = [b"ok\n"] + [b"x" * 7] * 20 + [b"\nnext\n"]
    assert run(chunks, max_line_bytes=10) == [
        b"ok",
        NDJSONOverflow("line longer than 10 bytes"),
        b"next",
    ]
    # byte by byte too: the buffer never holds more than the bound
    d = NDJSONDecoder(10)
    out: list = []
    for c in bytewise(b"x" * 50):
        out += d.feed(c)
        assert d._size <= 11  # the bound, plus the CR of a CRLF
    out += d.feed(b"\nnext\n") + d.close()
    assert out == [NDJSONOverflow("line longer than 10 bytes"), b"next"]


def test_overlong_unterminated_line_at_close_is_dropped():
    assert run([b"ok\n", b"y" * 50], max_line_bytes=10) == [
        b"ok",
        NDJSONOverflow("line longer than 10 bytes"),
    ]


def test_line_exactly_at_the_bound_is_kept():
    assert run([b"x" * 10 + b"\r\n"], max_line_bytes=10) == [b"x" * 10]
    assert run([b"x" * 5, b"x" * 5, b"\n"], max_line_bytes=10) == [b"x" * 10]


def test_crlf_line_at_the_bound_split_before_the_lf_is_kept():
    # the CR that arrives before its LF must not count against the line
    assert run([b"x" * 10 + b"\r", b"\n"], max_line_bytes=10) == [b"x" * 10]
    assert run([b"x" * 10, b"\r", b"\nok\n"], max_line_bytes=10) == [b"x" * 10, b"ok"]
    assert run([b"x" * 11, b"\n"], max_line_bytes=10) == [
        NDJSONOverflow("line longer than 10 bytes")
    ]


def test_line_crossing_the_bound_only_with_its_last_piece():
    assert run([b"x" * 8, b"xxxx\nok\n"], max_line_bytes=10) == [
        NDJSONOverflow("line longer than 10 bytes"),
        b"ok",
    ]


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_bound_raises(bad):
    with pytest.raises(ValueError):
        NDJSONDecoder(bad)


# -- properties -------------------------------------------------------------------------------


@FAST
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=12))
def test_any_split_gives_the_same_lines(raw, cuts):
    assert run(split_at(raw, cuts)) == run([raw])


@FAST
@given(st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=8), st.data())
def test_lines_round_trip(lines, data):
    eol = data.draw(st.sampled_from([b"\n", b"\r\n"]))
    raw = b"".join(line + eol for line in lines)
    expected = []
    for line in lines:
        if eol == b"\n" and line.endswith(b"\r"):
            line = line[:-1]
        if line.strip(b" \t\r"):
            expected.append(line)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=10))
    assert run(split_at(raw, cuts)) == expected


@FAST
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=12), st.integers(1, 40))
def test_bounded_any_split_same_result_and_never_over_bound(raw, cuts, bound):
    whole = run([raw], bound)
    d = NDJSONDecoder(bound)
    out: list = []
    for c in split_at(raw, cuts):
        out += d.feed(c)
        assert d._size <= bound + 1
    out += d.close()
    assert out == whole
    assert all(len(x) <= bound for x in out if isinstance(x, bytes))
