"""aiohttp's handler for the proxy port, the door for what the relay does not carry from the
connection's own callbacks (sidecar/relay/data/exchange.py: the one way in, and what it
declines): I/O only. Forwards the request to the upstream and
streams the response back (:class:`~sidecar.relay.data.body_relay.BodyRelay`: each piece
written to the client first, then a copy to the observer).

A request through the door has the same record as one the relay carries
(:class:`~sidecar.measure.record.RecordBook`: opened once, given its verdict once, whatever
happened). Measuring never raises into the relay (see
:mod:`sidecar.measure.observe`).

Faults map to what a client can act on:
- upstream refused / unreachable / broken before headers -> 502 with a JSON error body
- upstream connect or read timeout before headers        -> 504 with a JSON error body
- upstream dies or stalls past the idle timeout mid-stream -> the client connection is
  closed after flushing what was relayed, so the client sees a truncated stream instead
  of a clean end (and never hangs)
- client goes away -> the upstream response is closed at once, so the server stops
  generating; outcome ``cancelled`` with the partial figures
- client stops taking bytes for ``send_timeout`` (a full socket, no progress) -> the
  upstream response is closed (the server stops generating) and the client connection
  aborted; outcome ``cancelled``, error type ``client_send_timeout``. After each response
  the relay also waits for the client to take it, so a client that pipelines requests
  without reading gets no further request forwarded
- request body larger than ``max_request_body_bytes`` -> 413 with a JSON error body: before
  the upstream is asked when ``Content-Length`` says so (also in answer to
  ``Expect: 100-continue``, so the client never sends it), else as soon as a chunked body
  passes the limit (the upstream then sees its request cut off, never a complete one)
- request body stalls for ``CLIENT_BODY_TIMEOUT`` seconds between two reads -> 408 with a
  JSON error body (a streamed body is cut off as above). This also bounds a body whose
  framing breaks mid-way: aiohttp's parser then stops feeding the body without failing it.

Framing is never relayed as received: aiohttp's parser has already refused conflicting or
obfuscated ``Content-Length``/``Transfer-Encoding`` (see :mod:`sidecar.app`), the body is
decoded, and the upstream request is framed afresh (:mod:`sidecar.relay.data.upstream`). An HTTP/1.0
request that carries ``Transfer-Encoding`` is refused with 400 (RFC 9112 section 6.1: its
framing is faulty), a transfer coding other than plain ``chunked`` with 501 (section 6.1
again: aiohttp would not decode it), and the connection is closed after either.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import NamedTuple, cast

import aiohttp
import structlog
from aiohttp import web
from aiohttp.http import HttpVersion11
from multidict import CIMultiDict

from ...base.outcomes import Outcome, Verdict, verdict_of
from ...base.routes import OTHER, Route, match_route
from ...measure.record import RecordBook, RequestRecord
from ...measure.request_fields import RequestFields, RequestFieldScanner, scan_request_fields
from ...measure.timeline import RequestTimeline
from ..server.errors import error_response
from .body_budget import BodyBudget
from .body_relay import (
    CLIENT_GONE,
    COMPLETE,
    SEND_TIMED_OUT,
    BodyRelay,
    SendTimeout,
    drain_client,
)
from .client_head import RawHeadResponse, client_head
from .forwarded import HOP_BY_HOP, forwarded_headers
from .http1 import ResponseHead
from .limits import RelayLimits
from .upstream import UpstreamConnection, UpstreamError, UpstreamPool

__all__ = ["Proxy", "HOP_BY_HOP", "Ended"]

_log = structlog.get_logger("sidecar.proxy")


class Ended(NamedTuple):
    """How the relay of one request ended: its verdict and the response the handler returns."""

    verdict: Verdict
    response: web.StreamResponse


class _BodyRefused(Exception):
    """The request body broke a limit; ``refusal`` is what to answer instead."""

    def __init__(self, refusal: tuple[int, str, str]) -> None:
        super().__init__(refusal[2])
        self.refusal = refusal


class _BoundedBody:
    """A streamed request body held to the size and idle-time limits. Past one, sending
    it raises :class:`_BodyRefused` out of the upstream request (its body is cut off, so
    the upstream never sees a complete request) and the proxy answers with the refusal
    instead of 502."""

    __slots__ = ("_content", "_limit", "_timeout", "_scanner", "fields")

    def __init__(
        self,
        content: aiohttp.StreamReader,
        limit: int,
        timeout: float,
        scanner: RequestFieldScanner | None = None,
    ) -> None:
        self._content = content
        self._limit = limit
        self._timeout = timeout
        # An API body streamed because the body budget was spent: its fields are read in
        # flight and known once it has all been sent.
        self._scanner = scanner
        self.fields: RequestFields | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        scanner = self._scanner
        while True:
            chunk = await _read_some(self._content, self._timeout)
            seen += len(chunk)
            if seen > self._limit:
                raise _BodyRefused(_too_large(self._limit))
            if not chunk:
                if scanner is not None:
                    self.fields = scanner.close()
                return
            if scanner is not None:
                scanner.feed(chunk)
            yield chunk


def _late_fields(timeline: RequestTimeline, fields: RequestFields) -> None:
    """The fields of an API body that was streamed (the body budget was spent), read as it
    went: known once it has been sent, before the response is measured."""
    if not timeline.model and fields.model:
        timeline.model = fields.model
    timeline.request_stream = fields.stream
    timeline.request_max_tokens = fields.max_tokens


async def _read_some(content: aiohttp.StreamReader, timeout: float) -> bytes:
    try:
        async with asyncio.timeout(timeout):
            return await content.readany()
    except TimeoutError:
        raise _BodyRefused(
            (408, "request_timeout", f"the request body stalled for {timeout:g} seconds")
        ) from None


def _too_large(limit: int) -> tuple[int, str, str]:
    return 413, "request_too_large", f"the request body is larger than {limit} bytes"


class Proxy:
    """The aiohttp handler for every method and path of the proxy port."""

    def __init__(
        self,
        pool_getter: Callable[[], UpstreamPool],
        records: RecordBook,
        *,
        limits: RelayLimits = RelayLimits(),
        body_budget: BodyBudget | None = None,
    ) -> None:
        self._pool = self.pool = pool_getter
        self.records = records
        self.limits = limits
        self._budget = self.budget = (
            body_budget
            if body_budget is not None
            else BodyBudget(4 * limits.max_request_inspect_bytes)
        )
        self._clock = self.clock = records.clock

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """aiohttp's handler: the door for what the relay does not carry itself
        (sidecar/relay/data/exchange.py says what), with the same record and relay."""
        start = self._clock()
        route, model = match_route(request.path, request.method)
        refusal = self._refusal(request)
        body: bytes | _BoundedBody | None = None
        fields: RequestFields | None = None
        if refusal is None:
            try:
                body, fields = await self._request_body(request, route)
            except _BodyRefused as exc:
                refusal = exc.refusal
        received = None  # a streamed body has no overhead figure
        if refusal is None and (body is None or type(body) is bytes):
            received = self._clock()
        record = self.records.open(start, request.method, route, model, fields, request.headers)
        timeline = record.timeline
        timeline.body_received = received
        verdict = Verdict.INTERNAL  # unless the relay says otherwise
        try:
            if refusal is not None:
                verdict, response = self._refuse(timeline, *refusal)
            else:
                # Handed over in a box the relay empties once the upstream has the request,
                # so a large body is not kept alive for the whole stream by this frame.
                held, body = [body], None
                verdict, response = await self._relay(request, route, held, record)
            return response
        except asyncio.CancelledError:
            verdict = Verdict.CLIENT_DISCONNECTED
            raise
        finally:
            self.records.close(record, verdict)

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: refuse a body that would be refused anyway before the
        client sends it; otherwise invite the body, as aiohttp's default handler does."""
        if self._refusal(request) is not None:
            return await self.handle(request)
        if request.version == HttpVersion11:
            if request.headers.get("Expect", "").lower() != "100-continue":
                return error_response(
                    417, "expectation_failed", "only Expect: 100-continue is understood"
                )
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the response proper has not started
        return None

    # -- request -----------------------------------------------------------------------

    def _refusal(self, request: web.Request) -> tuple[int, str, str] | None:
        """Why the request is refused without asking the upstream, or None."""
        if request.method == "CONNECT":
            # A tunnel to wherever the client names: never what an inference server is for.
            return 405, "method_not_allowed", "CONNECT is not relayed"
        length = request.content_length
        limit = self.limits.max_request_body_bytes
        if length is not None and length > limit:
            return _too_large(limit)
        coding = request.headers.get("Transfer-Encoding")
        if coding is not None:
            if request.version < HttpVersion11:
                return 400, "bad_request", "Transfer-Encoding is not allowed in an HTTP/1.0 request"
            if coding.strip().lower() != "chunked":
                # aiohttp decodes only chunked and would relay "gzip, chunked" still compressed.
                return (
                    501,
                    "unsupported_transfer_coding",
                    "only Transfer-Encoding: chunked is supported",
                )
        return None

    def _refuse(self, timeline: RequestTimeline, status: int, kind: str, message: str) -> Ended:
        """A client error the sidecar answers itself: outcome ok with its 4xx code, as an
        upstream's 4xx is. The unread body is not wanted: the connection closes after."""
        timeline.response_started(self._clock(), status, streamed=False)
        response = error_response(status, kind, message)
        response.force_close()
        return Ended(Verdict.OK, response)

    async def _request_body(
        self, request: web.Request, route: Route
    ) -> tuple[bytes | _BoundedBody | None, RequestFields | None]:
        """The body to forward (exactly as the client sent it) and, on known API routes, the
        fields the figures are labelled with (model, stream, max tokens), else None.

        A known API route's JSON body is read whole (bounded by ``max_request_inspect_bytes``)
        so the model can label the figures: the server needs the whole JSON before it can
        start anyway, so this adds no time to first token. It is never parsed into objects
        (a parsed body costs 15-30 times its bytes): :class:`RequestFieldScanner` reads the
        few fields as the pieces arrive. Every other body is streamed. The body is never
        rewritten (not even to ask for usage): see DESIGN, "Where it sits".
        """
        if not request.body_exists:
            return None, None
        limits = self.limits
        length = request.content_length
        if (
            route is OTHER
            or request.method != "POST"
            or length is None
            or length > limits.max_request_inspect_bytes
        ):
            # Streamed. A declared length is within the limit already; a chunked body is
            # counted as it streams.
            return _BoundedBody(
                request.content, limits.max_request_body_bytes, limits.client_body_timeout
            ), None
        content = request.content
        if content.is_eof():
            # The usual case: the whole (small) body came in with the head, so it is all
            # buffered already; take it without a wait and its timer.
            body = content.read_nowait()
            return body, scan_request_fields(body)
        scanner = RequestFieldScanner()
        budget = self._budget
        if not budget.reserve(length):
            # Held bodies are at their process-wide limit: stream this one (body_budget).
            return _BoundedBody(
                content, limits.max_request_body_bytes, limits.client_body_timeout, scanner
            ), None
        try:
            parts: list[bytes] = []
            while chunk := await _read_some(content, limits.client_body_timeout):
                parts.append(chunk)
                scanner.feed(chunk)
            body = b"".join(parts)
            parts.clear()
        finally:
            # Held from here by the request alone, and only until the upstream has it: a
            # body that arrived is released from the budget, which bounds slow arrivals.
            budget.release(length)
        return body, scanner.close()

    def _upstream_headers(
        self, request: web.Request, body: bytes | _BoundedBody | None, record: RequestRecord
    ) -> CIMultiDict[str]:
        headers = forwarded_headers(
            request.headers, peer=request.remote or "", scheme=request.scheme, host=request.host,
            body_is_bytes=isinstance(body, bytes),
        )  # fmt: skip
        self.records.trace_into(record, headers)
        return headers

    # -- response ----------------------------------------------------------------------

    async def _relay(
        self,
        request: web.Request,
        route: Route,
        held: list[bytes | _BoundedBody | None],
        record: RequestRecord,
    ) -> Ended:
        body = held.pop()
        timeline = record.timeline
        target = request.raw_path
        if target != "*" and not target.startswith("/"):
            # Absolute form (GET http://host/path): only its path and query are ours to use;
            # the host it names is never where the request goes. No path means "/".
            target = request.rel_url.raw_path_qs or "/"
            if not target.startswith("/"):
                target = "/" + target
        pool = self._pool()
        try:
            conn = await pool.request(
                request.method,
                target,
                self._upstream_headers(request, body, record).items(),
                body,
                None if timeline.body_received is None else partial(self._sent, timeline),
            )
        except _BodyRefused as exc:
            return self._refuse(timeline, *exc.refusal)
        except UpstreamError as exc:
            return self._fail(timeline, exc.status, exc.kind, str(exc))
        if type(body) is _BoundedBody and body.fields is not None:
            _late_fields(timeline, body.fields)
        body = None  # sent: not kept for the stream's lifetime
        try:
            return await self._stream(request, route, conn, record)
        finally:
            # A complete keep-alive response returns the connection to the pool; anything
            # else closes it, which is how the server learns to stop generating for a gone
            # client.
            pool.release(conn)

    def _sent(self, timeline: RequestTimeline) -> None:
        timeline.upstream_sent = self._clock()

    def _fail(self, timeline: RequestTimeline, status: int, kind: str, message: str) -> Ended:
        timeline.response_started(self._clock(), status, streamed=False)
        return Ended(verdict_of(Outcome.ERROR, kind), error_response(status, kind, message))

    async def _stream(
        self,
        request: web.Request,
        route: Route,
        conn: UpstreamConnection,
        record: RequestRecord,
    ) -> Ended:
        head = cast(ResponseHead, conn.head)  # the pool answers once the head arrived
        timeline = record.timeline
        observer = self.records.observe(record, route, head.status, head.headers)
        # The upstream's head bytes, not aiohttp's re-encoding of them (see client_head).
        out_head = client_head(
            head,
            http11=request.version >= HttpVersion11,
            method=request.method,
            client_keep_alive=request.keep_alive,
        )
        response = RawHeadResponse(out_head, head.status)
        await response.prepare(request)
        timeline.client_head_sent = self._clock()
        if request.transport is None or request.transport.is_closing():
            return Ended(Verdict.CLIENT_DISCONNECTED, response)

        verdict = Verdict.UPSTREAM_STATUS if head.status >= 500 else Verdict.OK
        relay = BodyRelay(
            request.transport, conn, observer, self._clock, self.limits.send_timeout,
            out_head.chunked,
        )  # fmt: skip
        try:
            ended = await relay.run(request.writer.drain)
        finally:
            request.writer.output_size += relay.sent
            observer.close(self._clock())

        if ended == CLIENT_GONE:
            return Ended(Verdict.CLIENT_DISCONNECTED, response)
        if ended == SEND_TIMED_OUT:
            return self._stalled_reader(request, response)
        if ended is not COMPLETE:
            # Flush what was relayed, then close: a truncated stream, never a false clean end.
            response.force_close()
            if request.transport is not None:
                request.transport.close()
            return Ended(verdict_of(Outcome.ERROR, ended), response)
        try:
            await response.write_eof()  # the relay wrote the body's end (BodyRelay.end)
            # aiohttp's write_eof does not wait for the client to take the bytes: without
            # this, a client that pipelines requests and never reads gets each next one
            # forwarded while the answers pile up in memory.
            await drain_client(request.transport, request.writer.drain, self.limits.send_timeout)
        except ConnectionError:
            return Ended(Verdict.CLIENT_DISCONNECTED, response)
        except SendTimeout:
            return self._stalled_reader(request, response)
        return Ended(verdict, response)

    @staticmethod
    def _stalled_reader(request: web.Request, response: web.StreamResponse) -> Ended:
        """The client stopped reading for ``send_timeout``: let it go (its unread bytes
        with it). The upstream connection is already closed."""
        response.force_close()
        if request.transport is not None:
            # abort, not close: close() would wait to flush the unread bytes, forever.
            request.transport.abort()
        return Ended(Verdict.CLIENT_SEND_TIMEOUT, response)
