"""A request sent to the upstream from the read that completed it, before its handler runs.

aiohttp hands a parsed request to its handler two event-loop turns after the read that
completed it (the connection's task wakes, then starts a task for the handler), and each
turn first runs every other callback ready: under 200 streams of tokens that is 187 µs at
the median and 2.1 ms at p99 from the read to the handler, then 167 µs (2.0 ms at p99) of
the handler's own setup before the upstream has the request (docs/performance.md). Every
microsecond of it is added to the time to first token.

So the common request goes out from inside ``data_received``: a ``POST`` to an API route,
HTTP/1.1, whose whole body (within ``max_request_inspect_bytes``, framed by
``Content-Length``) is in, on a client connection with nothing else in flight or queued
(idle, or its last answer complete and taken by the client:
:meth:`EarlyForwarder.ready_for_next`). The body came with its head, or in later reads
that completed it before the handler claimed the request (httpx, and so the openai SDK,
writes a head and its body apart: the read that completes the body sends it; the head's
own read only remembers it, sidecar/relay/server/aiohttp_internals.py's ``EarlySlot``).
A handler that runs first claims the request with nothing sent and reads the body itself,
so it is sent once, one way or the other. It is written to an idle pooled upstream
connection at once, with the same bytes the handler would send (sidecar/relay/data/forwarded.py
builds the header fields for both); with none idle, a task starts connecting and sending
it at once. The handler, when it runs, claims the record (:meth:`EarlyForwarder.claim`)
and carries on as if it had sent the request itself: the same labels, figures, relay and
faults. With tracing on, the request's span starts here and its context goes in the
upstream's header fields, as the handler's path would put it (the ``trace`` hook).
Everything else (a body still arriving when its handler starts, chunked, ``Expect``, a
request the proxy refuses, such as the sidecar's own come back through a loop, pipelined
requests, a draining pod) waits for the handler.

A client that goes away before its handler runs never gets one (aiohttp cancels the
connection's task): :meth:`Early.abandon` then closes the upstream connection, so the
server stops generating, and the request is recorded as cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from aiohttp import web
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader
from multidict import CIMultiDict, MultiMapping

from ...base.routes import OTHER, match_route
from ..server.aiohttp_internals import early_slot
from .forwarded import forwarded_headers, peer_address
from .upstream import Sent, UpstreamConnection, UpstreamPool

__all__ = ["Early", "EarlyForwarder"]


class Early:
    """One request taken from the client's read: its body and how it is on its way. Either
    ``sent`` (written on an idle pooled connection) or ``pending`` (no connection was idle:
    a task connecting and sending it, started now rather than two turns later), or neither
    (a field that cannot be sent: the handler's path answers it). ``headers`` is the parsed
    head's header object, the same one the handler's request holds: how the handler knows
    the record is its own."""

    __slots__ = (
        "headers",
        "path",
        "start",
        "body",
        "sent",
        "pending",
        "sent_at",
        "trace",
        "_abandoned",
    )

    def __init__(self, headers: MultiMapping[str], path: str, start: float, body: bytes) -> None:
        self.headers = headers
        self.path = path
        self.start = start  # the whole request was in: the timeline starts here
        self.body = body
        self.sent: Sent | None = None
        self.pending: asyncio.Task[UpstreamConnection] | None = None
        self.sent_at: float | None = None  # when the request was written upstream
        self.trace: object = None  # what the ``trace`` hook returned (tracing on)
        self._abandoned: Callable[[Early], None] | None = None

    def mark_sent(self, now: float) -> None:
        self.sent_at = now

    @property
    def on_its_way(self) -> bool:
        """Sent, or being sent by a task: :meth:`connection` yields its answer."""
        return self.sent is not None or self.pending is not None

    async def connection(self, pool: UpstreamPool) -> UpstreamConnection:
        """The upstream connection answering this request, whichever way it went: written on
        an idle pooled connection (its head awaited here) or sent by the task connecting."""
        if self.sent is not None:
            return await pool.response(self.sent)
        return await self.pending  # type: ignore[misc,no-any-return]  # on_its_way(): set

    def abandon(self) -> None:
        """The client connection closed before a handler claimed the record: the upstream
        request is stopped (the server stops generating for nobody) and, if it was written,
        recorded."""
        if self.sent is not None:
            self.sent.conn.close()
        elif self.pending is not None:
            if not self.pending.done():
                self.pending.cancel()  # the pool closes the connection it was using
            elif not self.pending.cancelled() and self.pending.exception() is None:
                self.pending.result().close()
        if self.sent_at is not None and self._abandoned is not None:
            self._abandoned(self)


class EarlyForwarder:
    """Decides, per completed request head, whether to send it now (see the module doc).

    ``enabled`` is asked each time (False while draining, so a pod that stops takes the
    handler's path, with its refusals); ``refused`` is the entry's refusal by header fields
    (the loop check), so a request it refuses is left to it; ``on_abandoned`` records a request that reached the
    upstream but whose client went before its handler ran. ``trace`` (tracing on) starts the
    request's span before it is sent and puts its context in the upstream's header fields,
    as the handler's path does: ``trace(early, upstream_headers)``, kept as ``early.trace``
    for the handler to carry on with."""

    def __init__(
        self,
        pool: Callable[[], UpstreamPool | None],
        *,
        max_body: int,
        clock: Callable[[], float],
        enabled: Callable[[], bool],
        refused: Callable[[Mapping[str, str]], bool],
        on_abandoned: Callable[[Early], None],
        trace: Callable[[Early, CIMultiDict[str]], object] | None = None,
    ) -> None:
        self._trace = trace
        self._pool = pool
        self._max_body = max_body
        self._clock = clock
        self._enabled = enabled
        self._refused = refused
        self._on_abandoned = on_abandoned

    def __call__(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        transport: asyncio.Transport | None,
    ) -> Early | None:
        """``message``/``payload``: aiohttp's parsed head and body stream of the only request
        on an idle connection, offered from the read that completed it (the head's, or a later
        one that completed the body); None leaves the request to its handler untouched."""
        if (
            message.method != "POST"
            or message.version != HttpVersion11
            or message.upgrade
            or message.chunked
        ):
            return None
        headers = message.headers
        host = headers.get("Host")
        length = headers.get("Content-Length")
        if host is None or length is None or not length.isdigit() or "Expect" in headers:
            return None
        if "Transfer-Encoding" in headers or not 0 < int(length) <= self._max_body:
            return None  # (no body: the handler sends the client's own Content-Length: 0)
        target = message.path
        if not target.startswith("/") or not payload.is_eof() or not self._enabled():
            return None
        if self._refused(headers):
            return None  # the entry answers it (508 for a loop) and nothing goes upstream
        path = message.url.path
        route, _ = match_route(path, "POST")
        if route is OTHER:
            return None  # its body is streamed, as the handler does
        pool = self._pool()
        if pool is None:
            return None
        early = Early(headers, path, self._clock(), payload.read_nowait())
        upstream_headers = forwarded_headers(
            headers,
            # From the read that completed the request: its connection is open.
            peer=peer_address(transport.get_extra_info("peername")),  # type: ignore[union-attr]
            scheme="https" if transport.get_extra_info("sslcontext") else "http",  # type: ignore[union-attr]
            host=host,
            body_is_bytes=True,
        )
        if self._trace is not None:
            early.trace = self._trace(early, upstream_headers)
        try:
            early.sent = pool.send_now("POST", target, upstream_headers.items(), early.body)
        except ValueError:  # a field that cannot be sent: the handler's path says so
            return early
        early._abandoned = self._on_abandoned
        if early.sent is not None:
            early.sent_at = self._clock()
        else:
            on_sent = lambda: early.mark_sent(self._clock())  # noqa: E731
            early.pending = asyncio.ensure_future(
                pool.request("POST", target, upstream_headers.items(), early.body, on_sent)
            )
        return early

    @staticmethod
    def claim(request: web.BaseRequest) -> Early | None:
        """The record for ``request`` (an aiohttp request) if its connection made one,
        taken off the connection so that closing it no longer abandons the request."""
        slot = early_slot(request)
        if slot is None:
            return None
        slot.between_requests = False  # this one is in flight now
        slot.body_awaited = None  # a body still arriving is the handler's to read from now on
        early: Early | None = slot.record
        if early is None or early.headers is not request.headers:
            return None
        slot.record = None
        return early

    @staticmethod
    def ready_for_next(request: web.BaseRequest) -> None:
        """``request``'s answer is complete, the client took it and the connection stays
        open: the next request on it counts as one on an idle connection, although the
        handler is still winding down (a client that sends its next request the moment it
        has read an answer found the connection busy half the time). Never earlier: a
        client that pipelines without reading must not get its next request forwarded."""
        slot = early_slot(request)
        if slot is not None:
            slot.between_requests = True
