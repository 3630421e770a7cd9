"""Every use of aiohttp's private names, in one place: the admin port's server.

The proxy port does not use aiohttp's server (sidecar/relay/server/proxy_port.py: aiohttp's
parser under a protocol of the sidecar's own). The admin port does, and aiohttp has no
public hook for two things it needs there: answering a request its HTTP parser refuses
(414/431/400) with the sidecar's JSON body, and capping connections and request heads. The
error path runs no middleware, so :class:`GuardedRequestHandler` overrides the connection
handler's ``connection_made``, ``data_received``, ``eof_received``, ``connection_lost`` and
``handle_error`` (``aiohttp.web_protocol.RequestHandler``, whose ``_manager`` and ``_loop``
it reads, and ``_request_count``, ``_messages`` and ``_upgraded`` right after
``RequestHandler.data_received`` for the whole-head budget; what to answer is
:mod:`sidecar.relay.server.client_guard`'s); :class:`HandlerServer` builds it
(``web.Server._kwargs``), the cap counts the server's ``_connections``, and
:class:`RebuildingRunner` rebuilds the server ``AppRunner._make_server`` made, with the
same arguments. Eight names.

Checked against aiohttp 3.14.5 (the version ``make install`` resolves; pyproject pins
``<3.15`` for this reason). ``tests/unit/relay/server/test_aiohttp_internals.py`` pins each
name used here on the installed aiohttp, so an upgrade that renames one fails there by name rather
than as a wrong answer on the admin port; the behaviour is pinned over real sockets by
``tests/integration/relay/server/test_hostile*.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from .client_guard import ConnectionGuard
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


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection handler (the admin port's), asking its server's ``guard``
    (:class:`sidecar.relay.server.client_guard.ConnectionGuard`) at each step: a connection past
    the cap is answered at once and closed (the process keeps file descriptors for the proxy
    port, the upstream sockets and its own files); a request head past the byte budget is
    answered 431 and the connection closed; a request the parser refuses gets the guard's
    answer instead of aiohttp's (which quotes the request bytes). The proxy port has a
    connection of its own (sidecar/relay/server/proxy_port.py).
    """

    _over_cap = False
    _head_payload = None  # the body of the last request whose head completed
    _head_bytes = None  # a HeadBudget once the first bytes arrive

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
        self._parse(data, handler_server(self).guard)  # type: ignore[attr-defined]  # a GuardedServer's

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

    def eof_received(self) -> None:
        if not self._over_cap:
            super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._over_cap:
            super().connection_lost(exc)

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
