"""client_head: the upstream's head bytes, minus hop-by-hop fields, with the sidecar's
framing and Connection, for every client version, method and body framing."""

from __future__ import annotations

import pytest

from sidecar.relay.data.client_head import client_head
from sidecar.relay.data.http1 import ResponseParser


def parsed(raw: bytes, method: str = "GET"):
    parser = ResponseParser(no_body=method == "HEAD")
    parser.feed(raw)
    assert parser.head is not None
    return parser.head


def lines(data: bytes) -> list[bytes]:
    assert data.endswith(b"\r\n\r\n")
    return data[:-4].split(b"\r\n")


def test_hop_by_hop_and_connection_listed_fields_are_dropped_the_rest_kept_as_bytes():
    head = parsed(
        b"HTTP/1.1 201 Cr\xe9\xe9\r\nConnection: keep-alive, X-Private\r\nKeep-Alive: timeout=5\r\n"
        b"X-Private: secret\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\nTrailer: X-T\r\nUpgrade: h2c\r\n"
        b"Proxy-Connection: x\r\nX-Kept: \xff\x00k\r\n\r\n".replace(b"\x00", b"")
    )
    out = client_head(head, http11=True, method="POST", client_keep_alive=True)
    assert lines(out.data) == [
        b"HTTP/1.1 201 Cr\xe9\xe9",
        b"X-Kept: \xffk",
        b"Transfer-Encoding: chunked",
    ]
    assert out.chunked and out.keep_alive


@pytest.mark.parametrize(
    "raw, method, http11, keep, expected_tail, chunked, keep_alive",
    [
        # Length-framed: relayed as it is, the client's connection choice said.
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
            "GET",
            True,
            True,
            [b"Content-Length: 2"],
            False,
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
            "GET",
            True,
            False,
            [b"Content-Length: 2", b"Connection: close"],
            False,
            False,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
            "GET",
            False,
            True,
            [b"Content-Length: 2", b"Connection: keep-alive"],
            False,
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
            "GET",
            False,
            False,
            [b"Content-Length: 2"],
            False,
            False,
        ),
        # Chunked or close-delimited upstream: chunks for HTTP/1.1, the close for HTTP/1.0.
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET",
            True,
            True,
            [b"Transfer-Encoding: chunked"],
            True,
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET",
            False,
            True,
            [],
            False,
            False,
        ),
        (
            b"HTTP/1.0 200 OK\r\n\r\n",
            "GET",
            True,
            True,
            [b"Transfer-Encoding: chunked"],
            True,
            True,
        ),
        # No body: whatever the headers say, nothing is framed.
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n",
            "HEAD",
            True,
            True,
            [b"Content-Length: 99"],
            False,
            True,
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", "DELETE", True, True, [], False, True),
        (
            b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n",
            "GET",
            True,
            True,
            [b"ETag: x"],
            False,
            True,
        ),
        # Repeated lengths become one plain value (RFC 9110 section 8.6).
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\n",
            "GET",
            True,
            True,
            [b"Content-Length: 2"],
            False,
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
            "GET",
            True,
            True,
            [b"Content-Length: 2"],
            False,
            True,
        ),
    ],
)
def test_framing_and_connection(raw, method, http11, keep, expected_tail, chunked, keep_alive):
    out = client_head(parsed(raw, method), http11=http11, method=method, client_keep_alive=keep)
    got = lines(out.data)
    assert got[0].startswith(b"HTTP/1.1 " if http11 else b"HTTP/1.0 ")
    assert got[0][9:] == raw.split(b"\r\n")[0][9:]  # code and reason as sent
    assert got[1:] == expected_tail
    assert (out.chunked, out.keep_alive) == (chunked, keep_alive)
