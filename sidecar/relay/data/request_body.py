"""What a request's head says of its body, before any of it is forwarded: refused, none,
held whole (to read the fields the figures are labelled with), or streamed.

Framing is never relayed as received: aiohttp's parser has already refused conflicting or
obfuscated ``Content-Length``/``Transfer-Encoding`` (see :mod:`sidecar.app`), the body is
decoded, and the upstream request is framed afresh (:mod:`sidecar.relay.data.upstream`).
An HTTP/1.0 request that carries ``Transfer-Encoding`` is refused with 400 (RFC 9112
section 6.1: its framing is faulty), a transfer coding other than plain ``chunked`` with 501
(section 6.1 again: aiohttp would not decode it).

A known API route's JSON body is held whole (bounded by ``max_request_inspect_bytes`` and
the process-wide body budget) so the model can label the figures: the server needs the
whole JSON before it can start anyway, so this adds no time to first token. It is never
parsed into objects (a parsed body costs 15-30 times its bytes):
:class:`~sidecar.measure.request_fields.RequestFieldScanner` reads the few fields as the
pieces arrive. Every other body is streamed, held to the size and idle-time limits
(:class:`BoundedBody`). The body is never rewritten (not even to ask for usage): see
DESIGN, "Where it sits".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestPayloadError

from ...base.routes import OTHER, Route
from ...measure.request_fields import RequestFields, RequestFieldScanner
from ...measure.timeline import RequestTimeline
from .body_budget import BodyBudget
from .limits import RelayLimits

__all__ = [
    "BodyRefused",
    "BoundedBody",
    "HeldBody",
    "Refusal",
    "has_body",
    "holds_whole",
    "declared_length",
    "late_fields",
    "malformed",
    "refusal",
    "stalled",
    "too_large",
    "upstream_target",
]

Refusal = tuple[int, str, str]
"""Status, error type and message of a request the sidecar answers itself."""


def too_large(limit: int) -> Refusal:
    return 413, "request_too_large", f"the request body is larger than {limit} bytes"


def stalled(timeout: float) -> Refusal:
    return 408, "request_timeout", f"the request body stalled for {timeout:g} seconds"


def malformed() -> Refusal:
    """A body whose framing the parser refused after its head was accepted (a bad chunk)."""
    return 400, "bad_request", "the request body's framing is malformed"


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The body's length its ``Content-Length`` states (digits only), else None. Read once
    a request: the parser has refused a malformed or conflicting one already."""
    length = headers.get("Content-Length")
    return int(length) if length is not None and length.isdigit() else None


def refusal(message: RawRequestMessage, limits: RelayLimits, length: int | None) -> Refusal | None:
    """Why the request is refused without asking the upstream (its head alone says), or None;
    ``length``: its :func:`declared_length`."""
    if message.method == "CONNECT":
        # A tunnel to wherever the client names: never what an inference server is for.
        return 405, "method_not_allowed", "CONNECT is not relayed"
    if message.version.major != 1:  # HTTP/1.x only on this port (relayed as 1.1 otherwise)
        return 505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are relayed"
    headers = message.headers
    host = headers.get("Host")
    if host is not None and not _valid_host(host):
        return 400, "bad_request", "the Host header is not a valid host"
    limit = limits.max_request_body_bytes
    if length is not None and length > limit:
        return too_large(limit)
    coding = headers.get("Transfer-Encoding")
    if coding is not None:
        if message.version < HttpVersion11:
            return 400, "bad_request", "Transfer-Encoding is not allowed in an HTTP/1.0 request"
        if coding.strip().lower() != "chunked":
            # aiohttp decodes only chunked and would relay "gzip, chunked" still compressed.
            return (
                501,
                "unsupported_transfer_coding",
                "only Transfer-Encoding: chunked is supported",
            )
    return None


_NOT_IN_HOST = frozenset(" \t/\\?#@\x7f") | frozenset(map(chr, range(32)))


def _valid_host(host: str) -> bool:
    """A host and optional port (RFC 9110 section 7.2): no whitespace, path, query, userinfo
    or control characters (nginx refuses them with 400; an upstream that builds URLs from
    Host would read them as something else)."""
    return host.isascii() and _NOT_IN_HOST.isdisjoint(host)


def holds_whole(
    method: str, route: Route, headers: Mapping[str, str], length: int | None, limit: int
) -> int:
    """The length of a body held whole before it is sent (a known API route's ``POST`` with
    a ``Content-Length``, its :func:`declared_length`, within ``limit``), else 0: streamed,
    or no body."""
    if method != "POST" or route is OTHER or "Transfer-Encoding" in headers or length is None:
        return 0
    return length if length <= limit else 0


