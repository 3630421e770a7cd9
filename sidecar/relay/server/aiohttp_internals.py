"""Every use of aiohttp's private names, in one place.

aiohttp has no public hook for some things the sidecar needs, so it leans on internals:

* answering a request its HTTP parser refuses (414/431/400) with the proxy's JSON body and
  capping connections: the error path runs no middleware, so :class:`GuardedRequestHandler`
  overrides the connection handler's ``connection_made``, ``data_received``,
  ``eof_received``, ``connection_lost`` and ``handle_error``
  (``aiohttp.web_protocol.RequestHandler``, whose ``_manager`` and ``_loop`` it reads; what
  to answer is :mod:`sidecar.relay.server.client_guard`'s), :class:`HandlerServer` builds it, and
  :class:`RebuildingRunner` rebuilds the server ``AppRunner._make_server`` made, with the
  same ``web.Server._kwargs``;
* writing the upstream's own head bytes: :class:`OwnHeadResponse` replaces
  ``StreamResponse._prepare_headers`` and ``_write_headers`` (which ``prepare()`` calls in
  that order) and reads ``_req`` / sets ``_keep_alive``;
* the whole-head budget (sidecar/relay/server/head_budget.py): the handler's ``_request_count``,
  ``_messages`` and ``_upgraded``, read right after ``RequestHandler.data_received``;
* a request sent before its handler runs (sidecar/relay/data/early.py): the handler's
  ``_waiter`` (done: its task is about to take the next request), ``_messages``,
  ``_close`` and ``_force_close``, read right after ``RequestHandler.data_received`` by
  :func:`only_request_waiting` (a head) and :func:`body_still_wanted` (the body of a head
  that came in an earlier read); the early path's own state is one :class:`EarlySlot` per
  guarded connection, reached through :func:`early_slot`
  (pinned over real sockets by ``tests/integration/relay/server/test_early_forward.py``,
  which fails if the hook stops being offered requests);
* shortening the drain's last wait: ``BaseRunner._shutdown_timeout``
  (:func:`set_shutdown_timeout`);
* every request to one handler without the router or middlewares:
  :class:`OneHandlerApplication` replaces ``Application._handle`` and sets the request's
  ``_match_info``.

Checked against aiohttp 3.14.5 (the version ``make install`` resolves; pyproject pins
``<3.15`` for this reason). ``tests/unit/test_aiohttp_internals.py`` pins each name used
here on the installed aiohttp, so an upgrade that renames one fails there by name rather
than as a wrong byte on the wire; the behaviour is pinned over real sockets by
``tests/unit/test_client_head.py``, ``tests/integration/relay/server/test_hostile*.py`` and the
drain tests.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from aiohttp import hdrs, web
from aiohttp.http import RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_urldispatcher import ResourceRoute, UrlMappingMatchInfo

from .client_guard import ConnectionGuard, EarlyHook
from .head_budget import HeadBudget, head_size

if TYPE_CHECKING:
    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
    ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]

__all__ = [
    "CHECKED_AIOHTTP",
    "EarlySlot",
    "GuardedRequestHandler",
    "GuardedServer",
    "HandlerServer",
    "OwnHeadResponse",
    "RebuildingRunner",
    "RequestHandler",
    "body_still_wanted",
    "early_slot",
    "handler_loop",
    "handler_server",
    "last_message",
    "only_request_waiting",
    "open_connections",
    "request_count",
    "set_shutdown_timeout",
    "upgraded",
]

CHECKED_AIOHTTP = "3.14.5"


def handler_server(handler: RequestHandler) -> web.Server:
    """The server (connection manager) a connection handler belongs to."""
    return handler._manager  # type: ignore[return-value]  # private: typed Server | None, set once connected


def handler_loop(handler: RequestHandler) -> asyncio.AbstractEventLoop:
    return handler._loop


def request_count(handler: RequestHandler) -> int:
    """Request heads the handler's parser has completed on this connection."""
    return handler._request_count


def last_message(handler: RequestHandler) -> tuple[Any, Any]:
    """The request head the parser completed last and its body stream (``is_eof()`` once
    the body is read), or (None, None)."""
    return handler._messages[-1] if handler._messages else (None, None)


def upgraded(handler: RequestHandler) -> bool:
    """True once the connection was upgraded (its bytes no longer pass the HTTP parser)."""
    return handler._upgraded


def body_still_wanted(handler: RequestHandler, message: Any) -> bool:
    """True if ``message``, whose head completed in an earlier read, may still be offered now
    that its body is in: the connection is not closing and nothing but it is queued (the
    connection's task may have taken it off the queue, but no handler has claimed it: the
    early slot says that, :class:`EarlySlot`)."""
    if handler._force_close or handler._close:
        return False
    messages = handler._messages
    return not messages or (len(messages) == 1 and messages[0][0] is message)


