"""The proxy port's connections: aiohttp's HTTP parser (llhttp) under a protocol of the
sidecar's own, which hands every request to the relay from its callbacks.

aiohttp's server would parse a request, make a ``Request``, start a handler task two loop
turns later, answer through a ``StreamResponse`` and end with another turn
(docs/performance.md says what that cost). The relay answers every request from
the connection's callbacks, so here the connection is an ``asyncio.Protocol`` that feeds
``aiohttp.http_parser.HttpRequestParser`` (the parser aiohttp's server uses, with the same
limits) and holds what aiohttp's connection handler would, as uvicorn's httptools protocol
does:

- the connection cap (answered 503 and closed) and the whole-head budget (431), asking the
  port's :class:`~sidecar.relay.server.client_guard.ConnectionGuard`; what the parser
  refuses gets the guard's JSON answer, in its turn;
- pipelining: the parsed requests wait in order, each handed to the relay once the one
  before it is answered; past :data:`MAX_QUEUED` waiting, reading stops until they drain.
  A read is fed to the parser one request head at a time, so a request the parser refuses
  costs only itself: those before it in the same read are answered first, as nginx does;
- an upgrade offer (``Connection: Upgrade``, any protocol): the sidecar carries no
  upgraded protocol, so the offer is dropped (hop-by-hop) and the request relayed as a plain
  one with its body; it is the connection's last (aiohttp's parser drops the bytes after it
  in the same read), and its answer says the connection closes;
- an answer given before the request's body was all read (an upstream's early 401, the
  sidecar's own 413 or 408): the rest of the body is read and thrown away, for at most
  :data:`LINGER_SECONDS` and :data:`LINGER_IDLE_SECONDS` between reads, after the answer
  the connection is half-closed, then closed (nginx's ``lingering_close``): a client that
  writes its whole body before it reads gets the answer instead of a reset or a stall;
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
from .listener import LISTEN_BACKLOG, Listener, bind_listening

__all__ = ["MAX_QUEUED", "ProxyConnection", "ProxyPort"]

MAX_QUEUED = 32
"""Parsed requests a connection holds waiting for their turn before it stops reading (as
aiohttp's server does)."""

READ_LIMIT = 2**16
"""A request body's buffered bytes past which reading pauses (aiohttp's default)."""

LINGER_SECONDS = 30.0
LINGER_IDLE_SECONDS = 5.0
"""How long the unread rest of a body answered early is read and thrown away, in all and
between two reads (nginx's ``lingering_time`` and ``lingering_timeout``)."""

_HEAD_END = b"\r\n\r\n"


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
        "_writing_paused", "_over_cap", "_counted", "_owed", "_payload_open", "_lingering",
        "_carried_body", "peer",
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
        self._upgraded = False  # an upgrade offer was queued: nothing after it is read
        self._closing = False  # no request after the one being answered
        self._reading_paused = False  # by the body's flow control
        self._queue_full = False  # by the pipelining bound
        self._writing_paused = False
        self._over_cap = False
        # Requests the parser counted as complete and not yet taken (it stops parsing at
        # MAX_QUEUED of them), and whether the one being answered is owed its count.
        self._counted = 0
        self._owed = False
        # The last head's body is still arriving. Kept after every feed (the parser is all
        # that completes a body), so it says what ``_payload.is_eof()`` would, and of any
        # earlier head's body that it is complete: the parser reads a head only after the
        # body before it.
        self._payload_open = False
        self._carried_body: StreamReader | None = None  # the body of the request answered
        self._lingering: float | None = None  # reading a body's rest away: its last read
        # Who this connection is to the upstream, made by the relay at its first request and
        # kept for the rest (sidecar/relay/data/forwarded.ClientPeer).
        self.peer: Any = None

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
        if self._lingering is not None:  # the rest of a body answered early: thrown away
            self._lingering = self._loop.time()
            return
        if self._over_cap or self._parser is None:
            return
        if self._upgraded and self._body_done():  # past an upgrade offer: nothing is read
            return
        self._parse(data)
        carried = self._carried
        if carried is not None:
            carried.body_arrived()
        self._dispatch()

    def eof_received(self) -> None:
        """The client will send no more: the transport closes (after what is being written)."""
        return None

    def _body_done(self) -> bool:
        payload = self._payload
        return payload is None or payload.is_eof()

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
        completes join the queue (none after an upgrade offer)."""
        budget = self._budget
        in_head = budget is not None and not self._payload_open
        queue = self._queue
        queued = len(queue)
        refused = self._feed(data)
        if budget is not None:
            completed = len(queue) - queued
            largest = 0
            for i in range(queued, queued + completed):  # the heads this read completed
                # (parsed heads: a refusal is queued below)
                size = head_size(queue[i][0])  # type: ignore[arg-type]
                if size > largest:
                    largest = size
            if not budget.received(
                len(data), in_head=in_head, head_done=completed > 0, head_size=largest
            ):
                self._refuse_now(self._port.guard.head_too_large())
                return
        if refused is not None:
            body = self._payload
            if body is not None and not body.is_eof():  # the refused bytes were its body's
                body.set_exception(RequestPayloadError(str(refused.exc)))
                if self._queue and self._queue[-1][1] is body:
                    self._queue.pop()  # not carried yet: the refusal is its answer
            self._queue.append((refused, None))
        if self._counted >= MAX_QUEUED and not self._queue_full:
            # The parser stopped at its bound and holds the rest of the read: so does the
            # socket, until the queue drains (_dispatch feeds the parser what it held).
            self._queue_full = True
            self._transport_reading(False)

    def _feed(self, data: bytes) -> _Refused | None:
        """Feed ``data`` a piece at a time, each ending where a head may end (``CRLFCRLF``),
        so the requests completed before a refused one are queued before its refusal (the
        parser's error loses what the same call completed). What the parser refused is
        returned, and the parser dropped: nothing after it is read. Once the parser stopped
        at its bound, the rest goes in whole (it only keeps it)."""
        while True:
            parser = self._parser
            if parser is None:
                return None
            end = data.find(_HEAD_END)
            if end < 0 or end + 4 >= len(data) or self._counted >= MAX_QUEUED:
                piece, data = data, b""
            else:
                piece, data = data[: end + 4], data[end + 4 :]
            try:
                parsed, _, _ = parser.feed_data(piece)
            except HttpProcessingError as exc:
                self._parser = None
                return _Refused(exc)
            self._queued(parsed)
            if not data or (self._upgraded and self._body_done()):
                return None

    def _queued(self, parsed: list[tuple[RawRequestMessage, StreamReader]]) -> None:
        """The requests one feed completed, queued; the parser's count of complete requests
        mirrored (a body that was open before the feed and ended in it counts now), and the
        request being answered given its count back once its body is complete."""
        open_body = self._payload
        if self._payload_open and open_body is not None and open_body.is_eof():
            self._payload_open = False
            self._counted += 1
            if self._owed:
                self._owed = False
                self._consumed()
        for message, body in parsed:
            if self._upgraded:
                break  # nothing after an upgrade offer is answered: the connection ends
            self._queue.append((message, body))
            self._payload = body
            if body.is_eof():
                self._counted += 1
            else:
                self._payload_open = True
            if message.upgrade:
                self._upgraded = True

    def _consumed(self) -> None:
        parser = self._parser
        if parser is not None:
            parser.message_consumed()
        self._counted -= 1

    def _dispatch(self) -> None:
        """Hand the request at the head of the queue to the relay while nothing is being
        answered: it leaves the queue for good, and the next waits until it is answered
        (answers go out in the order asked)."""
        queue = self._queue
        while self._carried is None and queue and not self._closing:
            if self.transport is None:
                return
            message, payload = queue.popleft()
            if isinstance(message, _Refused):
                self._refuse_now(self._port.guard.refused_unparsed(message.exc, self._peer()))
                return
            assert payload is not None
            if payload is not self._payload or not self._payload_open:  # its body is all in
                self._consumed()  # a slot of the parser's own queue is free again
            else:
                self._owed = True  # its slot, once the parser counts it (its body ends)
            self._carried_body = payload
            carried = self._carried = self._port.guard.carry(self, message, payload)  # type: ignore[misc]  # the proxy port has one
            if self._queue_full and self._counted <= MAX_QUEUED // 2:
                self._queue_full = False
                if self._parser is not None:
                    self._parse(b"")  # requests the parser held back while its queue was full
                if not self._queue_full and not self._reading_paused:
                    self._transport_reading(True)
            carried.start()

    def carried_done(self, carried: Carried, keep_alive: bool) -> None:
        """The carried request is answered (and the client took it): the next request on the
        connection, or the header timer; or the connection closes, after reading away the
        rest of a body the answer came before."""
        if carried is not self._carried:
            return
        self._carried = None
        body, self._carried_body = self._carried_body, None
        self._port.settle()
        transport = self.transport
        if transport is None or transport.is_closing():
            self._closing = True
            return
        if body is not None and body is self._payload and self._payload_open:  # (not all in)
            self._linger()
            return
        if not keep_alive or self._closing or self._upgraded:
            self.close()
            return
        if self._queue:
            self._dispatch()
            if self._carried is not None:
                return
        self._idle(self._loop.time())

    # -- the rest of a body answered early ------------------------------------------------

    def _linger(self) -> None:
        """Read the rest of the body away: no request after it is parsed, the answer is
        followed by a half-close once it is written, and the connection closes when the
        client closes its side, or stops sending, or :data:`LINGER_SECONDS` pass."""
        transport = self.transport
        assert transport is not None
        self._closing = True
        self._parser = None
        self._queue.clear()
        self._payload = None
        self._cancel_timer()
        now = self._lingering = self._loop.time()
        self._idle_until = now + LINGER_SECONDS  # the deadline in all
        self._timer = self._loop.call_at(now + LINGER_IDLE_SECONDS, self._linger_timer)
        if transport.can_write_eof():
            transport.write_eof()  # after the answer: the client reads it, then the end
        self._reading_paused = self._queue_full = False
        self._transport_reading(True)

    def _linger_timer(self) -> None:
        """The client stopped sending, or lingered its time: the connection is cut (closing
        would wait to flush an answer the client may never read)."""
        self._timer = None
        last = self._lingering
        if self.transport is None or last is None:
            return
        at = min(last + LINGER_IDLE_SECONDS, self._idle_until)
        if self._loop.time() < at:
            self._timer = self._loop.call_at(at, self._linger_timer)
            return
        self.abort()

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
        self._servers: list[Listener] = []
        self._settled: asyncio.Future[None] | None = None  # the shutdown's wait

    def __call__(self) -> ProxyConnection:
        return ProxyConnection(self)

    async def listen(self, host: str, port: int, *, backlog: int = LISTEN_BACKLOG) -> None:
        self._servers.append(Listener(self, await bind_listening(host, port, backlog), backlog))

    async def listen_on(self, sock: socket.socket, *, backlog: int = LISTEN_BACKLOG) -> None:
        sock.listen(backlog)
        sock.setblocking(False)
        self._servers.append(Listener(self, [sock], backlog))

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
