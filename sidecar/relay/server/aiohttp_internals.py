"""Every use of aiohttp's private names, in one place.

aiohttp has no public hook for some things the sidecar needs, so it leans on internals:

* answering a request its HTTP parser refuses (414/431/400) with the proxy's JSON body and
  capping connections: the error path runs no middleware, so :class:`GuardedRequestHandler`
  overrides the connection handler's ``connection_made``, ``data_received``,
  ``eof_received``, ``connection_lost`` and ``handle_error``
  (``aiohttp.web_protocol.RequestHandler``, whose ``_manager`` and ``_loop`` it reads; what
  to answer is :mod:`sidecar.relay.server.client_guard`'s), :class:`HandlerServer` builds it
  (``web.Server._kwargs``), and :class:`RebuildingRunner` rebuilds the server
  ``AppRunner._make_server`` made, with the same arguments; the cap counts the server's
  ``_connections``;
* the whole-head budget (sidecar/relay/server/head_budget.py): the handler's
  ``_request_count`` and ``_messages``, read right after ``RequestHandler.data_received``;
* one way in (sidecar/relay/data/exchange.py): on the proxy port
  :class:`GuardedRequestHandler` hands each request in ``_messages`` to the relay (a parse
  error aiohttp queued there, ``_ErrInfo.exc``, is answered in its turn), parks aiohttp's
  task for good, frees the parser's queue slot (``_parser.message_consumed()``), and while a
  request is carried holds ``_request_in_progress`` / ``_handler_waiter`` (the graceful
  shutdown's wait) and the keep-alive timer (``_keepalive_handle``,
  ``_next_keepalive_close_time``, ``_keepalive_timeout``, ``_keepalive``,
  ``_process_keepalive``), resumes a queue that was full as ``start()`` does
  (``_buffer_paused``, ``_msg_queue_resume_size``, ``_resume_reading_if_drained``), resumes
  a body's reading only when it was paused (``_reading_paused``), reading ``_close`` and
  ``_force_close`` (pinned over real sockets by
  ``tests/integration/relay/server/test_one_way_in.py``, which fails if aiohttp's handler
  machinery runs for a request on the proxy port);
* shortening the drain's last wait: ``BaseRunner._shutdown_timeout``
  (:func:`set_shutdown_timeout`).

Checked against aiohttp 3.14.5 (the version ``make install`` resolves; pyproject pins
``<3.15`` for this reason). ``tests/unit/test_aiohttp_internals.py`` pins each name used
here on the installed aiohttp, so an upgrade that renames one fails there by name rather
than as a wrong byte on the wire; the behaviour is pinned over real sockets by
``tests/unit/test_client_head.py``, ``tests/integration/relay/server/test_hostile*.py`` and the
drain tests.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiohttp import web
from aiohttp.http import RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from .client_guard import Carried, CarryHook, ConnectionGuard
from .head_budget import HeadBudget, head_size

__all__ = [
    "CHECKED_AIOHTTP",
    "GuardedRequestHandler",
    "GuardedServer",
    "HandlerServer",
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


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection handler, asking its server's ``guard``
    (:class:`sidecar.relay.server.client_guard.ConnectionGuard`) at each step: a connection past
    the cap is answered at once and closed (the process keeps file descriptors for the admin
    port, the upstream sockets and its own files); a request head past the byte budget is
    answered 431 and the connection closed; a request the parser refuses gets the guard's
    answer instead of aiohttp's (which quotes the request bytes).

    With a ``carry`` hook (the proxy port: sidecar/relay/data/exchange.py) the connection
    answers every request itself. Each request head aiohttp's parser completes is handed, in
    order, to ``carry`` once the one before it is answered, and is answered from this
    connection's callbacks; what the parser refused is answered in its turn. aiohttp's task
    is parked for good (:meth:`start`) and never takes a request. While a request is carried
    the connection holds what aiohttp's task would: the keep-alive timer (not run down under
    a request), the graceful shutdown's wait (``_request_in_progress``,
    ``_handler_waiter``) and closing after the answer.
    """

    _over_cap = False
    _head_payload = None  # the body of the last request whose head completed
    _head_bytes = None  # a HeadBudget once the first bytes arrive
    _carried: Carried | None = None  # the request the relay is answering on this connection
    _parked: asyncio.Future[None] | None = None  # aiohttp's task on a port the relay answers

    async def start(self) -> None:
        """aiohttp's task for this connection. Where the relay answers every request (the
        proxy port) it is parked until the connection ends, and never takes one; on a port
        without a relay (the admin port) it is aiohttp's own."""
        if handler_server(self).guard.carry is None:  # type: ignore[attr-defined]  # a GuardedServer's
            await super().start()
            return
        self._parked = self._loop.create_future()
        await self._parked

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
        carry = guard.carry
        self._parse(data, guard)
        if carry is None or self._force_close or self._close:
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
        """Hand the request at the head of the queue to ``carry`` while nothing is being
        answered on this connection: it leaves the queue for good, and the next waits until
        it is answered (answers go out in the order asked)."""
        messages = self._messages
        while self._carried is None and messages:
            if self._force_close or self._close or self.transport is None:
                return
            message, payload = messages.popleft()
            if not isinstance(message, RawRequestMessage):
                self._refuse_unparsed(message)
                return
            carried = self._carried = carry(self, message, payload)
            self._request_in_progress = True  # a graceful shutdown waits for it
            if self._parser is not None:  # a slot of aiohttp's pipelining queue is free again
                self._parser.message_consumed()
            if self._buffer_paused and len(messages) <= self._msg_queue_resume_size:
                self._resume_reading_if_drained()  # the queue was full: read on, as start() does
            carried.start()

    def _refuse_unparsed(self, error: Any) -> None:
        """What aiohttp's parser refused (it queues the error, ``_ErrInfo``, in the request's
        place): the guard's answer, in its turn, and the connection closes."""
        guard: ConnectionGuard = handler_server(self).guard  # type: ignore[attr-defined]  # a GuardedServer's
        transport = self.transport
        if transport is not None and not transport.is_closing():
            peer = transport.get_extra_info("peername")
            transport.write(guard.refused_unparsed(error.exc, peer[0] if peer else None))
        self.force_close()

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
            if self._carried is not None:
                return
        loop = self._loop
        close_time = loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None and self._keepalive_timeout > 0:
            self._keepalive_handle = loop.call_at(close_time, self._process_keepalive)

    def _process_keepalive(self) -> None:
        """aiohttp's keep-alive timer, which closes a connection whose task waits for a
        request. Where the relay answers (the task parked), it closes an idle connection,
        not one under a request the relay carries (it looks again a timeout later; the
        request's end moves the close time, so no timer is made per request)."""
        if self._parked is None:
            super()._process_keepalive()
            return
        loop = self._loop
        if self._carried is not None:
            self._keepalive_handle = loop.call_at(
                loop.time() + self._keepalive_timeout, self._process_keepalive
            )
            return
        self._keepalive_handle = None
        if self._force_close or not self._keepalive:
            return
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
        parked = self._parked
        if parked is not None and not parked.done():
            parked.cancel()
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
