"""The relay: I/O only. Forwards any request to the upstream and streams the response back
chunk by chunk, handing a copy of each chunk to the observer *after* writing it.

Order of duties for every chunk: read from upstream, note the time, write to the client,
then measure. Measuring never raises into this loop (see :mod:`sidecar.measure.observe`) and the
figures flow out through one :class:`~sidecar.measure.timeline.RequestTimeline` per request,
finalised exactly once in ``finally``.

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
import struct
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from functools import partial
from typing import NamedTuple, Protocol

import aiohttp
import structlog
from aiohttp import web
from aiohttp.http import HttpVersion11
from multidict import CIMultiDict

from ...measure.concurrency import DecodeConcurrency
from ...measure.observe import ResponseObserver
from ...base.outcomes import CLIENT_DISCONNECTED, INTERNAL, UPSTREAM_STATUS, Outcome
from ...measure.timeline import RequestTimeline
from .body_budget import BodyBudget
from .client_head import RawHeadResponse, client_head
from ...measure.objectives import read_objectives
from ...measure.request_fields import RequestFields, RequestFieldScanner, scan_request_fields
from ...base.routes import OTHER, Route, match_route
from .early import Early, EarlyForwarder
from ..server.errors import error_response
from .forwarded import HOP_BY_HOP, forwarded_headers
from .token_lane import AVAILABLE as _LANES, lane_for
from .upstream import UpstreamConnection, UpstreamError, UpstreamPool

try:  # the kernel's unsent-bytes count of a socket (Linux, also macOS as TIOCOUTQ)
    import fcntl
    from termios import TIOCOUTQ as _SIOCOUTQ
except ImportError:  # pragma: no cover - Windows: progress is seen in the transport buffer only
    fcntl = None  # type: ignore[assignment]
    _SIOCOUTQ = None

__all__ = ["Proxy", "HOP_BY_HOP", "Recorder", "Ended", "CLIENT_BODY_TIMEOUT"]

_log = structlog.get_logger("sidecar.proxy")

CLIENT_BODY_TIMEOUT = 60.0
"""Idle seconds allowed between two reads of a request body from the client (nginx's
``client_body_timeout`` and its default); past it the request gets 408."""

SEND_TIMEOUT = 60.0
"""Seconds a client may take no bytes at all of a response that waits for it (nginx's
``send_timeout`` and its default). Past it the upstream request is closed, so the server
stops generating for a reader that stopped, and the client connection is closed. Any
progress restarts the time: a slow but live reader is never cut off."""


class _SendTimeout(Exception):
    """The client took nothing for ``send_timeout`` seconds."""


async def drain_client(request: web.Request, timeout: float) -> None:
    """Wait until the client has taken the response bytes queued for it (down to the
    transport's low-water mark), for as long as it makes progress.

    Raises :class:`_SendTimeout` after ``timeout`` seconds in which the queue did not
    shrink, ``ConnectionError`` when the client is gone. aiohttp's ``drain`` itself waits
    forever, and cancelling it would cancel the writer's shared waiter, so it is only
    cancelled when the connection is let go anyway.
    """
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client is gone")
    if not transport.get_write_buffer_size():
        return  # the usual case: all handed to the kernel, so writing is not paused either
    drained = asyncio.ensure_future(request.writer.drain())
    while True:
        queued = _unsent(transport)
        done, _ = await asyncio.wait((drained,), timeout=timeout)  # never cancels it
        if done:
            return drained.result()
        if transport.is_closing():
            raise ConnectionResetError("the client is gone")
        if _unsent(transport) >= queued:
            drained.cancel()
            raise _SendTimeout()


def _unsent(transport: asyncio.Transport) -> int:
    """Bytes not yet taken by the client: the transport's buffer plus the kernel's send
    queue (Linux ``SIOCOUTQ``). The kernel queue is what shows a slow reader's progress: the
    transport's buffer only shrinks once a third of the socket buffer is free, which a
    reader taking a few KiB a second may not reach in minutes."""
    queued = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None and _SIOCOUTQ is not None:
        try:
            queued += struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            pass
    return queued

Recorder = Callable[[RequestTimeline, str], None]
"""Called once per finished request with the timeline and its bounded model label."""


class RequestTracer(Protocol):
    """What the proxy needs from tracing (see :mod:`sidecar.export.tracing`)."""

    def start(self, headers: Mapping[str, str], timeline: RequestTimeline) -> None:
        """Begin the request's span in the client's trace; set ``timeline.trace``/``trace_id``."""

    def inject(self, timeline: RequestTimeline, headers: MutableMapping[str, str]) -> None:
        """Add trace-context headers for the upstream request."""


class Ended(NamedTuple):
    """How the relay of one request ended: its outcome, the error_type that says why (None
    when ok) and the response the handler returns."""

    outcome: Outcome
    error_type: str | None
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
        self, content: aiohttp.StreamReader, limit: int, timeout: float, scanner: RequestFieldScanner | None = None
    ) -> None:
        self._content = content
        self._limit = limit
        self._timeout = timeout
        # An API body streamed because the body budget was spent: its fields are read in
        # flight and known once it has all been sent.
        self._scanner = scanner
        self.fields: RequestFields | None = None

    async def __aiter__(self):
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
        *,
        model_label: Callable[[str | None], str],
        on_start: Callable[[str, str], None] | None = None,
        on_end: Callable[[str, str], None] | None = None,
        recorders: Iterable[Recorder] = (),
        max_request_inspect_bytes: int = 32 << 20,
        max_request_body_bytes: int = 64 << 20,
        body_budget: BodyBudget | None = None,
        client_body_timeout: float = CLIENT_BODY_TIMEOUT,
        send_timeout: float = SEND_TIMEOUT,
        max_response_inspect_bytes: int = 16 << 20,
        max_line_bytes: int | None = None,
        tracer: RequestTracer | None = None,
        tenant_label: Callable[[Mapping[str, str]], str] | None = None,
        decode_tracker: Callable[[str], DecodeConcurrency] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._tenant_label = tenant_label
        self._decode_tracker = decode_tracker
        self._pool = pool_getter
        self._model_label = model_label
        self._on_start = on_start
        self._on_end = on_end
        self._recorders = tuple(recorders)
        self._max_inspect = max_request_inspect_bytes
        self._max_body = max_request_body_bytes
        self._budget = body_budget if body_budget is not None else BodyBudget(4 * max_request_inspect_bytes)
        self.client_body_timeout = client_body_timeout
        self.send_timeout = send_timeout
        self._max_json = max_response_inspect_bytes
        self._max_line = max_line_bytes
        self._tracer = tracer
        self._clock = clock
        self.in_flight = 0

    def early_forwarder(self, enabled: Callable[[], bool]) -> EarlyForwarder:
        """What the proxy port's connections call with each request that completes on an
        idle connection (sidecar/relay/data/early.py); ``enabled``: False while draining."""
        return EarlyForwarder(
            self._pool,
            max_body=min(self._max_inspect, self._max_body),
            clock=self._clock,
            enabled=lambda: self._tracer is None and enabled(),  # tracing injects per request
            on_abandoned=self._abandoned,
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        early = EarlyForwarder.claim(request)
        start = self._clock() if early is None else early.start
        route, model = match_route(request.path, request.method)
        refusal = None if early is not None else self._refusal(request)
        body, fields = None, None
        if early is not None:  # sent (or at least read) from the read that completed it
            body, fields = early.body, scan_request_fields(early.body)
        elif refusal is None:
            try:
                body, fields = await self._request_body(request, route)
            except _BodyRefused as exc:
                refusal = exc.refusal
        if fields is not None:
            model = model or fields.model
        timeline = RequestTimeline(start, request.method, route.template, model or "")
        if early is not None:
            timeline.body_received = early.start
        elif refusal is None and (body is None or type(body) is bytes):
            timeline.body_received = self._clock()  # a streamed body has no overhead figure
        if fields is not None:
            timeline.request_stream = fields.stream
            timeline.request_max_tokens = fields.max_tokens
        label = self._model_label(model)
        if self._decode_tracker is not None:  # streams decoding per model label (#24)
            timeline.decode = self._decode_tracker(label)
        if self._tenant_label is not None:  # read only: the header is forwarded as sent
            try:
                timeline.tenant = self._tenant_label(request.headers)
            except Exception:
                _log.exception("tenant_label_failed")
        try:  # x-slo-ttft-ms / x-slo-tpot-ms, read only: forwarded as sent
            timeline.objectives = read_objectives(request.headers)
        except Exception:
            _log.exception("objectives_failed")
        self.in_flight += 1
        if self._on_start is not None:
            self._safely(self._on_start, label, route.template)
        tenant_held = self._hold_tenant(timeline.tenant)
        if self._tracer is not None:
            self._safely(self._tracer.start, request.headers, timeline)
        outcome, error_type = Outcome.ERROR, INTERNAL
        try:
            if refusal is not None:
                outcome, error_type, response = self._refuse(timeline, *refusal)
            else:
                # Handed over in a box the relay empties once the upstream has the request,
                # so a large body is not kept alive for the whole stream by this frame.
                held, body = [body], None
                outcome, error_type, response = await self._relay(request, route, held, timeline, early)
            return response
        except asyncio.CancelledError:
            outcome, error_type = Outcome.CANCELLED, CLIENT_DISCONNECTED
            raise
        finally:
            self.in_flight -= 1
            if self._on_end is not None:  # the in-flight gauge ends under the label it began with
                self._safely(self._on_end, label, route.template)
            if tenant_held is not None:
                self._safely(self._tenant_label.release, tenant_held)
            if timeline.finish(outcome, self._clock(), error_type):
                model = model or timeline.model or None  # a streamed body's model comes late
                label = self._settled(model, label, request.headers, timeline)
                for recorder in self._recorders:
                    self._safely(recorder, timeline, label)

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: refuse a body that would be refused anyway before the
        client sends it; otherwise invite the body, as aiohttp's default handler does."""
        if self._refusal(request) is not None:
            return await self.handle(request)
        if request.version == HttpVersion11:
            if request.headers.get("Expect", "").lower() != "100-continue":
                return error_response(417, "expectation_failed", "only Expect: 100-continue is understood")
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
        if length is not None and length > self._max_body:
            return _too_large(self._max_body)
        coding = request.headers.get("Transfer-Encoding")
        if coding is not None:
            if request.version < HttpVersion11:
                return 400, "bad_request", "Transfer-Encoding is not allowed in an HTTP/1.0 request"
            if coding.strip().lower() != "chunked":
                # aiohttp decodes only chunked and would relay "gzip, chunked" still compressed.
                return 501, "unsupported_transfer_coding", "only Transfer-Encoding: chunked is supported"
        return None

    def _refuse(self, timeline: RequestTimeline, status: int, kind: str, message: str) -> Ended:
        """A client error the sidecar answers itself: outcome ok with its 4xx code, as an
        upstream's 4xx is. The unread body is not wanted: the connection closes after."""
        timeline.response_started(self._clock(), status, streamed=False)
        response = error_response(status, kind, message)
        response.force_close()
        return Ended(Outcome.OK, None, response)

    async def _request_body(self, request: web.Request, route: Route) -> tuple[object, RequestFields | None]:
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
        length = request.content_length
        if route is OTHER or request.method != "POST" or length is None or length > self._max_inspect:
            # Streamed. A declared length is within the limit already; a chunked body is
            # counted as it streams.
            return _BoundedBody(request.content, self._max_body, self.client_body_timeout), None
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
            return _BoundedBody(content, self._max_body, self.client_body_timeout, scanner), None
        try:
            parts: list[bytes] = []
            while chunk := await _read_some(content, self.client_body_timeout):
                parts.append(chunk)
                scanner.feed(chunk)
            body = b"".join(parts)
            parts.clear()
        finally:
            # Held from here by the request alone, and only until the upstream has it: a
            # body that arrived is released from the budget, which bounds slow arrivals.
            budget.release(length)
        return body, scanner.close()

    def _upstream_headers(self, request: web.Request, body, timeline: RequestTimeline) -> CIMultiDict[str]:
        headers = forwarded_headers(
            request.headers, peer=request.remote or "", scheme=request.scheme, host=request.host,
            body_is_bytes=isinstance(body, bytes),
        )  # fmt: skip
        if self._tracer is not None and timeline.trace is not None:
            self._safely(self._tracer.inject, timeline, headers)
        return headers

    # -- response ----------------------------------------------------------------------

    async def _relay(
        self, request: web.Request, route: Route, held: list, timeline: RequestTimeline, early: Early | None = None
    ) -> Ended:
        body = held.pop()
        target = request.raw_path
        if target != "*" and not target.startswith("/"):
            # Absolute form (GET http://host/path): only its path and query are ours to use;
            # the host it names is never where the request goes. No path means "/".
            target = request.rel_url.raw_path_qs or "/"
            if not target.startswith("/"):
                target = "/" + target
        pool = self._pool()
        try:
            if early is not None and early.sent is not None:
                timeline.upstream_sent = early.sent_at
                conn = await pool.response(early.sent)
            elif early is not None and early.pending is not None:
                try:
                    conn = await early.pending
                finally:
                    timeline.upstream_sent = early.sent_at
            else:
                conn = await pool.request(
                    request.method,
                    target,
                    self._upstream_headers(request, body, timeline).items(),
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
            return await self._stream(request, route, conn, timeline)
        finally:
            # A complete keep-alive response returns the connection to the pool; anything
            # else closes it, which is how the server learns to stop generating for a gone
            # client.
            pool.release(conn)

    def _abandoned(self, early: Early) -> None:
        """A request sent from its client's read whose client went before the handler ran
        (sidecar/relay/data/early.py): recorded as the handler would record a client that went
        while waiting for the response head."""
        route, model = match_route(early.path, "POST")
        fields = scan_request_fields(early.body)
        model = model or fields.model
        timeline = RequestTimeline(early.start, "POST", route.template, model or "")
        timeline.body_received, timeline.upstream_sent = early.start, early.sent_at
        timeline.request_stream, timeline.request_max_tokens = fields.stream, fields.max_tokens
        label = self._model_label(model)
        if self._tenant_label is not None:
            try:
                timeline.tenant = self._tenant_label(early.headers)
            except Exception:
                _log.exception("tenant_label_failed")
        try:
            timeline.objectives = read_objectives(early.headers)
        except Exception:
            _log.exception("objectives_failed")
        if timeline.finish(Outcome.CANCELLED, self._clock(), CLIENT_DISCONNECTED):
            label = self._settled(model, label, early.headers, timeline)
            for recorder in self._recorders:
                self._safely(recorder, timeline, label)

    def _sent(self, timeline: RequestTimeline) -> None:
        timeline.upstream_sent = self._clock()

    def _fail(self, timeline: RequestTimeline, status: int, kind: str, message: str) -> Ended:
        timeline.response_started(self._clock(), status, streamed=False)
        return Ended(Outcome.ERROR, kind, error_response(status, kind, message))

    async def _stream(self, request, route, conn: UpstreamConnection, timeline) -> Ended:
        now = self._clock()
        head = conn.head
        upstream_headers = CIMultiDict(head.headers)
        observer = ResponseObserver(
            route,
            timeline,
            upstream_headers.get("Content-Type", ""),
            upstream_headers.get("Content-Encoding", ""),
            max_json_bytes=self._max_json,
            max_line_bytes=self._max_line,
            headers=upstream_headers,
        )
        timeline.response_started(now, head.status, observer.streaming)
        # The upstream's head bytes, not aiohttp's re-encoding of them (see client_head).
        out_head = client_head(
            head, http11=request.version >= HttpVersion11, method=request.method, client_keep_alive=request.keep_alive
        )
        response = RawHeadResponse(out_head, head.status)
        await response.prepare(request)
        timeline.client_head_sent = self._clock()
        if request.transport is None or request.transport.is_closing():
            return Ended(Outcome.CANCELLED, CLIENT_DISCONNECTED, response)

        outcome = Outcome.ERROR if head.status >= 500 else Outcome.OK
        error_type = UPSTREAM_STATUS if head.status >= 500 else None
        relay = _Relay(request, conn, observer, self._clock, self.send_timeout, out_head.chunked)
        try:
            ended = await relay.run()
        finally:
            request.writer.output_size += relay.sent
            observer.close(self._clock())

        if ended == _CLIENT_GONE:
            return Ended(Outcome.CANCELLED, CLIENT_DISCONNECTED, response)
        if ended == _SEND_TIMED_OUT:
            return self._stalled_reader(request, response)
        if ended is not _COMPLETE:
            # Flush what was relayed, then close: a truncated stream, never a false clean end.
            response.force_close()
            if request.transport is not None:
                request.transport.close()
            return Ended(Outcome.ERROR, ended, response)
        try:
            await response.finish(request)
            # aiohttp's write_eof does not wait for the client to take the bytes: without
            # this, a client that pipelines requests and never reads gets each next one
            # forwarded while the answers pile up in memory.
            await drain_client(request, self.send_timeout)
        except ConnectionError:
            return Ended(Outcome.CANCELLED, CLIENT_DISCONNECTED, response)
        except _SendTimeout:
            return self._stalled_reader(request, response)
        if response.keep_alive and request.content.is_eof():
            # Answered, taken by the client, and the connection stays open: the client's next
            # request may go upstream from the read that completes it (sidecar/relay/data/early.py),
            # though aiohttp has yet to wind this one down.
            EarlyForwarder.ready_for_next(request)
        return Ended(outcome, error_type, response)

    @staticmethod
    def _stalled_reader(request: web.Request, response: web.StreamResponse) -> Ended:
        """The client stopped reading for ``send_timeout``: let it go (its unread bytes
        with it). The upstream connection is already closed."""
        response.force_close()
        if request.transport is not None:
            # abort, not close: close() would wait to flush the unread bytes, forever.
            request.transport.abort()
        return Ended(Outcome.CANCELLED, _SEND_TIMED_OUT, response)

    def _settled(self, model: str | None, label: str, headers, timeline: RequestTimeline) -> str:
        """The labels a finished request is recorded with: a model or tenant the upstream
        answered (not 4xx) may earn its own label now (sidecar/base/labels.py); a 4xx never does."""
        try:
            settle = getattr(self._model_label, "settle", None)
            if settle is not None:
                label = settle(model, timeline.status)
            settle = getattr(self._tenant_label, "settle", None)
            if settle is not None:
                timeline.tenant = settle(headers, timeline.status)
        except Exception:  # telemetry never breaks the relay
            _log.exception("label_settle_failed")
        return label

    def _hold_tenant(self, tenant: str | None) -> str | None:
        """The tenant label a request starts with is held until it ends, like its model label
        (sidecar/base/labels.py, ``hold``): an idle expiry mid-stream would drop the tenant's
        series under a running request. Returns what to release."""
        hold = getattr(self._tenant_label, "hold", None)
        if hold is None or not tenant:
            return None
        self._safely(hold, tenant)
        return tenant

    @staticmethod
    def _safely(fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # telemetry never breaks the relay
            _log.exception("recorder_failed", recorder=getattr(fn, "__qualname__", repr(fn)))


_COMPLETE = "complete"
_CLIENT_GONE = CLIENT_DISCONNECTED  # a relay that ended this way
_SEND_TIMED_OUT = "client_send_timeout"
_HIGH_WATER = 64 << 10
"""Bytes queued for the client beyond which the upstream is paused (aiohttp's write limit)."""
_PROGRESS_CHECK_SECONDS = 1.0
"""How often, at most, a relay asks the kernel whether its client took anything."""


class _Relay:
    """The body sink of one response (:class:`~sidecar.relay.data.upstream.BodySink`).

    Called from the upstream connection's ``data_received`` for each piece: note the time,
    write the piece to the client (re-framed as one HTTP chunk when the client's response
    is chunked), then hand the same piece to the observer. No task switch per token: the
    handler task (:meth:`run`) only wakes for the end, an error, or back-pressure, when the
    client's socket buffer passed ``_HIGH_WATER`` and the upstream was paused until the
    client drained it.
    """

    __slots__ = (
        "_request", "_transport", "_conn", "_observer", "_clock", "_chunked", "_waiter", "_send_timeout",
        "_check_at", "_taken", "_taken_at", "_lane", "_linkable", "ended", "paused", "sent",
    )  # fmt: skip

    def __init__(
        self,
        request: web.Request,
        conn: UpstreamConnection,
        observer: ResponseObserver,
        clock,
        send_timeout: float = SEND_TIMEOUT,
        chunked: bool | None = None,
    ) -> None:
        self._request = request
        self._transport = request.transport
        self._conn = conn
        self._observer = observer
        self._clock = clock
        # Whether the client's body goes out in chunks: the head the proxy wrote says
        # (RawHeadResponse); None reads aiohttp's writer, for a head aiohttp wrote.
        self._chunked = request.writer.chunked if chunked is None else chunked
        self._waiter: asyncio.Future | None = None
        self._send_timeout = send_timeout
        self.ended: str | None = None
        self.paused = False
        self.sent = 0
        # The client's progress, as last seen (see _reader_alive).
        start = clock()
        self._check_at = start + _PROGRESS_CHECK_SECONDS
        self._taken, self._taken_at = 0, start
        # The token lane standing for the observer's armed template (token_lane.py): only a
        # chunked client's relay passes reads on as they came, which is all a lane does.
        self._lane = None
        self._linkable = _LANES and self._chunked and observer.templated

    def body(self, piece: bytes) -> None:
        now = self._clock()
        if self.ended is not None:
            return
        if piece and not self.write(piece, now):
            return
        self._observer.feed(piece, now)
        if self._linkable:
            self._link()

    def chunk(self, frame: bytes, piece: bytes) -> None:
        """A read that was one whole, well-formed chunk: when the client's response is
        chunked too, the upstream's frame is already the right bytes, so it goes out as
        received: no re-framing copy."""
        now = self._clock()
        if self.ended is not None:
            return
        if not self._write_framed(frame if self._chunked else piece, now):
            return
        self._observer.feed(piece, now)
        if self._linkable:
            self._link()

    def _link(self) -> None:
        """After a read the Python path took: open a token lane on the connection for the
        template the dialect has armed now (token_lane.py), when the relay and the parser
        are where a lane may take the next read; the same lane again while the template
        is the same one. A measuring bug never reaches the relay: any error here ends
        lanes for this response (``_lane_failed``)."""
        conn = self._conn
        if self.ended is not None or self.paused or not conn.between_chunks:
            return
        if self._transport.get_write_buffer_size():
            return  # a lane would leave the next read to Python too: a slow reader's stays shut
        try:
            steady = self._observer.steady()
            if steady is None:
                return
            lane = self._lane
            if lane is None or lane.memo is not steady[0]:
                if lane is not None and lane.off:
                    self._lane_failed()
                    return
                lane = lane_for(
                    steady, clock=self._clock, transport=self._transport, timeline=self._observer.timeline,
                    on_sent=self._lane_sent, high_water=_HIGH_WATER,
                )  # fmt: skip
                self._lane = lane
                if lane is None:
                    return
            if lane.open(self._check_at, self._observer.timeline.last_token):
                conn.set_lane(lane)
            elif lane.off:
                self._lane_failed()
        except Exception:
            _log.exception("token_lane_link_failed", route=self._observer.timeline.route)
            self._lane_failed()

    def _lane_sent(self, sent: int) -> None:
        """Bytes a token lane wrote to the client, handed over with its notes."""
        self.sent += sent

    def _lane_failed(self) -> None:
        """A lane switched itself off on an error in measuring, or could not be made (a bug:
        what it reads is pinned by tests): the Python path takes every read from here on,
        and the response counts one parse error, as a dialect that failed does. The bytes
        went through regardless."""
        _log.error("token_lane_failed", route=self._observer.timeline.route)
        self._observer.timeline.parse_errors += 1
        self._lane = None
        self._linkable = False
        self._conn.set_lane(None)

    def chunks(self, frames: bytes, pieces: list[bytes]) -> None:
        """A read that was several whole, well-formed chunks (a busy upstream's reads
        coalesce): one write to the client, not one per piece, then each piece measured
        as if it had come alone, all at the time of the read."""
        now = self._clock()
        if self.ended is not None:
            return
        if not self._write_framed(frames if self._chunked else b"".join(pieces), now):
            return
        feed = self._observer.feed
        for piece in pieces:
            feed(piece, now)
        if self._linkable:
            self._link()

    def several(self, pieces: list[bytes]) -> None:
        """Several pieces of one read that were not all whole chunks (a chunk split across
        reads, a Content-Length body after its head): one write to the client as well.

        One write per read is not only cheaper: uvloop retries its whole buffered list on
        every write once a slow client's buffer is past the high-water mark, so a read of
        thousands of tiny events written one by one cost quadratic time and held the event
        loop for over a second (#23, finding 4)."""
        now = self._clock()
        if self.ended is not None:
            return
        if self._chunked:
            data = b"".join([b"%x\r\n%b\r\n" % (len(p), p) for p in pieces if p])
        else:
            data = b"".join(pieces)
        if data and not self._write_framed(data, now):
            return
        feed = self._observer.feed
        for piece in pieces:
            feed(piece, now)
        if self._linkable:
            self._link()

    def write(self, data: bytes, now: float) -> bool:
        """Write to the client; False (and the relay ends) when the client is gone."""
        return self._write_framed(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data, now)

    def _write_framed(self, data: bytes, now: float) -> bool:
        """The one write to the client and the flow check after it (a token lane takes a
        read only when this check could not fire: sidecar/relay/data/token_lane.py)."""
        transport = self._transport
        if transport.is_closing():
            self._gone()
            return False
        transport.write(data)
        self.sent += len(data)
        if (not self.paused and transport.get_write_buffer_size() > _HIGH_WATER) or now >= self._check_at:
            return self._flow(transport, now)
        return True

    def _gone(self) -> None:
        """The client's transport is closing: the relay ends."""
        self._conn.close()  # stop the server generating for nobody
        self._end(_CLIENT_GONE)

    def _flow(self, transport, now: float) -> bool:
        """After a write that left the client's buffer past ``_HIGH_WATER`` (the upstream is
        paused until the client drains it) or came when the client's progress is due a
        check; False when that check ended the relay."""
        if not self.paused and transport.get_write_buffer_size() > _HIGH_WATER:
            self.paused = True
            self._conn.pause_reading()
            self._wake()
            return True
        return self._reader_alive(now)

    def _reader_alive(self, now: float) -> bool:
        """Whether the client took any bytes in the last ``send_timeout`` seconds; checked
        at most once a second while the response is being written.

        The transport's buffer alone cannot tell: the kernel's send buffer grows to MiBs for
        a connection and absorbs a paced token stream for minutes before a write ever
        queues, so a reader that stopped held the server's generation slot for 126 s with
        a 60 s ``send_timeout`` (#23, finding 7). What the client has taken is what was
        written minus what the kernel still holds unacknowledged (``SIOCOUTQ``). A slow
        reader that takes anything at all keeps its stream."""
        self._check_at = now + _PROGRESS_CHECK_SECONDS
        unsent = _unsent(self._transport)
        taken = self.sent - unsent
        if taken > self._taken or not unsent:
            self._taken, self._taken_at = taken, now
            return True
        if now - self._taken_at < self._send_timeout:
            return True
        self._conn.close()  # the server stops generating for a reader that stopped
        self._end(_SEND_TIMED_OUT)
        return False

    def end(self, error: str | None) -> None:
        self._end(_COMPLETE if error is None else error)

    def _end(self, ended: str) -> None:
        if self.ended is None:
            self.ended = ended
            if self._lane is not None:
                self._conn.set_lane(None)  # its notes are flushed as run() returns
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def run(self) -> str:
        """Relay until the body ends; returns how: ``_COMPLETE``, ``_CLIENT_GONE`` or the
        upstream error_type."""
        try:
            return await self._run()
        finally:
            # The lane refers to this relay: dropped here, so a finished relay is freed at
            # once, not by the cyclic collector much later (with its request and timeline).
            lane, self._lane = self._lane, None
            if lane is not None:
                self._conn.set_lane(None)
                lane.flush()  # what the lane noted, before anyone reads the timeline
                if lane.off:
                    self._lane_failed()

    async def _run(self) -> str:
        self._conn.push(self)
        loop = asyncio.get_running_loop()
        while self.ended is None:
            if self.paused:
                try:
                    await drain_client(self._request, self._send_timeout)
                except ConnectionError:
                    self._conn.close()
                    self._end(_CLIENT_GONE)
                    break
                except _SendTimeout:
                    self._conn.close()  # the server stops generating for a reader that stopped
                    self._end(_SEND_TIMED_OUT)
                    break
                self.paused = False
                self._conn.resume_reading()
                continue
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.ended
