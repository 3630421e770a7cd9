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
from collections.abc import AsyncIterator, Callable

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
    "HeadSays",
    "HeldBody",
    "Refusal",
    "head_says",
    "late_fields",
    "malformed",
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


class HeadSays:
    """What a request's head says of its body (:func:`head_says`): ``refused``, the
    sidecar's own answer instead of asking the upstream (or None); ``expect``: it asked for
    ``100-continue`` (the body is invited); ``body``: a body follows the head; ``hold``: the
    length of a body held whole before it is sent, else 0 (streamed, or none)."""

    __slots__ = ("refused", "expect", "body", "hold")

    def __init__(self, refused: Refusal | None, expect: bool, body: bool, hold: int) -> None:
        self.refused = refused
        self.expect = expect
        self.body = body
        self.hold = hold


_NOT_IN_HOST = frozenset(" \t/\\?#@\x7f") | frozenset(map(chr, range(32)))


def head_says(message: RawRequestMessage, route: Route, limits: RelayLimits) -> HeadSays:
    """Read a request's head once for its body: the refusals its head alone gives (a
    CONNECT tunnel 405, not HTTP/1.x 505, a Host that is not a host 400, a ``Content-Length``
    over ``max_request_body_bytes`` 413, ``Transfer-Encoding`` in HTTP/1.0 400 or other than
    plain ``chunked`` 501, an ``Expect`` other than ``100-continue`` 417, in that order);
    else whether a body follows (aiohttp's ``body_exists``: chunked, or a length above 0; an
    upgrade offer's body too: the offer is hop-by-hop and dropped, the request relayed as a
    plain one, so its body goes with it), and whether it is held whole: a known API route's
    ``POST`` with a ``Content-Length`` within ``max_request_inspect_bytes``, read for its
    fields. The parser has refused a malformed or conflicting ``Content-Length`` already;
    the fields a request rarely has are looked for before they are read."""
    headers = message.headers
    length_field = headers.get("Content-Length")
    length = int(length_field) if length_field is not None and length_field.isdigit() else None
    coding = headers["Transfer-Encoding"] if "Transfer-Encoding" in headers else None
    expect = headers["Expect"] if message.version == HttpVersion11 and "Expect" in headers else None
    refused: Refusal | None = None
    limit = limits.max_request_body_bytes
    if message.method == "CONNECT":
        # A tunnel to wherever the client names: never what an inference server is for.
        refused = 405, "method_not_allowed", "CONNECT is not relayed"
    elif message.version.major != 1:  # HTTP/1.x only on this port (relayed as 1.1 otherwise)
        refused = 505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are relayed"
    elif not _valid_host(headers.get("Host")):
        refused = 400, "bad_request", "the Host header is not a valid host"
    elif length is not None and length > limit:
        refused = too_large(limit)
    elif coding is not None and message.version < HttpVersion11:
        refused = 400, "bad_request", "Transfer-Encoding is not allowed in an HTTP/1.0 request"
    elif coding is not None and coding.strip().lower() != "chunked":
        # aiohttp decodes only chunked and would relay "gzip, chunked" still compressed.
        refused = 501, "unsupported_transfer_coding", "only Transfer-Encoding: chunked is supported"
    elif expect is not None and expect.lower() != "100-continue":
        refused = 417, "expectation_failed", "only Expect: 100-continue is understood"
    hold = (
        length
        if message.method == "POST"
        and route is not OTHER
        and coding is None
        and length is not None
        and length <= limits.max_request_inspect_bytes
        else 0
    )
    body = message.chunked or (length is not None and length > 0)
    return HeadSays(refused, expect is not None, body, hold)


def _valid_host(host: str | None) -> bool:
    """No Host, or a host and optional port (RFC 9110 section 7.2): no whitespace, path,
    query, userinfo or control characters (nginx refuses them with 400; an upstream that
    builds URLs from Host would read them as something else)."""
    return host is None or (host.isascii() and _NOT_IN_HOST.isdisjoint(host))


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