def only_request_waiting(handler: RequestHandler, between_requests: bool) -> tuple[Any, Any] | None:
    """(head, body stream) of the one request the handler's task is idle waiting for, or
    None: nothing in flight or queued besides it, the connection not closing. Idle: its
    waiter was just woken; or it has not started yet and this is the connection's first
    request; or the proxy said the last answer is complete and taken (``between_requests``)."""
    waiter = handler._waiter
    if waiter is not None:
        idle = waiter.done()
    else:  # not started yet, or still winding down an answer the client has taken
        idle = handler._request_count == 1 or between_requests
    if not idle or len(handler._messages) != 1 or handler._force_close or handler._close:
        return None
    return handler._messages[0]


class EarlySlot:
    """The early path's state on one guarded connection (sidecar/relay/data/early.py): the
    request sent before its handler ran (``record``), until the handler claims it; whether
    the connection's last answer is complete and taken (``between_requests``); and the
    (head, body stream) of the only request waiting whose head came without all its body
    (``body_awaited``), offered once a later read completes the body, unless its handler
    claimed it first (the claim clears it: the handler then reads the body itself)."""

    __slots__ = ("record", "between_requests", "body_awaited")

    def __init__(self) -> None:
        self.record: Any = None
        self.between_requests = False
        self.body_awaited: tuple[Any, Any] | None = None


def early_slot(request: web.BaseRequest) -> EarlySlot | None:
    """The early path's slot of the connection ``request`` came on; None on a connection
    that is not guarded (one served by a plain runner has no early path)."""
    protocol = request.protocol
    return protocol.early_slot if isinstance(protocol, GuardedRequestHandler) else None


def open_connections(server: web.Server) -> int:
    """Connections the server holds now (the one being opened not yet among them)."""
    return len(server._connections)


class HandlerServer(web.Server):
    """``web.Server`` that builds its connection handlers from ``handler_class``."""

    handler_class: type[RequestHandler] = RequestHandler

    def __call__(self) -> RequestHandler:
        return self.handler_class(self, loop=self._loop, **self._kwargs)


class RebuildingRunner(web.AppRunner):
    """``web.AppRunner`` whose server is rebuilt by :meth:`rebuild_server` from the one
    aiohttp made and the keyword arguments it was made with (a copy, free to change)."""

    async def _make_server(self) -> web.Server:
        built = await super()._make_server()
        return self.rebuild_server(built, dict(built._kwargs))

    def rebuild_server(self, built: web.Server, kwargs: dict[str, Any]) -> web.Server:
        return built


def set_shutdown_timeout(runner: web.BaseRunner, seconds: float) -> None:
    """How long ``runner.cleanup()`` waits for handlers still running."""
    if not hasattr(runner, "_shutdown_timeout"):  # a renamed attribute must not pass silently
        raise AttributeError(
            "aiohttp BaseRunner has no _shutdown_timeout: recheck aiohttp_internals"
        )
    runner._shutdown_timeout = seconds


class OwnHeadResponse(web.StreamResponse):
    """``StreamResponse`` whose head is the bytes :meth:`head_bytes` gives, none of aiohttp's
    (no Date, Server, Content-Type, chunking or Connection added)."""

    def __init__(self, status: int, keep_alive: bool) -> None:
        super().__init__(status=status)
        self._keep_alive = keep_alive

    @property
    def closing(self) -> bool:
        """True once ``force_close()`` was called (an ``on_response_prepare`` hook may)."""
        return not self._keep_alive

    def head_bytes(self) -> bytes:  # pragma: no cover - subclasses say what the head is
        raise NotImplementedError

    async def _prepare_headers(self) -> None:
        pass

    async def _write_headers(self) -> None:
        request = self._req
        assert request is not None and request.transport is not None
        data = self.head_bytes()
        request.transport.write(data)
        request.writer.output_size += len(data)


