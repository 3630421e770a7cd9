"""Connections to the inference server: a keep-alive pool of protocols that *push* the
response body to the relay.

Why not aiohttp's client: with it, every token costs a stream-buffer append, a future, a
task wake-up through several ``await`` layers and a re-armed read timer before the relay
even sees the bytes. That machinery was ~40 % of the sidecar's CPU per token. Here the
connection's ``data_received`` decodes the framing (:mod:`sidecar.relay.data.http1`, sans-I/O) and
hands each body piece straight to a :class:`BodySink`, which writes it to the client and
then measures it, inside the same callback: one read, one write, no task switch. The relay
task only wakes for what is rare: the end, an error, or back-pressure.

Back-pressure: the sink pauses this connection's reading when the client's socket buffer
fills, and resumes it once the client drained, so a slow client slows the upstream down
instead of making us buffer (TCP does the rest).

The read timeout is a deadline that moves with each read, checked by one timer per
connection that only re-arms when it fires (not one timer per read). Time spent paused
for a slow client does not count: then it is not the upstream that is idle.

Pooled connections are reused while the server allows keep-alive and for at most
``keepalive_seconds`` idle, shorter than the 5 s that uvicorn (vLLM, SGLang) and llama.cpp
allow, so we drop an idle connection before the server does instead of racing it. If a
reused connection still turns out closed before any response byte, an idempotent request
is sent once more on a new connection (see :func:`_replayable`); anything else gets 502.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterable, Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast
from urllib.parse import urlsplit

import structlog

from ...base.outcomes import Verdict
from ...base.speedups import chunk_payload
from .http1 import ProtocolError, ResponseHead, ResponseParser, lowered_names, request_head

if TYPE_CHECKING:
    from .token_lane_py import TokenLane

__all__ = [
    "YIELD_AFTER_READ",
    "BodySink",
    "Sent",
    "UpstreamConnection",
    "UpstreamError",
    "UpstreamPool",
]

_log = structlog.get_logger("sidecar.upstream")

# Methods that send Content-Length: 0 without a body (what aiohttp's client did, and what
# RFC 9110 section 8.6 suggests for a method that has body semantics).
_BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


YIELD_AFTER_READ = 64 << 10
"""A read this large means the upstream is ahead of the relay: yield a loop turn after it."""


class UpstreamError(Exception):
    """The upstream could not give a response head. ``verdict`` is the request's (its
    ``answer_status``, 502 or 504, is what the proxy answers the client)."""

    def __init__(self, verdict: Verdict, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict


# OpenSSL's reasons for a handshake whose answer is not TLS at all: a plain-HTTP server's
# "HTTP/1.1 400" read as a TLS record (3.0 and 3.1 say the first, later releases the others).
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"})


def _unreachable(exc: OSError, host: str, port: int) -> UpstreamError:
    """Name the cause (DNS, TLS, refused, other) in the message: the error type stays
    ``upstream_unreachable`` (a label value), but an operator reading one 502 should not
    have to open ``/readyz`` to learn which of these it was. Each message keeps the word
    "unreachable" that clients and log searches already match."""
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        reason = f"the inference server is unreachable: cannot resolve its host name {host!r} ({exc.strerror or exc})"
    elif isinstance(exc, ssl.SSLError):
        detail = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc
        reason = f"the inference server at {where} is unreachable: TLS handshake failed ({detail})"
        if getattr(exc, "reason", None) in _NOT_TLS:
            authority = f"[{host}]:{port}" if ":" in host else where
            reason += f"; it answers without TLS: if it serves plain HTTP, use http://{authority}"
    elif isinstance(exc, ConnectionRefusedError):
        reason = f"the inference server at {where} is unreachable: connection refused (is it listening on that port?)"
    else:
        reason = f"the inference server at {where} is unreachable ({exc.strerror or exc})"
    return UpstreamError(Verdict.UPSTREAM_UNREACHABLE, reason)


def _timeout() -> UpstreamError:
    return UpstreamError(Verdict.UPSTREAM_TIMEOUT, "the inference server did not answer in time")


def _disconnected() -> UpstreamError:
    return UpstreamError(
        Verdict.UPSTREAM_DISCONNECTED, "the inference server closed the connection"
    )


def _invalid(exc: ProtocolError) -> UpstreamError:
    return UpstreamError(
        Verdict.UPSTREAM_INVALID_RESPONSE, f"the inference server's response is invalid: {exc}"
    )


class BodySink(Protocol):
    """Where a connection pushes its response body. Called from ``data_received``."""

    def body(self, piece: bytes) -> None:
        """One decoded piece of the body, as soon as its read arrived."""

    def chunk(self, frame: bytes, piece: bytes) -> None:
        """Like :meth:`body`, for a read that was exactly one well-formed chunk: ``frame``
        is that chunk as received (size line, ``piece``, CRLF)."""

    def chunks(self, frames: bytes, pieces: list[bytes]) -> None:
        """Like :meth:`chunk`, for a read that was several whole, well-formed chunks:
        ``frames`` is the read as received, ``pieces`` their payloads in order."""

    def several(self, pieces: list[bytes]) -> None:
        """Several body pieces from one read, not (all) whole chunks: written on at once."""

    def end(self, error: Verdict | None) -> None:
        """Called exactly once (or :meth:`last` instead): ``None`` when the body is complete,
        else the verdict (``UPSTREAM_DISCONNECTED``, ``UPSTREAM_READ_TIMEOUT``,
        ``UPSTREAM_INVALID_RESPONSE``, or ``INTERNAL`` for the sidecar's own failure)."""

    def last(self, pieces: list[bytes], frames: bytes | None = None) -> None:
        """The body's last pieces, from the read that completed it, and its end: what
        :meth:`several` then ``end(None)`` do, in one write where the client's body is
        chunked (its last chunk goes with them, not in a write of its own). ``frames``: the
        read as received when it was whole, well-formed chunks ending with the last chunk
        exactly (as :meth:`chunks` has it), else None."""


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection, carrying one request at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._time = pool.loop.time
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.head: ResponseHead | None = None
        self.idle_since = 0.0
        # The current response's parser (the relay reads its ``between_chunks`` after each
        # read it took, to know whether a token lane may take the next one).
        self.parser: ResponseParser | None = None
        self._head_waiter: asyncio.Future[ResponseHead] | None = None
        # Told of the head from the read that completed it, instead of its waiter (begin).
        self._on_head: Callable[[UpstreamConnection], None] | None = None
        self._early: list[bytes] = []  # body pieces that arrived before push() was called
        self._received = 0  # response bytes seen for the current request
        self._sink: BodySink | None = None
        # The sink's open token lane (sidecar/relay/data/token_lane.py), while it has one.
        self._lane: TokenLane | None = None
        self._ended = False
        self._end_error: Verdict | None = None
        self._body_writer: asyncio.Task[None] | None = None
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._reading_paused = False
        self._yielding = False  # reading paused until the loop's next turn (_yield_turn)
        self._write_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP (or TLS) connection's

    @property
    def answered(self) -> bool:
        """Whether any byte of the current response has arrived: a reused connection the
        server closed before answering may be retried once on a new one."""
        return self._received > 0

    def silent_seconds(self) -> float:
        """Seconds since the upstream last sent a byte of the current request's answer (0
        while reading is paused: the wait is the client's). Read at scrape time, from any
        thread: two float reads, nothing on the read path."""
        if self._reading_paused:
            return 0.0
        return max(0.0, self._time() - self._last_read)

    def data_received(self, data: bytes) -> None:
        self._last_read = self._time()
        sink = self._sink
        if sink is not None:
            # The hot path: decode the framing and hand the body on, nothing else.
            parser = self.parser
            try:
                lane = self._lane
                if lane is not None:
                    if lane.take(data):
                        return  # a steady token, relayed and noted (token_lane.py)
                    # The Python path takes this read: it reads and may change what the lane
                    # noted, so the lane hands its notes over now (the sink opens it again).
                    self._lane = None
                    lane.flush()
                if parser.between_chunks:  # type: ignore[union-attr]  # a sink: a parser
                    # The usual read, one whole chunk (the parser's rule: http1.py)
                    piece = chunk_payload(data)
                    if piece is not None:
                        sink.chunk(data, piece)
                        return
                pieces = parser.whole_chunks(data)  # type: ignore[union-attr]  # a sink: a parser
                if pieces is not None:  # several whole chunks in one read (a busy upstream)
                    if parser.done:  # type: ignore[union-attr]  # a sink: a parser
                        self._end(None, pieces, data)  # and the last chunk: the body's end
                    else:
                        sink.chunks(data, pieces)
                    return
                pieces = parser.feed(data)  # type: ignore[union-attr]  # a sink: a parser
                if parser.done:  # type: ignore[union-attr]  # a sink: a parser
                    self._end(None, pieces)  # the body's end came in this read
                    return
                if len(pieces) == 1:
                    sink.body(pieces[0])
                elif pieces:  # one write to the client for the whole read, not one per piece
                    sink.several(pieces)
            except ProtocolError as exc:
                for piece in exc.pieces:  # the valid bytes before the fault still go through
                    sink.body(piece)
                self._end(Verdict.UPSTREAM_INVALID_RESPONSE)
                return
            except Exception:  # a bug in the sink must not kill the event loop's callback
                _log.exception("relay_sink_failed")
                self._end(Verdict.INTERNAL)
                return
            if len(data) >= YIELD_AFTER_READ:  # (a read that ended the body returned above)
                self._yield_turn()
            return
        self._received += len(data)
        parser = self.parser
        if parser is None or self._ended:
            # Bytes while idle in the pool, or after the response ended: not a response to
            # anything we asked. The connection cannot be trusted any more.
            self.close()
            return
        try:
            self._early.extend(parser.feed(data))
        except ProtocolError as exc:
            if parser.head is None:
                self._fail_head(_invalid(exc))
                return
            # The head is complete: the body is what broke. The head still goes to the
            # relay, then every valid byte, then the cut.
            self._early.extend(exc.pieces)
            self._end(Verdict.UPSTREAM_INVALID_RESPONSE)
        if parser.done:
            self._cancel_timer()  # complete: nothing left to time out while push() is pending
        if parser.head is not None and self._head_waiter is not None:
            waiter, self._head_waiter = self._head_waiter, None
            if not waiter.done():
                self.head = parser.head
                on_head, self._on_head = self._on_head, None
                if on_head is None:
                    waiter.set_result(parser.head)
                else:  # (the last thing this read does: the relay may push, even end, in it)
                    on_head(self)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost does the accounting

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool._forget(self)
        self._cancel_timer()
        if self._write_waiter is not None and not self._write_waiter.done():
            self._write_waiter.set_exception(ConnectionResetError("upstream connection lost"))
        parser = self.parser
        if self._head_waiter is not None:
            if parser is not None and parser.head is None:
                self._fail_head(_disconnected())
            return
        if parser is None or self._ended:
            return
        try:
            pieces = parser.feed_eof()
        except ProtocolError:
            self._end(Verdict.UPSTREAM_DISCONNECTED)
            return
        if self._sink is None:
            self._early.extend(pieces)  # a close-delimited body that ended before push()
            return
        self._end(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        waiter, self._write_waiter = self._write_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- used by the pool and the relay ---------------------------------------------------

    def begin(
        self, no_body: bool, on_head: Callable[[UpstreamConnection], None] | None = None
    ) -> asyncio.Future[ResponseHead]:
        """Start a request/response exchange: returns the future of the response head. With
        ``on_head``, the head is told to it from the read that completed it (no loop turn
        before the relay takes the response), and the future only ever fails: a head that
        could not be had (timeout, a close, an invalid one) is its exception still."""
        self.parser = ResponseParser(no_body=no_body)
        self.head = None
        self._early = []
        self._received = 0
        self._sink = None
        self._lane = None
        self._ended = False
        self._end_error = None
        self._body_writer = None
        self._head_waiter = self._loop.create_future()
        self._on_head = on_head
        self._last_read = self._time()
        self._arm_timer()
        return self._head_waiter

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("upstream connection lost")
        if self._writing_paused:
            self._write_waiter = self._loop.create_future()
            await self._write_waiter

    def set_lane(self, lane: TokenLane | None) -> None:
        """While the current sink is pushed to: ``lane.take(read)`` is tried first for each
        read, and True means it relayed and noted that read (sidecar/relay/data/token_lane.py).
        Dropped (after a flush) at the first read it does not take, and at the end."""
        self._lane = lane if self._sink is not None else None

    def push(self, sink: BodySink) -> None:
        """Switch to pushing the body to ``sink``: first what already arrived, then each read
        as it comes. ``sink.end`` is called once, possibly before this returns."""
        self._sink = sink
        early, self._early = self._early, []
        parser = self.parser
        if not self._ended and parser is not None and parser.done:
            self._end(None, early)  # all of it came before the relay was ready
            return
        for piece in early:
            sink.body(piece)
        if self._ended:  # the end came before the relay was ready for it
            self._sink = self._lane = None
            sink.end(self._end_error)
        elif self.closed:
            self._end(Verdict.UPSTREAM_DISCONNECTED)

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = True
            if not self._yielding:
                self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = False
            self._last_read = self._time()  # the wait was the client's, not the upstream's
            if not self._yielding:
                self.transport.resume_reading()

    def _yield_turn(self) -> None:
        """After a large read, stop reading until the event loop's next turn.

        An upstream sending faster than it is relayed fills every read; libuv then reads
        the same socket again and again (up to 32 full reads) before it looks at any other
        socket or timer, so one fast stream of tiny events held uvloop for over half a
        second at a time while probes and other clients wait. Pausing for one
        turn lets everything else ready run between two reads. Only full reads pay for it;
        a token stream's reads are a few hundred bytes."""
        if self._yielding or self._reading_paused or self.transport is None or self.closed:
            return
        self._yielding = True
        self.transport.pause_reading()
        self._loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._yielding = False
        if not self._reading_paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    @property
    def reusable(self) -> bool:
        parser = self.parser
        return (
            not self.closed
            and self._ended
            and parser is not None
            and parser.keep_alive
            and not self._reading_paused
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def close(self) -> None:
        self._cancel_timer()
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True
        self._pool._forget(self)

    def finished_exchange(self) -> None:
        """The relay is done with this response (whatever happened)."""
        self._sink = self._lane = None
        self._ended = True
        if self._timer is not None:  # (a response that ended has cancelled it already)
            self._cancel_timer()
        writer, self._body_writer = self._body_writer, None
        if writer is not None and not writer.done():
            writer.cancel()  # the server answered before reading the whole body
            self.close()
        elif self.parser is None or not self.parser.done:
            self.close()  # how the server learns to stop generating for a gone client

    # -- internals -------------------------------------------------------------------------

    def _end(
        self, error: Verdict | None, last: list[bytes] | None = None, frames: bytes | None = None
    ) -> None:
        """The response ended (``error`` None: complete); ``last``, the pieces of the read
        that completed it, go to the sink with its end (``BodySink.last``, with ``frames``
        when that read was whole chunks)."""
        if self._ended:
            return
        self._ended = True
        self._end_error = error
        self._cancel_timer()
        sink, self._sink = self._sink, None
        self._lane = None
        if error is not None:
            self.close()
        if sink is None:
            return
        if last is None:
            sink.end(error)
        else:
            sink.last(last, frames)

    def _fail_head(self, error: UpstreamError) -> None:
        waiter, self._head_waiter = self._head_waiter, None
        self._ended = True
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _arm_timer(self) -> None:
        timeout = self._pool.read_timeout
        if timeout is not None and self._timer is None:
            self._timer = self._loop.call_at(self._last_read + timeout, self._idle_check)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle_check(self) -> None:
        self._timer = None
        if self._ended or self.closed or (self.parser is not None and self.parser.done):
            return
        if self._reading_paused:
            self._last_read = self._time()
        elif self._time() >= self._last_read + self._pool.read_timeout:  # type: ignore[operator]  # armed: set
            if self._head_waiter is not None:
                self._fail_head(_timeout())
            else:
                self._end(Verdict.UPSTREAM_READ_TIMEOUT)
            return
        self._arm_timer()


class Sent(NamedTuple):
    """A request :meth:`UpstreamPool.send_now` wrote, awaiting its answer."""

    conn: UpstreamConnection
    waiter: asyncio.Future[ResponseHead]
    method: str
    head: bytes
    body: bytes | None
    retry: bool


class UpstreamPool:
    """Keep-alive connections to one upstream base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        read_timeout: float | None,
        keepalive_seconds: float = 4.0,
        max_idle: int = 256,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"unsupported upstream URL {base_url!r}")
        self.loop = loop or asyncio.get_running_loop()
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default_port = (parts.scheme == "https" and self.port == 443) or (
            parts.scheme == "http" and self.port == 80
        )
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._keepalive = keepalive_seconds
        self._max_idle = max_idle
        self._idle: list[UpstreamConnection] = []
        self._all: set[UpstreamConnection] = set()
        self._closing = False

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | AsyncIterable[bytes] | None,
        on_sent: Callable[[], None] | None = None,
    ) -> UpstreamConnection:
        """Send a request; return its connection once the response head arrived (``.head``).
        Raises :class:`UpstreamError`; a streamed body's own exception propagates.
        ``on_sent`` is called once a whole (bytes or absent) body and its head were written
        to the socket: how the proxy measures its own cost."""
        head, chunked_body, retry = self._framed(method, target, headers, body)
        return await self._answered(None, method, head, body, chunked_body, retry, on_sent)

    def send_now(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        on_head: Callable[[UpstreamConnection], None] | None = None,
    ) -> Sent | None:
        """Write a request with a whole body on an idle keep-alive connection at once, with
        no await: None (nothing written) when no connection is idle. Awaiting
        :meth:`response` with the result gives what :meth:`request` returns, the one retry
        on a fresh connection included (with ``on_head``, its head is told to it from the
        connection's read instead, and the result's waiter only ever fails:
        :meth:`UpstreamConnection.begin`). This is how a request reaches the server from
        inside the client connection's callbacks (sidecar/relay/data/upstream_request.py)."""
        if self._closing or not self._idle:
            return None
        head, chunked_body, retry = self._framed(method, target, headers, body)
        conn = self._take_idle()
        if conn is None:
            return None
        waiter = self._send(conn, method, head, body, on_head)
        return Sent(conn, waiter, method, head, body, retry)

    async def response(self, sent: Sent) -> UpstreamConnection:
        """The connection of a request :meth:`send_now` wrote, once its response head arrived."""
        return await self._answered(
            sent, sent.method, sent.head, sent.body, False, sent.retry, None
        )

    def _framed(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | AsyncIterable[bytes] | None,
    ) -> tuple[bytes, bool, bool]:
        """The request head's bytes, whether the body goes out chunked, and whether the
        request may be repeated on a fresh connection (:func:`_replayable`)."""
        headers = list(headers)
        names = lowered_names(headers)
        has_length = "content-length" in names
        chunked_body = streamed = False
        if isinstance(body, bytes):
            if has_length:
                raise ValueError("a bytes body gets its Content-Length here")
            headers += (("Content-Length", str(len(body))),)
        elif body is None:
            if method not in _BODYLESS_METHODS and not has_length:
                headers += (("Content-Length", "0"),)
        else:
            streamed = True
            if not has_length:
                headers += (("Transfer-Encoding", "chunked"),)
                chunked_body = True
        # "*" (OPTIONS *) names the server itself, never a path under the base URL.
        head = request_head(
            method, target if target == "*" else self.base_path + target, self.host_header, headers
        )
        return head, chunked_body, _replayable(method, names, streamed)

    async def _answered(
        self,
        sent: Sent | None,
        method: str,
        head: bytes,
        body: bytes | AsyncIterable[bytes] | None,
        chunked_body: bool,
        retry: bool,
        on_sent: Callable[[], None] | None,
    ) -> UpstreamConnection:
        fresh = False
        conn: UpstreamConnection | None
        while True:
            if sent is not None:  # already written by send_now: only its answer is awaited
                conn, waiter, sent = sent.conn, sent.waiter, None
            else:
                if self._closing:
                    raise _disconnected()
                conn = None if fresh else self._take_idle()
                if conn is None:
                    conn = await self._connect()
                waiter = None
            try:
                if waiter is None:
                    return await self._exchange(conn, method, head, body, chunked_body, on_sent)
                return await self._await_head(conn, waiter, None)
            except UpstreamError as exc:
                if (
                    retry
                    and conn.reused
                    and exc.verdict is Verdict.UPSTREAM_DISCONNECTED
                    and not conn.answered
                ):
                    # The server closed a keep-alive connection as we reused it. Once, on
                    # a new connection.
                    retry, fresh = False, True
                    continue
                raise
            except BaseException:
                conn.close()
                raise

    def release(self, conn: UpstreamConnection) -> None:
        """The relay is done with ``conn``: keep it for the next request if it can be."""
        conn.finished_exchange()
        if conn.reusable and not self._closing and len(self._idle) < self._max_idle:
            conn.idle_since = self.loop.time()
            conn.reused = True
            self._idle.append(conn)
        else:
            conn.close()

    async def close(self) -> None:
        self._closing = True
        for conn in list(self._all):
            conn.close()
        self._idle.clear()

    # -- internals -------------------------------------------------------------------------

    async def _exchange(
        self,
        conn: UpstreamConnection,
        method: str,
        head: bytes,
        body: bytes | AsyncIterable[bytes] | None,
        chunked_body: bool,
        on_sent: Callable[[], None] | None = None,
    ) -> UpstreamConnection:
        if body is None or isinstance(body, bytes):
            waiter = self._send(conn, method, head, body)
            if on_sent is not None:
                on_sent()
            return await self._await_head(conn, waiter, None)
        waiter = conn.begin(no_body=method == "HEAD")
        conn.write(head)
        writer = conn._body_writer = self.loop.create_task(_send_body(conn, body, chunked_body))
        return await self._await_head(conn, waiter, writer)

    @staticmethod
    def _send(
        conn: UpstreamConnection,
        method: str,
        head: bytes,
        body: bytes | None,
        on_head: Callable[[UpstreamConnection], None] | None = None,
    ) -> asyncio.Future[ResponseHead]:
        """Start the exchange and write a head with its whole (or no) body."""
        waiter = conn.begin(method == "HEAD", on_head)
        if body and len(body) > 1 << 16:
            conn.write(head)  # no joined copy of a large body; the transport sends both
            conn.write(body)
        else:
            conn.write(head + body if body else head)
        return waiter

    @staticmethod
    async def _await_head(
        conn: UpstreamConnection,
        waiter: asyncio.Future[ResponseHead],
        writer: asyncio.Task[None] | None,
    ) -> UpstreamConnection:
        try:
            if writer is None:
                await waiter
            else:
                # The body is sent while we wait: a server may answer before reading it all.
                await asyncio.wait((waiter, writer), return_when=asyncio.FIRST_COMPLETED)
                if not waiter.done():
                    await writer  # raises if sending failed (e.g. the body was refused)
                    await waiter
                waiter.result()
        except BaseException:
            if writer is not None and not writer.done():
                writer.cancel()
            if not waiter.done():
                waiter.cancel()
            raise
        return conn

    def _take_idle(self) -> UpstreamConnection | None:
        now = self.loop.time()
        while self._idle:
            conn = self._idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                conn.close()
                continue
            if now - conn.idle_since > self._keepalive:
                conn.close()
                # Older ones are staler still. Detach the list first: close() -> _forget()
                # removes from self._idle, and iterating the list it shrinks skips every
                # other connection (which clear() then dropped unclosed: a leak).
                stale, self._idle = self._idle, []
                for old in stale:
                    old.close()
                return None
            return conn
        return None

    async def _connect(self) -> UpstreamConnection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await self.loop.create_connection(
                    lambda: UpstreamConnection(self),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )
        except TimeoutError:
            raise _timeout() from None
        except (OSError, ssl.SSLError) as exc:
            raise _unreachable(exc, self.host, self.port) from None
        self._all.add(conn)
        return conn

    def _forget(self, conn: UpstreamConnection) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)


def _replayable(method: str, names: list[str], streamed: bool) -> bool:
    """Whether a request may be sent again after a reused connection closed before any
    response byte. As Go's net/http decides: the closing server may have read the request
    and died working on it, so only an idempotent method or a request carrying an
    idempotency key is repeated, and only if its body can be sent again. A POST is never
    repeated; the pool's keep-alive limit, shorter than the usual servers', is what keeps
    that race rare. ``names``: the request's field names, lowered; ``streamed``: its body
    is sent as it comes (not bytes, not none), so it cannot be sent again."""
    if streamed:
        return False
    if method in _IDEMPOTENT_METHODS:
        return True
    return "idempotency-key" in names or "x-idempotency-key" in names


async def _send_body(conn: UpstreamConnection, body: AsyncIterable[bytes], chunked: bool) -> None:
    async for piece in body:
        if not piece:
            continue
        if conn.closed:
            return  # the server is gone; the head waiter reports it
        conn.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
        await conn.drain()
    if chunked and not conn.closed:
        conn.write(b"0\r\n\r\n")
