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
(sidecar/relay/data/body_relay.py); ``tests/unit/test_client_head.py`` and the header tests in
``tests/integration/relay/server/test_hostile_headers.py`` pin the bytes on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from .http1 import ResponseHead

__all__ = ["ClientHead", "client_head"]

_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
     b"te", b"trailer", b"transfer-encoding", b"upgrade"}
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
    listed: set[bytes] = set()
    lengths = 0
    for line in head.raw_fields:
        name, _, value = line.partition(b":")
        lname = name.lower()
        if lname == b"connection":
            listed.update(t.strip().lower() for t in value.split(b",") if t.strip())
        elif lname == b"content-length":
            lengths += 1
    no_body = method == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200
    length_framed = head.length is not None and not head.chunked
    out = [b"HTTP/1.1 " if http11 else b"HTTP/1.0 ", b"%d" % head.status, head.raw_reason, b"\r\n"]
    plain_length = True
    for line in head.raw_fields:
        lname = line[: line.find(b":")].lower()
        if lname in _HOP_BY_HOP or lname in listed:
            continue
        if lname == b"content-length" and length_framed:
            value = line[line.find(b":") + 1 :].strip(b" \t")
            if lengths != 1 or not value.isdigit():
                plain_length = False  # "5, 5" or two fields: one plain value instead (RFC 9110 8.6)
                continue
        out += (line, b"\r\n")
    if length_framed and not plain_length:
        out.append(b"Content-Length: %d\r\n" % head.length)  # type: ignore[str-format]  # length_framed: an int
    chunked = False
    keep_alive = client_keep_alive
    if not no_body and not length_framed:
        if http11:
            chunked = True
            out.append(b"Transfer-Encoding: chunked\r\n")
        else:
            keep_alive = False  # HTTP/1.0: the body ends when the connection closes
    if keep_alive and not http11:
        out.append(b"Connection: keep-alive\r\n")
    elif not keep_alive and http11:
        out.append(b"Connection: close\r\n")
    out.append(b"\r\n")
    return ClientHead(b"".join(out), chunked, keep_alive)
