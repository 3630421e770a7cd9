"""The proxy port's connections: aiohttp's HTTP parser (llhttp) under a protocol of the
sidecar's own, which hands every request to the relay from its callbacks.

aiohttp's server would parse a request, make a ``Request``, start a handler task two loop
turns later, answer through a ``StreamResponse`` and end with another turn
(sidecar/relay/data/exchange.py says what that cost). The relay answers every request from
the connection's callbacks, so here the connection is an ``asyncio.Protocol`` that feeds
``aiohttp.http_parser.HttpRequestParser`` (the parser aiohttp's server uses, with the same
limits) and holds what aiohttp's connection handler would, as uvicorn's httptools protocol
does:

- the connection cap (answered 503 and closed) and the whole-head budget (431), asking the
  port's :class:`~sidecar.relay.server.client_guard.ConnectionGuard`; what the parser
  refuses gets the guard's JSON answer, in its turn;
- pipelining: the parsed requests wait in order, each handed to the relay once the one
  before it is answered; past :data:`MAX_QUEUED` waiting, reading stops until they drain;
- the header timer (nginx's ``client_header_timeout`` and ``keepalive_timeout``): a
  connection with no complete request head within ``header_timeout`` of its start or of
  its last answer is closed; one timer per connection, moved, never made per request;
- a request body's flow control (aiohttp's body stream pauses and resumes reading) and the
  client's (``pause_writing``/``resume_writing``, told to the request being answered);
- the drain's wait (:meth:`ProxyPort.shutdown`): listening stops, idle connections close,
  a connection under a request closes once it is answered, and what is left at the
  deadline is cut (its request recorded as cancelled);
- a lost connection: the request being answered is told (``client_gone``).

Request bodies reach the upstream as the client sent them: the parser's
``auto_decompress`` is off (aiohttp's server default would decompress a ``Content-Encoding:
gzip`` body, and the upstream would get other bytes under the client's header).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any, cast

from aiohttp.http import RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestPayloadError

from .client_guard import Carried, ConnectionGuard
from .head_budget import HeadBudget, head_size

__all__ = ["MAX_QUEUED", "ProxyConnection", "ProxyPort"]

MAX_QUEUED = 32
"""Parsed requests a connection holds waiting for their turn before it stops reading (as
aiohttp's server does)."""

READ_LIMIT = 2**16
"""A request body's buffered bytes past which reading pauses (aiohttp's default)."""


class _Refused:
    """What the parser refused, queued in the place of the request it would have been."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class ProxyConnection(asyncio.Protocol):
    """One client connection of the proxy port (the module doc)."""

    __slots__ = (
        "_port", "_loop", "transport", "_parser", "_queue", "_carried", "_payload", "_budget",
        "_idle_until", "_timer", "_upgraded", "_closing", "_reading_paused", "_queue_full",
        "_writing_paused", "_over_cap",
    )  # fmt: skip

    def __init__(self, port: ProxyPort) -> None:
        self._port = port
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser: HttpRequestParser | None = None
        self._queue: deque[tuple[RawRequestMessage | _Refused, StreamReader | None]] = deque()
        self._carried: Carried | None = None
        self._payload: StreamReader | None = None  # the body of the last head parsed
        self._budget: HeadBudget | None = None
        self._idle_until = 0.0  # the header timer's deadline
        self._timer: asyncio.TimerHandle | None = None
        self._upgraded = False
        self._closing = False  # no request after the one being answered
        self._reading_paused = False  # by the body's flow control
        self._queue_full = False  # by the pipelining bound
        self._writing_paused = False
        self._over_cap = False

    # -- asyncio's callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        port = self._port
        stream = self.transport = cast(asyncio.Transport, transport)  # a TCP server's
        guard = port.guard
        cap = guard.max_connections
        if cap and len(port.connections) >= cap:
            self._over_cap = True
            stream.write(guard.refuse_connection(self._loop))
            stream.close()
            return
        port.connections.add(self)
        sock = stream.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self._parser = HttpRequestParser(
            self,  # type: ignore[arg-type]  # what its body streams ask of it: connected, pause/resume_reading
            self._loop,
            READ_LIMIT,
            max_line_size=port.max_line_size,
            max_field_size=port.max_field_size,
            max_headers=port.max_headers,
            payload_exception=RequestPayloadError,
            auto_decompress=False,
            max_msg_queue_size=MAX_QUEUED,
        )
        if guard.head_budget:
            self._budget = HeadBudget(guard.head_budget)
        self._idle(self._loop.time())

    def data_received(self, data: bytes) -> None:
        if self._over_cap or self._parser is None:
            return
        if self._upgraded:  # past an Upgrade the bytes are no HTTP: not read, not kept
            return
        self._parse(data)
        carried = self._carried
        if carried is not None:
            carried.body_arrived()
        self._dispatch()

    def eof_received(self) -> None:
        """The client will send no more: the transport closes (after what is being written)."""
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        port = self._port
        port.connections.discard(self)
        self._cancel_timer()
        self._closing = True
        parser, self._parser = self._parser, None
        if parser is not None:
            try:
                parser.feed_eof()
            except Exception:  # an unfinished head or body: nothing to answer now
                pass
        lost = ConnectionResetError("the client connection was lost")
        for _, payload in self._queue:
            if payload is not None and not payload.is_eof():
                payload.set_exception(lost)
        self._queue.clear()
        payload = self._payload
        if payload is not None and not payload.is_eof():
            payload.set_exception(lost)
        carried, self._carried = self._carried, None
        if carried is not None:
            carried.client_gone()
        self.transport = None
        port.settle()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        carried = self._carried
        if carried is not None:
            carried.client_drained()

    # -- what aiohttp's body stream asks ---------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.transport is not None

    @property
    def writing_paused(self) -> bool:
        """The transport is past its high-water mark (``resume_writing`` to come)."""
        return self._writing_paused

    def pause_reading(self) -> None:
        """A request body's buffer is full: stop reading until it is read."""
        if not self._reading_paused:
            self._reading_paused = True
            self._transport_reading(False)

    def resume_reading(self, resume_parser: bool = True) -> None:
        """Called after every read of a body, paused or not: only a connection whose reading
        was paused has anything to resume."""
        if self._reading_paused:
            self._reading_paused = False
            if not self._queue_full:
                self._transport_reading(True)

    # -- requests ------------------------------------------------------------------------

    def _parse(self, data: bytes) -> None:
        """Feed one read to the parser, held to the whole-head budget; the requests it
        completes join the queue."""
        parser = self._parser
        assert parser is not None
        payload = self._payload
        in_head = payload is None or payload.is_eof()
        messages: list[tuple[RawRequestMessage | _Refused, StreamReader | None]]
        try:
            parsed, upgraded, _ = parser.feed_data(data)
            messages = parsed  # type: ignore[assignment]  # (a list of requests and their bodies)
        except HttpProcessingError as exc:
            messages, upgraded = [(_Refused(exc), None)], False
            self._parser = None  # nothing after it is read
        budget = self._budget
        largest = 0
        for message, body in messages:
            self._queue.append((message, body))
            if isinstance(message, RawRequestMessage):
                self._payload = body
                largest = max(largest, head_size(message))
        if budget is not None and not budget.received(
            len(data), in_head=in_head, head_done=bool(messages), head_size=largest
        ):
            self._refuse_now(self._port.guard.head_too_large())
            return
        if upgraded:
            self._upgraded = True
        if len(self._queue) >= MAX_QUEUED and not self._queue_full:
            self._queue_full = True
            self._transport_reading(False)

    def _dispatch(self) -> None:
        """Hand the request at the head of the queue to the relay while nothing is being
        answered: it leaves the queue for good, and the next waits until it is answered
        (answers go out in the order asked)."""
        queue = self._queue
        while self._carried is None and queue and not self._closing:
            if self.transport is None:
                return
            message, payload = queue.popleft()
            parser = self._parser
            if parser is not None:
                parser.message_consumed()  # a slot of the parser's own queue is free again
            if isinstance(message, _Refused):
                self._refuse_now(self._port.guard.refused_unparsed(message.exc, self._peer()))
                return
            assert payload is not None
            carried = self._carried = self._port.guard.carry(self, message, payload)  # type: ignore[misc]  # the proxy port has one
            if self._queue_full and len(queue) <= MAX_QUEUED // 2:
                self._queue_full = False
                if parser is not None:
                    self._parse(b"")  # requests the parser held back while its queue was full
                if not self._queue_full and not self._reading_paused:
                    self._transport_reading(True)
            carried.start()

    def carried_done(self, carried: Carried, keep_alive: bool) -> None:
        """The carried request is answered (and the client took it): the next request on the
        connection, or the header timer; or the connection closes."""
        if carried is not self._carried:
            return
        self._carried = None
        self._port.settle()
        transport = self.transport
        if not keep_alive or self._closing or self._upgraded or transport is None:
            self._closing = True
            if transport is not None and not transport.is_closing():
                transport.close()
            return
        if self._queue:
            self._dispatch()
            if self._carried is not None:
                return
        self._idle(self._loop.time())

    # -- the header timer ----------------------------------------------------------------

    def _idle(self, now: float) -> None:
        """No request is being answered: a complete head must come within the timeout."""
        timeout = self._port.header_timeout
        if timeout <= 0:
            return
        self._idle_until = now + timeout
        if self._timer is None:
            self._timer = self._loop.call_at(self._idle_until, self._header_timer)

    def _header_timer(self) -> None:
        """Closes a connection that sent no complete head in time; not one under a request
        (it looks again a timeout later: the answer moves the deadline, so no timer is made
        per request)."""
        self._timer = None
        if self.transport is None:
            return
        now = self._loop.time()
        if self._carried is not None:
            self._timer = self._loop.call_at(now + self._port.header_timeout, self._header_timer)
            return
        if now < self._idle_until:
            self._timer = self._loop.call_at(self._idle_until, self._header_timer)
            return
        self.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- closing -------------------------------------------------------------------------

    def close_when_answered(self) -> None:
        """No request after the one being answered; an idle connection closes now."""
        self._closing = True
        if self._carried is None:
            self.close()

    def close(self) -> None:
        transport = self.transport
        self._closing = True
        if transport is not None and not transport.is_closing():
            transport.close()

    def abort(self) -> None:
        transport = self.transport
        if transport is not None:
            transport.abort()

    def _refuse_now(self, answer: bytes) -> None:
        """Answer with the sidecar's own bytes and close: nothing more is read."""
        self._parser = None
        self._queue.clear()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(answer)
        self.close()

    def _peer(self) -> str | None:
        transport = self.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        return str(peer[0]) if isinstance(peer, (list, tuple)) else None

    def _transport_reading(self, on: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        try:
            if on:
                transport.resume_reading()
            else:
                transport.pause_reading()
        except (AttributeError, NotImplementedError, RuntimeError):
            pass


class ProxyPort:
    """The proxy port: its listening sockets and its connections (:class:`ProxyConnection`),
    each asking ``guard`` (the cap, the head budget, the parser's refusals, and ``carry``:
    the relay), with aiohttp's parser limits and the header timeout."""

    def __init__(
        self,
        guard: ConnectionGuard,
        *,
        header_timeout: float,
        max_line_size: int = 8190,
        max_field_size: int = 8190,
        max_headers: int = 128,
    ) -> None:
        if guard.carry is None:
            raise ValueError("the proxy port's guard needs the relay (carry)")
        self.guard = guard
        self.header_timeout = header_timeout
        self.max_line_size = max_line_size
        self.max_field_size = max_field_size
        self.max_headers = max_headers
        self.connections: set[ProxyConnection] = set()
        self._servers: list[asyncio.Server] = []
        self._settled: asyncio.Future[None] | None = None  # the shutdown's wait

    def __call__(self) -> ProxyConnection:
        return ProxyConnection(self)

    async def listen(self, host: str, port: int, *, backlog: int = 1024) -> None:
        server = await asyncio.get_running_loop().create_server(
            self, host, port, backlog=backlog, reuse_address=True
        )
        self._servers.append(server)

    async def listen_on(self, sock: socket.socket, *, backlog: int = 1024) -> None:
        server = await asyncio.get_running_loop().create_server(self, sock=sock, backlog=backlog)
        self._servers.append(server)

    @property
    def addresses(self) -> list[Any]:
        """What each listening socket is bound to (``getsockname()``)."""
        return [s.getsockname() for server in self._servers for s in server.sockets]

    def settle(self) -> None:
        """A request or a connection ended: the shutdown's wait ends once none is answered."""
        settled = self._settled
        if settled is not None and not settled.done() and not self._busy():
            settled.set_result(None)

    def _busy(self) -> bool:
        return any(c._carried is not None for c in self.connections)

    async def shutdown(self, timeout: float) -> None:
        """Stop listening, close idle connections now and the others once their request is
        answered, within ``timeout`` seconds; what is left then is cut."""
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close_when_answered()
        if self._busy():
            self._settled = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._settled), timeout)
            except TimeoutError:
                pass
        for connection in list(self.connections):
            connection.abort()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
