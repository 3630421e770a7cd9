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
* one way in (sidecar/relay/data/exchange.py): :class:`GuardedRequestHandler` offers each
  request in ``_messages`` to the relay, hides ``_waiter`` from ``data_received`` and sets it
  only for a request the relay declines, parks ``start()`` until then, frees the parser's
  queue slot (``_parser.message_consumed()``), and while a request is carried holds
  ``_request_in_progress`` / ``_handler_waiter`` (the graceful shutdown's wait) and the
  keep-alive timer (``_keepalive_handle``, ``_next_keepalive_close_time``,
  ``_keepalive_timeout``, ``_keepalive``, ``_process_keepalive``), resumes a queue that was
  full as ``start()`` does (``_buffer_paused``, ``_msg_queue_resume_size``,
  ``_resume_reading_if_drained``), resumes a body's reading only when it was paused
  (``_reading_paused``), reading ``_close`` and ``_force_close`` (pinned over real sockets by
  ``tests/integration/relay/server/test_one_way_in.py``, which fails if the proxy port's
  handler runs for a request the relay carries);
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

from .client_guard import Carried, CarryHook, ConnectionGuard
from .head_budget import HeadBudget, head_size

if TYPE_CHECKING:
    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
    ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]

__all__ = [
    "CHECKED_AIOHTTP",
    "GuardedRequestHandler",
    "GuardedServer",
    "HandlerServer",
    "OwnHeadResponse",
    "RebuildingRunner",
    "RequestHandler",
    "handler_loop",
    "handler_server",
    "last_message",
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
    answer instead of aiohttp's (which quotes the request bytes).

    With a ``carry`` hook (the proxy port: sidecar/relay/data/exchange.py) the connection
    answers requests itself. Each request head aiohttp's parser completes is offered, in
    order, to ``carry``; a request it takes is answered from this connection's callbacks and
    aiohttp's task never sees it. The first one it declines opens the door: aiohttp's task,
    parked until then (:meth:`start`), takes that request and answers it with its handler,
    then every request queued behind it. The relay carries again once that task waits for a
    request (its ``_waiter`` pending), whose wake-up is held back while the relay carries
    one, so answers go out in the order asked. While a request is carried the connection
    holds what aiohttp's task would: the keep-alive timer (not run down under a request),
    the graceful shutdown's wait (``_request_in_progress``, ``_handler_waiter``) and
    closing after the answer.
    """

    _over_cap = False
    _head_payload = None  # the body of the last request whose head completed
    _head_bytes = None  # a HeadBudget once the first bytes arrive
    _carried: Carried | None = None  # the request the relay is answering on this connection
    _door: asyncio.Future[None] | None = None  # done once aiohttp's task may take requests

    async def start(self) -> None:
        """aiohttp's task for this connection, parked until the first request the relay
        declines: until then every request is the relay's, and nothing else may take one."""
        if self._door is None:
            self._door = self._loop.create_future()
        if not self._door.done():
            await self._door
        await super().start()

    def _open_door(self) -> None:
        """Let aiohttp's task take the request at the head of the queue."""
        door = self._door
        if door is None:
            self._door = door = self._loop.create_future()
        if not door.done():
            door.set_result(None)
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _door_idle(self) -> bool:
        """aiohttp's task is answering nothing: parked, or waiting for a request."""
        door = self._door
        if door is None or not door.done():
            return True
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = handler_server(self)
        guard: ConnectionGuard = server.guard  # type: ignore[attr-defined]  # a GuardedServer's
        cap = guard.max_connections
        if cap and open_connections(server) >= cap:
            self._over_cap = True
            cast(asyncio.Transport, transport).write(guard.refuse_connection(handler_loop(self)))
            transport.close()
            return
        if guard.carry is None:
            self._door = self._loop.create_future()
            self._door.set_result(None)  # no relay of its own: aiohttp's task takes every request
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._over_cap:
            return
        guard: ConnectionGuard = handler_server(self).guard  # type: ignore[attr-defined]  # a GuardedServer's
        carry = guard.carry
        if carry is None or upgraded(self):  # past an Upgrade the bytes are no HTTP head
            self._parse(data, guard)
            return
        # A request the relay carries must not wake aiohttp's task: the wake-up is held back
        # and given (by _dispatch) only to a request the relay declines.
        waiter, self._waiter = self._waiter, None
        try:
            self._parse(data, guard)
        finally:
            self._waiter = waiter
        if self._force_close or self._close:
            if waiter is not None and not waiter.done():
                waiter.cancel()  # as force_close() would have
            return
        carried = self._carried
        if carried is not None:
            carried.body_arrived()
        self._dispatch(carry)

    def _parse(self, data: bytes, guard: ConnectionGuard) -> None:
        """aiohttp's parse of one read, held to the whole-head budget."""
        budget = guard.head_budget
        if not budget or upgraded(self):
            super().data_received(data)
            return
        # Bytes that arrive while no request body is being read count towards the next head.
        payload = self._head_payload
        in_head = payload is None or payload.is_eof()
        count = request_count(self)
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

    def _dispatch(self, carry: CarryHook) -> None:
        """Offer the request at the head of the queue to ``carry`` while nothing is being
        answered on this connection: one it takes leaves the queue for good; the first it
        declines goes through the door, with everything queued behind it."""
        messages = self._messages
        while self._carried is None and messages and self._door_idle():
            if self._force_close or self._close or self.transport is None:
                return
            message, payload = messages[0]
            carried = None
            if isinstance(message, RawRequestMessage):
                carried = carry(self, message, payload)
            if carried is None:
                self._open_door()
                return
            messages.popleft()
            self._carried = carried
            self._request_in_progress = True  # a graceful shutdown waits for it
            if self._parser is not None:  # a slot of aiohttp's pipelining queue is free again
                self._parser.message_consumed()
            if self._buffer_paused and len(messages) <= self._msg_queue_resume_size:
                self._resume_reading_if_drained()  # the queue was full: read on, as start() does
            carried.start()

    def carried_done(self, carried: Carried, keep_alive: bool) -> None:
        """The carried request is answered (and the client took it): the next request on the
        connection, or the keep-alive timer; or the connection closes."""
        if carried is not self._carried:
            return
        self._carried = None
        self._request_in_progress = False
        waiter = self._handler_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)  # a graceful shutdown was waiting for it
        transport = self.transport
        if not keep_alive or self._close or self._force_close or transport is None:
            if transport is not None and not transport.is_closing():
                transport.close()
            return
        if self._messages:
            carry = handler_server(self).guard.carry  # type: ignore[attr-defined]  # a GuardedServer's
            if carry is not None:
                self._dispatch(carry)
            if self._carried is not None or not self._door_idle():
                return
        loop = self._loop
        close_time = loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None and self._keepalive_timeout > 0:
            self._keepalive_handle = loop.call_at(close_time, self._process_keepalive)

    def _process_keepalive(self) -> None:
        """aiohttp's keep-alive timer, which closes a connection whose task waits for a
        request: not under a request the relay carries (it looks again a timeout later; the
        request's end moves the close time, so no timer is made per request), and on a
        connection whose task is still parked, as if it were waiting."""
        if self._carried is not None:
            self._keepalive_handle = self._loop.call_at(
                self._loop.time() + self._keepalive_timeout, self._process_keepalive
            )
            return
        door = self._door
        if door is not None and door.done():
            super()._process_keepalive()
            return
        self._keepalive_handle = None
        if self._force_close or not self._keepalive:
            return
        loop = self._loop
        close_time = self._next_keepalive_close_time
        if loop.time() < close_time:
            self._keepalive_handle = loop.call_at(close_time, self._process_keepalive)
            return
        self.force_close()

    def resume_reading(self, resume_parser: bool = True) -> None:
        """aiohttp's body reader calls this after every read of a body, paused or not, and it
        parses again (a whole ``data_received`` of nothing, per request): only a connection
        whose reading was paused has anything to resume."""
        if self._reading_paused:
            super().resume_reading(resume_parser)

    def resume_writing(self) -> None:
        super().resume_writing()
        carried = self._carried
        if carried is not None:
            carried.client_drained()

    def close(self) -> None:
        """aiohttp's graceful close: no new requests, the connection closes once what is
        being answered is. A parked task ends now; an idle connection closes now."""
        super().close()
        door = self._door
        if door is not None and not door.done():
            door.cancel()
            if self._carried is None and self.transport is not None:
                self.force_close()

    def eof_received(self) -> None:
        if not self._over_cap:
            super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._over_cap:
            super().connection_lost(exc)
        carried, self._carried = self._carried, None
        if carried is not None:  # aiohttp knows nothing of it: its upstream request is stopped
            carried.client_gone()

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

    @classmethod
    def rebuilt(
        cls, built: web.Server, guard: ConnectionGuard, kwargs: dict[str, Any]
    ) -> GuardedServer:
        """The server ``AppRunner._make_server`` made (:class:`RebuildingRunner`), rebuilt
        with the same handler, factory and arguments, its connections asking ``guard``."""
        return cls(
            built.request_handler,
            request_factory=built.request_factory,
            handler_cancellation=built.handler_cancellation,
            loop=asyncio.get_running_loop(),
            guard=guard,
            **kwargs,
        )