def has_body(message: RawRequestMessage, length: int | None) -> bool:
    """A body follows the head (aiohttp's ``body_exists``: chunked, or a length above 0). An
    upgrade offer's body too: the offer is hop-by-hop and dropped, the request relayed as a
    plain one, so its body goes with it (sending its head alone would let the upstream read
    the next request on the pooled connection as this one's body). ``length``: its
    :func:`declared_length`."""
    return message.chunked or (length is not None and length > 0)


def upstream_target(message: RawRequestMessage) -> str:
    """The request target for the upstream: as sent, but an absolute form
    (``GET http://host/path``) keeps only its path and query (the host it names is never
    where the request goes; no path means ``/``)."""
    target = message.path
    if target == "*" or target.startswith("/"):
        return target
    target = message.url.raw_path_qs or "/"
    return target if target.startswith("/") else "/" + target


class BodyRefused(Exception):
    """The request body broke a limit; ``refusal`` is what to answer instead."""

    def __init__(self, refused: Refusal) -> None:
        super().__init__(refused[2])
        self.refusal = refused


class BoundedBody:
    """A streamed request body held to the size and idle-time limits. Past one, sending
    it raises :class:`BodyRefused` out of the upstream request (its body is cut off, so
    the upstream never sees a complete request) and the sidecar answers with the refusal
    instead of 502. An API body streamed because the body budget was spent has its fields
    read in flight (``scanner``), known once it has all been sent (``fields``)."""

    __slots__ = ("_content", "_limit", "_timeout", "_scanner", "fields")

    def __init__(
        self,
        content: StreamReader,
        limit: int,
        timeout: float,
        scanner: RequestFieldScanner | None = None,
    ) -> None:
        self._content = content
        self._limit = limit
        self._timeout = timeout
        self._scanner = scanner
        self.fields: RequestFields | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        scanner = self._scanner
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    chunk = await self._content.readany()
            except TimeoutError:
                raise BodyRefused(stalled(self._timeout)) from None
            except RequestPayloadError:
                raise BodyRefused(malformed()) from None
            seen += len(chunk)
            if seen > self._limit:
                raise BodyRefused(too_large(self._limit))
            if not chunk:
                if scanner is not None:
                    self.fields = scanner.close()
                return
            if scanner is not None:
                scanner.feed(chunk)
            yield chunk


class HeldBody:
    """A request body read whole before it is sent, taken as it arrives (:meth:`take`, after
    each read; aiohttp's reader pauses the socket past its buffer's limit): ``whole(body)``
    once it is all in, or ``refused(refusal)`` when its framing breaks or it stalls for
    ``timeout`` between two reads. ``reserved`` bytes of ``budget`` stay promised to it
    until :meth:`release` (it is all in or refused, or its request ended)."""

    __slots__ = (
        "_payload", "_budget", "_reserved", "_timeout", "_clock", "_whole", "_refused", "_parts",
        "_deadline", "_timer", "_taking",
    )  # fmt: skip

    def __init__(
        self,
        payload: StreamReader,
        budget: BodyBudget,
        reserved: int,
        timeout: float,
        clock: Callable[[], float],
        whole: Callable[[bytes], None],
        refused: Callable[[Refusal], None],
    ) -> None:
        self._payload = payload
        self._budget = budget
        self._reserved = reserved
        self._timeout = timeout
        self._clock = clock
        self._whole = whole
        self._refused = refused
        self._parts: list[bytes] = []
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._taking = False  # in read_nowait, which may resume the client's reads

    def take(self) -> None:
        if self._taking:
            return  # a read aiohttp's reader resumed from inside read_nowait (taken below)
        payload = self._payload
        self._taking = True
        try:
            while chunk := payload.read_nowait():
                self._parts.append(chunk)
        except RequestPayloadError:  # its framing broke after the head: the client's error
            self._taking = False
            self.release()
            self._refused(malformed())
            return
        except Exception:  # the body failed: the connection is going (client_gone follows)
            return
        finally:
            self._taking = False
        if payload.is_eof():
            if self._reserved or self._timer is not None:
                self.release()
            body = b"".join(self._parts)
            self._parts = []
            self._whole(body)
            return
        self._deadline = self._clock() + self._timeout
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._timeout, self._stalled)

    def _stalled(self) -> None:
        self._timer = None
        left = self._deadline - self._clock()
        if left > 0:
            self._timer = asyncio.get_running_loop().call_later(left, self._stalled)
            return
        self.release()
        self._refused(stalled(self._timeout))

    def release(self) -> None:
        """The budget's bytes back, and no stall timer."""
        if self._reserved:
            self._budget.release(self._reserved)
            self._reserved = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def late_fields(timeline: RequestTimeline, fields: RequestFields) -> None:
    """The fields of an API body that was streamed (the body budget was spent), read as it
    went: known once it has been sent, before the response is measured."""
    if not timeline.model and fields.model:
        timeline.model = fields.model
    timeline.request_stream = fields.stream
    timeline.request_max_tokens = fields.max_tokens