with warnings.catch_warnings():  # aiohttp discourages subclassing (internals it may change):
    warnings.simplefilter("ignore", DeprecationWarning)  # the ones used are pinned (docstring)

    class OneHandlerApplication(web.Application):
        """An ``Application`` that hands every request to one handler, with no router lookup
        and no middleware chain: the proxy port relays every target, so aiohttp's route walk
        (a dictionary lookup per path segment, then the pattern) and one coroutine layer per
        middleware, plus the one aiohttp adds to fix ``current_app``, would be a request's
        cost with nothing to decide.

        ``entry(request)`` answers every request, ``expect(request)`` an ``Expect`` header first
        (as aiohttp's ``_handle`` does). Every request shares one frozen match info holding
        this app, which is what ``request.app`` and the ``on_response_prepare`` hooks read
        (``_handle``, ``_match_info``; pinned in tests/unit/test_aiohttp_internals.py).
        """

        def __init__(self, entry: Handler, expect: ExpectHandler, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._entry = entry
            self._expect = expect
            match = UrlMappingMatchInfo(
                {},
                # A route of no resource: only this frozen match info holds it.
                ResourceRoute(hdrs.METH_ANY, entry, None, expect_handler=expect),  # type: ignore[arg-type]  # no resource
            )
            match.add_app(self)
            match.freeze()
            self._one_match = match

        async def _handle(self, request: web.Request) -> web.StreamResponse:
            request._match_info = self._one_match
            if request.headers.get(hdrs.EXPECT):
                response = await self._expect(request)
                await request.writer.drain()
                if response is not None:
                    return response
            return await self._entry(request)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection handler, asking its server's ``guard``
    (:class:`sidecar.relay.server.client_guard.ConnectionGuard`) at each step: a connection past
    the cap is answered at once and closed (the process keeps file descriptors for the admin
    port, the upstream sockets and its own files); a request head past the byte budget is
    answered 431 and the connection closed; a request the parser refuses gets the guard's
    answer instead of aiohttp's (which quotes the request bytes)."""

    _over_cap = False
    _head_payload = None  # the body of the last request whose head completed
    _head_bytes = None  # a HeadBudget once the first bytes arrive

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.early_slot = EarlySlot()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = handler_server(self)
        guard: ConnectionGuard = server.guard  # type: ignore[attr-defined]  # a GuardedServer's
        cap = guard.max_connections
        if cap and open_connections(server) >= cap:
            self._over_cap = True
            cast(asyncio.Transport, transport).write(guard.refuse_connection(handler_loop(self)))
            transport.close()
            return
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._over_cap:
            return
        guard: ConnectionGuard = handler_server(self).guard  # type: ignore[attr-defined]  # a GuardedServer's
        budget = guard.head_budget
        count = request_count(self)
        if not budget or upgraded(self):  # past an Upgrade the bytes are no HTTP head
            super().data_received(data)
            if guard.early is not None:
                self._offer_early(guard.early, request_count(self) - count)
            return
        # Bytes that arrive while no request body is being read count towards the next head.
        payload = self._head_payload
        in_head = payload is None or payload.is_eof()
        super().data_received(data)
        head_done = request_count(self) != count
        size = 0
        if head_done:
            message, self._head_payload = last_message(self)
            size = head_size(message) if hasattr(message, "raw_headers") else 0
        if self._head_bytes is None:
            self._head_bytes = HeadBudget(budget)
        if not self._head_bytes.received(
            len(data), in_head=in_head, head_done=head_done, head_size=size
        ):
            transport = self.transport
            answer = guard.head_too_large()
            if transport is not None and not transport.is_closing():
                transport.write(answer)
                transport.close()
            self.force_close()
            return
        if guard.early is not None:
            self._offer_early(guard.early, request_count(self) - count)

    def _offer_early(self, early: EarlyHook, heads: int) -> None:
        """After a read that completed ``heads`` request heads: offer ``early``
        (sidecar/relay/data/early.py) the one request this read completed, head and body or
        only the body of a head that came before. Two heads in a row (pipelining) leave both
        to their handlers."""
        slot = self.early_slot
        if heads == 0:
            if slot.body_awaited is not None:
                self._send_early_body(early)
            return
        slot.body_awaited = None  # a next head came in: the one before was never completed alone
        if heads == 1:
            self._send_early(early)

    def _send_early(self, early: EarlyHook) -> None:
        """One request head completed in this read: if the connection's task is idle, waiting
        for exactly it, offer it to ``early``, which may send it upstream now; or, its body
        still arriving, remember it for the read that completes the body."""
        slot = self.early_slot
        waiting = (
            None if slot.record is not None else only_request_waiting(self, slot.between_requests)
        )
        if waiting is not None and isinstance(waiting[0], RawRequestMessage):
            slot.between_requests = False
            if waiting[1].is_eof():
                slot.record = early(waiting[0], waiting[1], self.transport)
            else:
                slot.body_awaited = waiting

    def _send_early_body(self, early: EarlyHook) -> None:
        """A read brought more of the body of the request remembered by :meth:`_send_early`:
        once all of it is in, offer the request to ``early`` if its handler has not claimed it
        yet (on Python 3.11 the connection's task takes it off the queue a loop turn after
        its head, and starts its handler a turn after that: a body read in between is still
        in time) and nothing else came."""
        slot = self.early_slot
        message, payload = slot.body_awaited  # type: ignore[misc]  # set: _offer_early checked
        if not payload.is_eof():
            return  # more to come (or the body failed: the connection is going)
        slot.body_awaited = None
        if slot.record is None and self.transport is not None and body_still_wanted(self, message):
            slot.record = early(message, payload, self.transport)

    def eof_received(self) -> None:
        if not self._over_cap:
            super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._over_cap:
            super().connection_lost(exc)
        slot = self.early_slot
        early, slot.record, slot.body_awaited = slot.record, None, None
        if early is not None:  # sent, but aiohttp runs no handler for a connection gone
            early.abandon()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status != 400 or not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        if request.writer.output_size > 0:  # as aiohttp: too late for another response
            raise ConnectionError("a response was already sent")
        guard: ConnectionGuard = handler_server(self).guard  # type: ignore[attr-defined]  # a GuardedServer's
        return guard.parse_refused(exc, request.remote)


class GuardedServer(HandlerServer):
    """``web.Server`` of :class:`GuardedRequestHandler` connections, asking ``guard`` (a
    :class:`~sidecar.relay.server.client_guard.ConnectionGuard`; the default: no cap, no head
    budget, parser refusals as JSON)."""

    handler_class = GuardedRequestHandler

    def __init__(self, *args: Any, guard: ConnectionGuard | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard if guard is not None else ConnectionGuard()
