"""The header fields the upstream gets for a client's request: the client's, less the
hop-by-hop ones and those the sidecar sets itself, plus ``X-Forwarded-For/-Proto/-Host``.

Every request reaches the upstream from sidecar/relay/data/exchange.py, with these fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from multidict import CIMultiDict, MultiMapping

from .http1 import lowered_names

if TYPE_CHECKING:
    import asyncio

    from aiohttp.http import RawRequestMessage

__all__ = [
    "ClientPeer",
    "HOP_BY_HOP",
    "NOT_FORWARDED_TO_UPSTREAM",
    "forwarded_headers",
    "peer_address",
    "peer_of",
    "request_headers",
]

# RFC 9110 section 7.6.1, plus the de-facto Proxy-Connection and Keep-Alive.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
NOT_FORWARDED_TO_UPSTREAM = HOP_BY_HOP | {"host", "expect"}
"""Not hop-by-hop, but ours to set: Host comes from the upstream URL, and the body has
already been accepted by this server, so the upstream must not be asked to continue."""


_NOT_FORWARDED_WITH_BYTES = NOT_FORWARDED_TO_UPSTREAM | {"content-length"}
"""And a body sent as bytes gets its Content-Length from them (http1.request_head's caller)."""


def _connection_listed(headers: MultiMapping[str]) -> set[str]:
    listed: set[str] = set()
    for value in headers.getall("Connection", ()):
        listed.update(token.strip().lower() for token in value.split(",") if token.strip())
    return listed


def _kept(
    headers: MultiMapping[str],
    items: list[tuple[str, str]],
    names: list[str],
    drop: frozenset[str] | set[str],
) -> CIMultiDict[str]:
    """The fields (``items`` of ``headers``, their lowered ``names``) without the names in
    ``drop`` and those the Connection field lists."""
    listed = _connection_listed(headers) if "connection" in names else ()
    return CIMultiDict(
        [
            item
            for item, lower in zip(items, names, strict=True)
            if lower not in drop and lower not in listed
        ]
    )


def forwarded_headers(
    headers: MultiMapping[str], *, peer: str, scheme: str, host: str | None, body_is_bytes: bool
) -> CIMultiDict[str]:
    """The upstream request's header fields (``Host`` and the body's framing are added by
    sidecar/relay/data/http1.py's ``request_head``; a body sent as bytes gets its
    Content-Length there, so the client's is dropped)."""
    items = list(headers.items())
    names = lowered_names(items)
    drop = _NOT_FORWARDED_WITH_BYTES if body_is_bytes else NOT_FORWARDED_TO_UPSTREAM
    out = _kept(headers, items, names, drop)
    # Every X-Forwarded-For the client sent, joined, then the peer (nginx's
    # $proxy_add_x_forwarded_for): a second header must not be dropped.
    prior = ", ".join(headers.getall("X-Forwarded-For")) if "x-forwarded-for" in names else ""
    out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    out["X-Forwarded-Proto"] = scheme
    if host:
        out["X-Forwarded-Host"] = host
    return out


def peer_address(peername: object) -> str:
    """The client's address as aiohttp's ``request.remote`` gives it for a TCP peer."""
    if isinstance(peername, (list, tuple)):
        return str(peername[0])
    return "" if peername is None else str(peername)


def peer_of(transport: asyncio.BaseTransport | None) -> str:
    """The client's address on ``transport`` (:func:`peer_address`)."""
    return peer_address(transport.get_extra_info("peername") if transport else None)


class ClientPeer:
    """Who a client connection is, as the upstream is told: its ``address``
    (``X-Forwarded-For``), its ``scheme`` (``X-Forwarded-Proto``) and ``local_host``, the
    address it came to (the host of an HTTP/1.0 request that names none). The same for
    every request on a connection: read from its transport once, at its first request
    (sidecar/relay/data/exchange.py keeps it on the connection)."""

    __slots__ = ("address", "scheme", "local_host")

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self.address = peer_of(transport)
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        sockname = transport.get_extra_info("sockname")
        self.local_host = str(sockname[0]) if isinstance(sockname, tuple) else ""


def request_headers(
    message: RawRequestMessage, peer: ClientPeer, *, body_is_bytes: bool
) -> CIMultiDict[str]:
    """The upstream request's header fields for the request ``message`` that came in from
    ``peer`` (:func:`forwarded_headers`)."""
    url = message.url
    # The host the request names: an absolute form's (RFC 9112 section 3.2.2), else the
    # Host field, else (HTTP/1.0) the address it came to, as aiohttp's request.host.
    host = (url.host or "") if url.absolute else message.headers.get("Host")
    return forwarded_headers(
        message.headers,
        peer=peer.address,
        scheme=peer.scheme,
        host=peer.local_host if host is None else host,
        body_is_bytes=body_is_bytes,
    )
