"""The response head the client receives: the upstream's own bytes, not a re-encoding.

aiohttp's ``StreamResponse`` writes a head from a ``CIMultiDict[str]``: it drops header
bytes that are not UTF-8 (``caf\\xe9`` became ``caf``, ``Set-Cookie: s=\\xff\\xfe`` became
``s=``), re-encodes a latin-1 reason phrase, adds ``Content-Type:
application/octet-stream``, ``Server`` and ``Date`` when the upstream sent none, and
refuses some values the upstream's parser accepted (a control character), which became a
text/plain 500 (with chunk framing under a ``Content-Length`` for a stream). So the head is
built here from the upstream's raw status line and field lines: hop-by-hop fields (and those
``Connection`` lists) are dropped, the framing is the sidecar's (a ``Transfer-Encoding:
chunked`` it adds for a re-framed body, one plain ``Content-Length``), ``Connection`` says
what this connection does; every other byte is the upstream's.

The response leg writes these bytes to the client's transport itself
(sidecar/relay/data/body_relay.py); ``tests/unit/relay/data/test_client_head.py`` and the header
tests in ``tests/integration/relay/server/test_hostile_headers.py`` pin the bytes on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from .http1 import ResponseHead

__all__ = ["ClientHead", "client_head"]

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
     "te", "trailer", "transfer-encoding", "upgrade"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClientHead:
    data: bytes  # the head's bytes, CRLFCRLF included
    chunked: bool  # the body must be sent as chunks (the upstream's was not length-framed)
    keep_alive: bool  # the connection may carry another request afterwards


def client_head(
    head: ResponseHead, *, http11: bool, method: str, client_keep_alive: bool
) -> ClientHead:
    """The head for the client of a request (its HTTP version, method and whether it asked
    to keep the connection) answered by the upstream's ``head``."""
    # The names come lowered from the parser (tokens: ASCII, so as the bytes lower).
    names = head.names
    listed: set[str] = set()
    if "connection" in names:
        for line, lname in zip(head.raw_fields, names, strict=True):
            if lname == "connection":
                value = line.partition(b":")[2]
                listed.update(
                    t.strip().lower().decode("latin-1") for t in value.split(b",") if t.strip()
                )
    lengths = names.count("content-length")
    no_body = method == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200
    length_framed = head.length is not None and not head.chunked
    out = [b"HTTP/1.1 " if http11 else b"HTTP/1.0 ", b"%d" % head.status, head.raw_reason, b"\r\n"]
    plain_length = True
    for line, lname in zip(head.raw_fields, names, strict=True):
        if lname in _HOP_BY_HOP or lname in listed:
            continue
        if lname == "content-length" and length_framed:
            value = line[line.find(b":") + 1 :].strip(b" \t")
            if lengths != 1 or not value.isdigit():
                plain_length = False  # "5, 5" or two fields: one plain value instead (RFC 9110 8.6)
                continue
        out += (line, b"\r\n")  # (+= a tuple: no method call a line)
    if length_framed and not plain_length:
        out += (b"Content-Length: %d\r\n" % head.length,)  # type: ignore[str-format]  # length_framed: an int
    chunked = False
    keep_alive = client_keep_alive
    if not no_body and not length_framed:
        if http11:
            chunked = True
            out += (b"Transfer-Encoding: chunked\r\n",)
        else:
            keep_alive = False  # HTTP/1.0: the body ends when the connection closes
    if keep_alive and not http11:
        out += (b"Connection: keep-alive\r\n",)
    elif not keep_alive and http11:
        out += (b"Connection: close\r\n",)
    out += (b"\r\n",)
    return ClientHead(b"".join(out), chunked, keep_alive)
