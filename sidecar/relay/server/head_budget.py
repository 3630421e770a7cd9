"""A budget for a whole request head, on top of aiohttp's per-line and per-field limits.

aiohttp bounds each header field (``max_field_size``) and their number (``max_headers``),
so a head may still be ~1 MiB (128 fields of 8 KiB), and a client that never ends it pins
that much per connection until the head timeout (200 such connections take RSS from 53 to
449 MiB). nginx refuses a head over 32 KiB by default, Envoy over 60 KiB;
the sidecar counts the bytes a connection sends while it is between requests (no request
body being read) and answers 431 with the proxy's JSON body past ``max_request_head_bytes``.

Sans-I/O: :class:`HeadBudget` is told what arrived and whether a head completed; the
connection (sidecar/relay/server/proxy_port.py; on the admin port aiohttp's, in
aiohttp_internals.py) writes :func:`head_too_large_response` and closes.
"""

from __future__ import annotations

from itertools import chain

from aiohttp.http import RawRequestMessage

from .errors import raw_error_response

__all__ = ["HeadBudget", "head_size", "head_too_large_response"]


def head_size(message: RawRequestMessage) -> int:
    """Bytes of a parsed request head (aiohttp ``RawRequestMessage``): the request line and
    each field line with their CRLFs, as sent (obsolete spacing aside)."""
    raw = message.raw_headers  # ": " and CRLF a field, summed in C (no call a field)
    fields = sum(map(len, chain.from_iterable(raw))) + 4 * len(raw)
    return len(message.method) + len(message.path) + 13 + fields  # " HTTP/1.1\r\n", end CRLF


class HeadBudget:
    """Bytes received towards the request head being read, per connection."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def received(self, n: int, *, in_head: bool, head_done: bool, head_size: int = 0) -> bool:
        """Count ``n`` bytes; ``in_head``: the connection was between requests when they came;
        ``head_done``: a head of ``head_size`` bytes completed within them. Returns False
        once over the limit."""
        if head_done:
            self.used = 0  # the rest of the chunk is body or the next head: at most one read
            return head_size <= self.limit
        if in_head:
            self.used += n
        return self.used <= self.limit


def head_too_large_response() -> bytes:
    return raw_error_response(
        431, "Request Header Fields Too Large", "request_head_too_large",
        "the request head is larger than the sidecar accepts",
    )  # fmt: skip
