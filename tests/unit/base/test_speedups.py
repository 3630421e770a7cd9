"""The optional C byte checks (sidecar/base/_speedups.c) against their Python originals
(sidecar/base/speedups.py), which are the oracle: the same bytes, the same answers. (The
token lane is checked against the Python relay path: tests/unit/relay/data/test_token_lane.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from sidecar.base import speedups
from tests.fixtures.streams.harness import FAST
from tests.support.skips import IN_CI

try:
    from sidecar.base import _speedups
except ImportError:  # not built: no C compiler when the package was installed
    _speedups = None

needs_c = pytest.mark.skipif(
    _speedups is None and not IN_CI,
    reason="the C extension was not built (no C compiler when the package was installed)",
)


def test_the_extension_is_built_and_used_in_ci():
    """CI installs with a C compiler: the relay must be using the C checks there."""
    if not IN_CI and _speedups is None:
        pytest.skip("the C extension was not built (no C compiler when the package was installed)")
    assert _speedups is not None and speedups.IN_C
    assert speedups.chunk_payload is _speedups.chunk_payload
    assert speedups.chunk_payloads is _speedups.chunk_payloads


# Bytes at UTF-8's edges: overlong forms, surrogates, past U+10FFFF, truncated sequences,
# unprintable non-ASCII characters (line separator, BOM, a tag), and printable ones.
TRICKY = [
    b"a",
    b" ",
    b'"',
    b"\\",
    b"\x7f",
    b"\x1f",
    b"\xc0\x80",
    b"\xc1\xbf",
    b"\xc2\xa0",
    b"\xe0\x80\x80",
    b"\xe0\xa0\x80",
    b"\xed\x9f\xbf",
    b"\xed\xa0\x80",
    b"\xef\xbb\xbf",
    b"\xf0\x8f\xbf\xbf",
    b"\xf0\x90\x80\x80",
    b"\xf4\x8f\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80",
    b"\xff",
    b"\xc3",
    b"\xe2\x80",
    b"\xe2\x80\xa8",
    "é".encode(),
    "日".encode(),
    "🚀".encode(),
    "\U000e0001".encode(),
]


def frame(payload: bytes, size_line: bytes | None = None) -> bytes:
    return (
        (size_line if size_line is not None else b"%x" % len(payload)) + b"\r\n" + payload + b"\r\n"
    )


CASES = [
    frame(b"data: x\n\n"),
    frame(b"data: x\n\n", b"%X" % 9),
    frame(b"data: x\n\n", b"0009"),
    frame(b"data: x\n\n", b"0" * 14 + b"9"),  # 15 digits
    frame(b"data: x\n\n", b"0" * 15 + b"9"),  # 16: too many
    frame(b"data: x\n\n", b"9;ext=1"),
    frame(b"data: x\n\n", b"0x9"),
    frame(b"data: x\n\n", b"+9"),
    frame(b"data: x\n\n", b" 9"),
    frame(b"data: x\n\n", b"8"),
    frame(b"data: x\n\n", b"a"),
    frame(b""),
    b"0\r\n\r\n",
    b"9\r\ndata: x\n\n\r",
    b"9\r\ndata: x\n\n\r\nX",
    b"9\r\ndata: x\n\nXY",
    b"9\r\n",
    b"",
    b"\r\n",
    frame(b"two\r\n", b"5") + frame(b"more"),
]


@needs_c
@pytest.mark.parametrize("data", CASES)
def test_chunk_payload_cases(data):
    assert _speedups.chunk_payload(data) == speedups.chunk_payload_py(data)


@needs_c
@FAST
@given(
    st.binary(max_size=40),
    st.one_of(
        st.none(),
        st.binary(max_size=18),
        st.text("0123456789abcdefABCDEFxX;+- ", max_size=17).map(str.encode),
    ),
    st.sampled_from([b"\r\n", b"\n", b"", b"\r\nX"]),
)
def test_chunk_payload_like_python(payload, size_line, tail):
    data = (size_line if size_line is not None else b"%x" % len(payload)) + b"\r\n" + payload + tail
    assert _speedups.chunk_payload(data) == speedups.chunk_payload_py(data)


# Reads of several chunks: whole ones back to back, the last chunk after them or alone, and
# every way one of them can fall short of whole (the general path's then).
SEVERAL = [
    frame(b"a") + frame(b"bc"),
    frame(b"a") + frame(b"bc") + b"0\r\n\r\n",
    b"0\r\n\r\n",
    b"000\r\n\r\n",
    frame(b"a") + b"0\r\n\r\nX",
    frame(b"a") + b"0\r\nT: 1\r\n\r\n",
    frame(b"a") + b"0;e\r\n\r\n",
    frame(b"a") + b"0\r\n\r",
    frame(b"a") + b"0\r\n",
    frame(b"a") + frame(b"bc")[:-1],
    frame(b"a") + frame(b"bc", b"2;x"),
    frame(b"a") + frame(b"bc", b"0" * 15 + b"2"),
    frame(b"a") + frame(b"bc", b"0" * 14 + b"2"),
    frame(b"a") + b"\r\n",
    frame(b"a") + b"f" * 15 + b"\r\nx\r\n",
    frame(b"two\r\n", b"5") + frame(b"more"),
] + CASES


@needs_c
@pytest.mark.parametrize("data", SEVERAL)
def test_chunk_payloads_cases(data):
    assert _speedups.chunk_payloads(data) == speedups.chunk_payloads_py(data)


def test_chunk_payloads_py_reads_whole_chunks_and_the_end():
    """The Python original, which the C answers as: whole chunks, the end, and None for
    anything the general path must read."""
    assert speedups.chunk_payloads_py(frame(b"a") + frame(b"bc")) == ([b"a", b"bc"], False)
    assert speedups.chunk_payloads_py(frame(b"a") + b"0\r\n\r\n") == ([b"a"], True)
    assert speedups.chunk_payloads_py(b"0\r\n\r\n") == ([], True)
    assert speedups.chunk_payloads_py(b"") is None
    assert speedups.chunk_payloads_py(frame(b"a") + b"0\r\n\r\nX") is None
    assert speedups.chunk_payloads_py(frame(b"a") + frame(b"b", b"1;e")) is None


@needs_c
@FAST
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=12),
            st.one_of(
                st.none(),
                st.text("0123456789abcdefABCDEF;x ", max_size=17).map(str.encode),
            ),
            st.sampled_from([b"\r\n", b"\n", b"", b"\r\nX"]),
        ),
        max_size=4,
    ),
    st.sampled_from([b"", b"0\r\n\r\n", b"00\r\n\r\n", b"0\r\n\r", b"0\r\n\r\nX"]),
)
def test_chunk_payloads_like_python(chunks, end):
    data = (
        b"".join(
            (line if line is not None else b"%x" % len(payload)) + b"\r\n" + payload + tail
            for payload, line, tail in chunks
        )
        + end
    )
    assert _speedups.chunk_payloads(data) == speedups.chunk_payloads_py(data)


@needs_c
@FAST
@given(
    st.one_of(
        st.binary(max_size=16),
        st.text(max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.lists(st.sampled_from(TRICKY), max_size=5).map(b"".join),
    ),
    st.integers(0, 4),
    st.integers(0, 4),
)
def test_plain_at_like_python(text, before, after):
    """C answers exactly as Python does, for ASCII and for UTF-8 (valid or not)."""
    buf = b"x" * before + text + b"y" * after
    start, end = before, before + len(text)
    assert _speedups.plain_at(buf, start, end) is speedups.plain_at_py(buf, start, end)


@needs_c
def test_plain_at_every_code_point_like_python():
    """Every code point encoded alone (and the surrogates, which UTF-8 refuses): CPython's
    own printable table, so this follows the Python it runs on."""
    for cp in range(0x110000):
        raw = chr(cp).encode("utf-8", "surrogatepass")
        assert _speedups.plain_at(raw, 0, len(raw)) is speedups.plain_at_py(raw, 0, len(raw)), hex(
            cp
        )


@needs_c
def test_plain_at_edges():
    for text in (
        b'"',
        b"\\",
        b"\x7f",
        b"\x1f",
        b"\x00",
        b"a\tb",
        b"\xc0\x80",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xc3",
    ):
        assert _speedups.plain_at(b"[" + text + b"]", 1, 1 + len(text)) is False, text
    assert _speedups.plain_at(b"[ok ~]", 1, 5) is True
    assert _speedups.plain_at(b"abc", 1, 1) is False  # empty
    assert _speedups.plain_at(b"abc", 2, 9) is False  # out of range
    assert _speedups.plain_at("café 日本 🚀".encode(), 0, len("café 日本 🚀".encode())) is True
    assert _speedups.plain_at(b'caf\xc3\xa9"', 0, 6) is False
    assert (
        _speedups.plain_at("a\u2028b".encode(), 0, 5) is False
    )  # a line separator is not printable


def test_without_the_extension_the_originals_answer(monkeypatch):
    """An install without a C compiler: the module falls back to the Python versions, and
    the relay's chunk check still works (reloaded with the extension's import failing)."""
    import builtins
    import importlib

    real_import = builtins.__import__

    def no_c(name, *args, **kwargs):
        if name.endswith("_speedups") or (args and args[2] and "_speedups" in args[2]):
            raise ImportError("no C extension in this test")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_c)
    try:
        fallback = importlib.reload(speedups)
        assert fallback.IN_C is False
        assert fallback.chunk_payload is fallback.chunk_payload_py
        assert fallback.chunk_payloads is fallback.chunk_payloads_py
        assert fallback.chunk_payload(frame(b"hello")) == b"hello"
        assert fallback.plain_at(b"[hi]", 1, 3) is True
        from sidecar.relay.data import token_lane

        lanes = importlib.reload(token_lane)
        # no C lane: the Python one (sidecar/relay/data/token_lane_py.py)
        assert (
            lanes.TokenLane is lanes.token_lane_py.TokenLane
            and lanes.AVAILABLE
            and not lanes.IN_C_LANE
        )
    finally:
        monkeypatch.setattr(builtins, "__import__", real_import)
        importlib.reload(speedups)
        importlib.reload(token_lane)
    assert speedups.IN_C is (_speedups is not None)
    assert token_lane.IN_C_LANE is speedups.IN_C and token_lane.AVAILABLE


_SIZE_LINE_BYTES = st.sampled_from(list(b"0123456789abcdefABCDEFxX+-_ ;\r\n\t"))


@FAST
@given(st.lists(_SIZE_LINE_BYTES, max_size=24).map(bytes), st.integers(0, 4))
def test_size_line_states_hex_sizes_rule(data, pos):
    """size_line bounds the digits by where it looks for their CRLF, not by a length check:
    the same answer as hex_size on the bytes before the first CRLF, at any position."""
    eol = data.find(b"\r\n", pos)
    size = speedups.hex_size(data[pos:eol]) if eol >= pos else None
    expected = None if size is None else (size, eol + 2)
    assert speedups.size_line(data, pos) == expected


@pytest.mark.parametrize("digits", [1, 14, 15, 16, 17])
def test_size_line_takes_one_to_fifteen_digits(digits):
    line = b"f" * digits + b"\r\nrest"
    assert speedups.size_line(line, 0) == (
        (int(b"f" * digits, 16), digits + 2) if digits <= 15 else None
    )
    assert speedups.size_line(b"\r\n", 0) is None  # no digits
