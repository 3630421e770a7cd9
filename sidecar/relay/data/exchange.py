"""Every request on the proxy port, carried from its client connection's own callbacks: the
relay's one way in.

aiohttp hands a parsed request to a handler task two event-loop turns after the read that
completed it, and answers it through a ``Request``, a ``StreamResponse`` and a last loop
turn to wind it down. Each turn first runs every other callback ready: under 200 streams
that was 187 µs at the median and 2.1 ms at p99 from the read to the handler, and as much
again of the handler's own setup before the upstream had the request (docs/performance.md).

So the proxy port's connection
(:class:`~sidecar.relay.server.proxy_port.ProxyConnection`, the sidecar's own over
aiohttp's parser) hands every request head the parser completes, in order, to the
:class:`Carrier`. Each request becomes an :class:`Exchange`, which owns it from then
to its verdict: the rest of its body, its record
(:class:`~sidecar.measure.record.RecordBook`: timeline, labels, span, opened here), the
upstream request, the response head and body
(:class:`~sidecar.relay.data.body_relay.BodyRelay`), the wait for the client to take it, the
verdict (given once, here), and handing the connection back for its next request. Every
step runs from a callback: the client's reads, the upstream's head and body reads, the
client's transport draining, a timer. No task runs for it, unless no pooled upstream
connection is idle (then one connects and sends it) or its body is streamed (a task sends
it as it comes).

What the head says of the body (sidecar/relay/data/request_body.py): refused at once (405,
413, 400, 501, 417), none, held whole (a known API route's JSON within
``max_request_inspect_bytes``, read for its fields), or streamed. Before any of it, two
answers of the sidecar's own, with nothing sent upstream and nothing recorded: its own probe
come back through a loop (508, sidecar/relay/control/self_loop.py) and a new request in the
drain's second step (503, sidecar/relay/server/drain.py). While the pod drains, every answer
says the connection closes.

Faults map to what a client can act on:

- upstream refused / unreachable / broken before headers -> 502 with a JSON error body;
  a connect or read timeout before headers -> 504;
- upstream dies or stalls past the idle timeout mid-stream -> the client connection is
  closed after flushing what was relayed: a truncated stream, never a false clean end;
- client goes away -> the upstream request is stopped at once (the server stops
  generating); outcome ``cancelled`` with the partial figures;
- client stops taking bytes for ``send_timeout`` -> the upstream request is stopped and
  the client connection aborted; outcome ``cancelled``, error type ``client_send_timeout``.
  After each response the relay also waits for the client to take it, so a client that
  pipelines requests without reading gets no further request forwarded;
- request body larger than ``max_request_body_bytes`` -> 413: before the upstream is asked
  when ``Content-Length`` says so (also in answer to ``Expect: 100-continue``, so the
  client never sends it), else as soon as a chunked body passes the limit (the upstream
  then sees its request cut off, never a complete one);
- request body stalls for ``client_body_timeout`` between two reads -> 408 (a streamed body
  is cut off as above). This also bounds a body whose framing breaks mid-way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Protocol

import structlog
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestPayloadError

from ...base.outcomes import Verdict
from ...base.routes import Route, match_route
from ...measure.observe import ResponseObserver
from ...measure.request_fields import RequestFieldScanner, scan_request_fields
from ..server.errors import raw_error_response
from .body_budget import BodyBudget
from .body_relay import BodyRelay
from .client_head import client_head
from .client_pace import ClientPace
from .forwarded import forwarded_headers, peer_address
from .http1 import ResponseHead
from .limits import RelayLimits
from .request_body import (
    BodyRefused,
    BoundedBody,
    has_body,
    holds_whole,
    late_fields,
    malformed,
    refusal,
    stalled,
    upstream_target,
)
from .upstream import Sent, UpstreamConnection, UpstreamError, UpstreamPool

if TYPE_CHECKING:
    from ...measure.record import RecordBook, RequestRecord

__all__ = ["Carrier", "ClientConnection", "DrainState", "Exchange"]

_log = structlog.get_logger("sidecar.proxy")

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class ClientConnection(Protocol):
    """What an exchange needs of the client connection that carries it."""

    transport: asyncio.Transport | None

    @property
    def writing_paused(self) -> bool:
        """The client's transport is past its high-water mark (``resume_writing`` to come)."""

    def carried_done(self, exchange: Exchange, keep_alive: bool) -> None:
        """The exchange is over: the connection takes its next request, or closes."""


class DrainState(Protocol):
    """What the relay asks of the drain (sidecar/relay/server/drain.py)."""

    draining: bool  # every answer closes its connection
    refusing: bool  # step 2: new requests are answered 503

    def refusal(self, method: str, peer: str | None) -> bytes: ...


class _NotDraining:
    draining = refusing = False

    def refusal(self, method: str, peer: str | None) -> bytes:  # pragma: no cover - never refusing
        raise AssertionError("not draining")


class Carrier:
    """Makes the :class:`Exchange` of each request head on the proxy port, within the relay's
    ``limits``, on the ``pool`` (None until the proxy app started), into ``records``, holding
    bodies against ``budget``. ``refused(headers)`` is the sidecar's own answer to a request
    its head alone refuses before anything goes upstream (the loop check's 508), else None;
    ``drain`` (set once the sidecar has one) says whether answers close their connections
    and whether new requests are refused."""

    def __init__(
        self,
        records: RecordBook,
        pool: Callable[[], UpstreamPool | None],
        limits: RelayLimits,
        budget: BodyBudget,
        *,
        refused: Callable[[Mapping[str, str]], bytes | None] = lambda headers: None,
    ) -> None:
        self.records = records
        self.pool = pool
        self.limits = limits
        self.budget = budget
        self.refused = refused
        self.drain: DrainState = _NotDraining()
        self.clock = records.clock

    def __call__(
        self, connection: ClientConnection, message: RawRequestMessage, payload: StreamReader
    ) -> Exchange:
        """``message``/``payload``: aiohttp's parsed head and body stream of the next request
        on ``connection`` (its body may still be arriving)."""
        return Exchange(self, connection, message, payload)


class Exchange:
    """One request, from its head to its verdict (the module doc). The connection calls
    :meth:`start` once it took the request off its queue, :meth:`body_arrived` after
    each read while the body is still coming, :meth:`client_drained` when its transport
    drains and :meth:`client_gone` when it is lost. ``sent``/``pending``: how the request is
    on its way upstream (written on an idle pooled connection, or a task connecting or
    streaming its body)."""

    __slots__ = (
        "_start", "_path_model", "_carrier", "_connection", "_pool", "_message", "_payload", "_route", "_parts",
        "_reserved", "_holding", "_streamed", "_record", "_conn", "_relay", "_observer", "_timer", "_deadline", "_pace", "_waiting",
        "_head_written", "_verdict", "_taking", "keep_alive", "sent", "pending", "done",
    )  # fmt: skip

    def __init__(
        self,
        carrier: Carrier,
        connection: ClientConnection,
        message: RawRequestMessage,
        payload: StreamReader,
    ) -> None:
        self._start = carrier.clock()  # the head is in: the request's time starts here
        self._carrier = carrier
        self._connection = connection
        self._pool: UpstreamPool | None = None
        self._message = message
        self._payload = payload
        self._route: Route
        self._route, self._path_model = match_route(message.url.path, message.method)
        self._parts: list[bytes] = []
        self._reserved = 0  # body bytes held against the body budget until sent
        self._holding = False  # the body is being read whole before it is sent
        self._streamed: BoundedBody | None = None  # a body streamed upstream, until answered
        self._record: RequestRecord | None = None
        self._conn: UpstreamConnection | None = None
        self._relay: BodyRelay | None = None  # until its end is taken (_relay_ended)
        self._observer: ResponseObserver | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._pace: ClientPace | None = None  # the client's progress, once a head is written
        self._waiting = False  # for the client to take what is queued for it
        self._head_written = False
        self._taking = False  # reading the body's buffered pieces (_take_body)
        self._verdict = Verdict.OK  # the upstream's status may make it an error
        # After an Upgrade the connection's bytes are no HTTP: it closes after the answer.
        self.keep_alive = not message.should_close and not message.upgrade
        self.sent: Sent | None = None
        self.pending: asyncio.Future[UpstreamConnection] | None = None
        self.done = False

    # -- the request ---------------------------------------------------------------------

    def start(self) -> None:
        self._guarded(self._begin)

    def _begin(self) -> None:
        """What the head says: an answer of the sidecar's own, or how the body goes."""
        carrier, message = self._carrier, self._message
        headers = message.headers
        own = carrier.refused(headers)
        if own is None and carrier.drain.refusing:
            own = carrier.drain.refusal(message.method, self._peer())
        if own is not None:  # nothing goes upstream, nothing is recorded
            self._answer_only(own)
            return
        self._pool = carrier.pool()
        limits = carrier.limits
        refused = refusal(message, limits)
        expect = headers.get("Expect") if message.version == HttpVersion11 else None
        if refused is None and expect is not None and expect.lower() != "100-continue":
            refused = 417, "expectation_failed", "only Expect: 100-continue is understood"
        if refused is not None:
            self._refuse(*refused)
            return
        if expect is not None:  # invite the body, as aiohttp's default handler does
            transport = self._connection.transport
            if transport is not None and not transport.is_closing():
                transport.write(CONTINUE)
        if not has_body(message):
            self._send(None)
            return
        payload = self._payload
        size = holds_whole(message.method, self._route, headers, limits.max_request_inspect_bytes)
        if size and (payload.is_eof() or carrier.budget.reserve(size)):
            self._reserved = 0 if payload.is_eof() else size
            self._holding = True
            self._take_body()
            return
        # Streamed; an API body streamed because held bodies are at their process-wide limit
        # (body_budget) has its fields read as it goes.
        self._stream(
            BoundedBody(
                payload,
                limits.max_request_body_bytes,
                limits.client_body_timeout,
                RequestFieldScanner() if size else None,
            )
        )

    def body_arrived(self) -> None:
        if self._holding:
            self._take_body()

    def _take_body(self) -> None:
        if self._taking or self._record is not None or self.done:
            # A read aiohttp's reader resumed from inside read_nowait (taken below), or the
            # body is in and sent already (the connection resumed reading before start()).
            return
        payload = self._payload
        self._taking = True
        try:
            while chunk := payload.read_nowait():  # taken as it comes: aiohttp's reader
                self._parts.append(chunk)  # pauses the socket past its buffer's limit
        except RequestPayloadError:  # its framing broke after the head: the client's error
            self._taking = False
            self._cancel_timer()
            self._guarded(self._refuse, *malformed())
            return
        except Exception:  # the body failed: the connection is going (client_gone follows)
            return
        finally:
            self._taking = False
        if payload.is_eof():
            self._cancel_timer()
            body = b"".join(self._parts)
            self._parts = []
            self._guarded(self._send, body)
            return
        timeout = self._carrier.limits.client_body_timeout
        self._deadline = self._carrier.clock() + timeout
        if self._timer is None:
            self._arm(timeout, self._body_stalled)

    def _body_stalled(self) -> None:
        self._timer = None
        if self._record is not None or self.done:
            return
        left = self._deadline - self._carrier.clock()
        if left > 0:
            self._arm(left, self._body_stalled)
            return
        self._guarded(self._refuse, *stalled(self._carrier.limits.client_body_timeout))

    def _peer(self) -> str:
        transport = self._connection.transport
        return peer_address(transport.get_extra_info("peername") if transport else None)

    def _open(self, body: bytes | None) -> RequestRecord:
        carrier = self._carrier
        if self._reserved:
            carrier.budget.release(self._reserved)
            self._reserved = 0
        fields = scan_request_fields(body) if body else None
        message = self._message
        return carrier.records.open(
            self._start, message.method, self._route, self._path_model, fields, message.headers
        )

    def _upstream_headers(
        self, record: RequestRecord, body_is_bytes: bool
    ) -> list[tuple[str, str]]:
        message = self._message
        transport = self._connection.transport
        assert transport is not None
        url = message.url
        # The host the request names: an absolute form's (RFC 9112 section 3.2.2), else the
        # Host field, else (HTTP/1.0) the address it came to, as aiohttp's request.host.
        host = (url.host or "") if url.absolute else message.headers.get("Host")
        if host is None:
            sockname = transport.get_extra_info("sockname")
            host = str(sockname[0]) if isinstance(sockname, tuple) else ""
        headers = forwarded_headers(
            message.headers,
            peer=self._peer(),
            scheme="https" if transport.get_extra_info("sslcontext") else "http",
            host=host,
            body_is_bytes=body_is_bytes,
        )
        self._carrier.records.trace_into(record, headers)
        return list(headers.items())

    def _send(self, body: bytes | None) -> None:
        """Send a request whose body is in (or that has none)."""
        record = self._record = self._open(body)
        record.timeline.body_received = self._carrier.clock()
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            self._finish(Verdict.CLIENT_DISCONNECTED)
            return
        pool = self._pool
        if pool is None:  # the proxy app has not started (or has stopped)
            self._fail(Verdict.INTERNAL, "the sidecar failed to relay the request")
            return
        headers = self._upstream_headers(record, body is not None)
        method, target = self._message.method, upstream_target(self._message)
        try:
            sent = pool.send_now(method, target, headers, body)
        except ValueError:  # a field line that cannot be written
            _log.exception("request_not_sendable")
            self._fail(Verdict.INTERNAL, "the request has a header field that cannot be relayed")
            return
        if sent is not None:
            record.timeline.upstream_sent = self._carrier.clock()
            self.sent = sent
            sent.waiter.add_done_callback(self._head_in)
        else:
            self._connect(pool.request(method, target, headers, body, self._mark_sent))

    def _stream(self, body: BoundedBody) -> None:
        """Send a request whose body streams upstream as it arrives (a task sends it)."""
        record = self._record = self._open(None)
        self._streamed = body
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            self._finish(Verdict.CLIENT_DISCONNECTED)
            return
        pool = self._pool
        if pool is None:
            self._fail(Verdict.INTERNAL, "the sidecar failed to relay the request")
            return
        headers = self._upstream_headers(record, False)
        message = self._message
        self._connect(pool.request(message.method, upstream_target(message), headers, body))

    def _mark_sent(self) -> None:
        if self._record is not None:
            self._record.timeline.upstream_sent = self._carrier.clock()

    def _connect(self, answer: Coroutine[object, object, UpstreamConnection]) -> None:
        """Await the answer in a task (no idle connection: one connects and sends it; a body
        streamed; or the pooled one was closed under it: the pool's one retry)."""
        self.pending = pending = asyncio.ensure_future(answer)
        pending.add_done_callback(self._answered)

    def _head_in(self, waiter: asyncio.Future[ResponseHead]) -> None:
        """The head of the answer on the pooled connection arrived, or it failed."""
        failed = waiter.cancelled() or waiter.exception() is not None
        if self.done:
            return
        sent = self.sent
        assert sent is not None
        if failed:  # the pool decides (a reused connection closed under it: once more)
            assert self._pool is not None
            self._connect(self._pool.response(sent))
            return
        self._guarded(self._respond, sent.conn)

    def _answered(self, pending: asyncio.Future[UpstreamConnection]) -> None:
        if pending.cancelled():
            return
        exc = pending.exception()
        if self.done:  # the client went: the answer is for nobody
            if exc is None:
                pending.result().close()
            return
        if isinstance(exc, BodyRefused):  # the streamed body broke a limit: cut off upstream
            self._guarded(self._refuse, *exc.refusal)
        elif isinstance(exc, UpstreamError):
            self._guarded(self._fail, exc.verdict, str(exc))
        elif exc is not None:
            _log.error("upstream_request_failed", exc_info=exc)
            self._guarded(self._fail, Verdict.INTERNAL, "the sidecar failed to relay the request")
        else:
            self._guarded(self._respond, pending.result())

    # -- the response --------------------------------------------------------------------

    def _respond(self, conn: UpstreamConnection) -> None:
        record = self._record
        assert record is not None and conn.head is not None  # answered once the head arrived
        self._conn = conn
        record.upstream = conn  # the live view asks it when the last byte came
        carrier, head, timeline = self._carrier, conn.head, record.timeline
        streamed, self._streamed = self._streamed, None
        if streamed is not None and streamed.fields is not None:
            late_fields(timeline, streamed.fields)
        observer = carrier.records.observe(record, self._route, head.status, head.headers)
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            observer.close(carrier.clock())
            self._finish(Verdict.CLIENT_DISCONNECTED)
            return
        # The upstream's head bytes (client_head); while draining, the connection closes after.
        message = self._message
        out = client_head(
            head,
            http11=message.version >= HttpVersion11,
            method=message.method,
            client_keep_alive=self.keep_alive and not carrier.drain.draining,
        )
        self.keep_alive = out.keep_alive
        transport.write(out.data)
        self._head_written = True
        pace = self._pace = ClientPace(transport, carrier.limits.send_timeout, carrier.clock())
        pace.written = len(out.data)
        timeline.client_head_sent = carrier.clock()
        if head.status >= 500:
            self._verdict = Verdict.UPSTREAM_STATUS
        self._observer = observer
        relay = self._relay = BodyRelay(
            transport, conn, observer, carrier.clock, carrier.limits.send_timeout, out.chunked,
            on_wake=self._relay_woke, pace=pace,
        )  # fmt: skip
        relay.start()

    def _relay_woke(self) -> None:
        """The relay ended, or it paused the upstream: the client's buffer is full."""
        relay = self._relay
        if relay is None or self.done or self._waiting:
            return
        if relay.ended is not None:
            self._guarded(self._relay_ended, relay)
        elif relay.paused:
            self._wait_for_client()

    def _relay_ended(self, relay: BodyRelay) -> None:
        self._relay = None
        relay.settle()
        if self._observer is not None:
            self._observer.close(self._carrier.clock())
        ended = relay.ended
        if ended is Verdict.OK:
            self._wait_for_client()
        elif ended is Verdict.CLIENT_SEND_TIMEOUT:
            self._stalled_reader()
        else:
            # Flush what was relayed, then close: a truncated stream, never a false clean end.
            self.keep_alive = False
            self._finish(Verdict.CLIENT_DISCONNECTED if ended is None else ended)

    # -- the client's pace ---------------------------------------------------------------

    def _wait_for_client(self) -> None:
        """Wait for the client to take what is queued for it (the transport's
        ``resume_writing``: :meth:`client_drained`), for as long as it makes progress by the
        one rule (client_pace.py): a client that takes nothing for ``send_timeout`` is let
        go. Without this wait at the end, a client that pipelines requests and never reads
        would get each next one forwarded while the answers pile up in memory."""
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            self._gone()
            return
        pace = self._pace
        if (
            pace is None
            or not transport.get_write_buffer_size()
            or not self._connection.writing_paused
        ):
            self._carry_on()
            return
        self._waiting = True
        self._arm(pace.wait(self._carrier.clock()), self._progress)

    def client_drained(self) -> None:
        if self._waiting and not self.done:
            self._waiting = False
            self._cancel_timer()
            self._guarded(self._carry_on)

    def _progress(self) -> None:
        self._timer = None
        if not self._waiting or self.done:
            return
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            self._waiting = False
            self._gone()
            return
        pace = self._pace
        assert pace is not None
        now = self._carrier.clock()
        if pace.alive(now):  # it took something within the time: a slow reader keeps its stream
            self._arm(pace.wait(now), self._progress)
            return
        self._waiting = False
        relay = self._relay
        if relay is not None and relay.ended is None:
            # The server stops generating for a reader that stopped.
            relay.stop(Verdict.CLIENT_SEND_TIMEOUT)
        else:
            self._stalled_reader()

    def _carry_on(self) -> None:
        """The client took what was queued: the relay goes on (or ends, if its end came while
        it was paused), or the exchange is over."""
        relay = self._relay
        if relay is None:
            self._finish(self._verdict)
        elif relay.ended is None:
            relay.resumed()
        else:
            self._relay_ended(relay)

    def _stalled_reader(self) -> None:
        """The client stopped reading for ``send_timeout``: let it go (its unread bytes with
        it: abort, since close would wait to flush them, forever)."""
        self.keep_alive = False
        transport = self._connection.transport
        if transport is not None:
            transport.abort()
        self._finish(Verdict.CLIENT_SEND_TIMEOUT)

    def client_gone(self) -> None:
        """The client connection was lost: the upstream request is stopped (the server stops
        generating for nobody) and the request, if it was sent, recorded as cancelled."""
        if self.done:
            return
        self._cancel_timer()
        self._waiting = False
        if self._record is None:  # its body never came: nothing was sent, nothing to record
            self.done = True
            if self._reserved:
                self._carrier.budget.release(self._reserved)
                self._reserved = 0
            return
        relay = self._relay
        if relay is not None and relay.ended is None:
            relay.stop(Verdict.CLIENT_DISCONNECTED)  # wakes _relay_woke, which gives the verdict
            if self.done:
                return
        self._gone()

    def _gone(self) -> None:
        if self.sent is not None and self._conn is None:
            self.sent.conn.close()
        if self.pending is not None and not self.pending.done():
            self.pending.cancel()  # the pool closes the connection it was using
        relay = self._relay
        if relay is not None and relay.ended is None:
            relay.stop(Verdict.CLIENT_DISCONNECTED)
        self.keep_alive = False
        self._finish(Verdict.CLIENT_DISCONNECTED)

    # -- answers of the sidecar's own ----------------------------------------------------

    def _fail(self, verdict: Verdict, text: str) -> None:
        """No answer from the upstream: the sidecar's JSON error, outcome error."""
        status = verdict.answer_status or 502
        self._answer(status, verdict.error_type, text, keep_alive=self.keep_alive)
        self._finish(verdict)

    def _refuse(self, status: int, kind: str, text: str) -> None:
        """A client error the sidecar answers itself (refused by its head, or a body that
        stalled or grew past its limit): outcome ok with its 4xx code, as an upstream's 4xx
        is; the unread rest of the body is not wanted, so the connection closes after."""
        if self._record is None:
            self._record = self._open(None)
        self.keep_alive = False
        self._answer(status, kind, text, keep_alive=False)
        self._finish(Verdict.OK)

    def _answer_only(self, answer: bytes) -> None:
        """An answer of the sidecar's own to a request it neither sends nor records."""
        self.keep_alive = False
        transport = self._connection.transport
        if transport is not None and not transport.is_closing():
            self._head_written = True
            transport.write(answer)
        self._finish(Verdict.OK)

    def _answer(self, status: int, kind: str, text: str, *, keep_alive: bool) -> None:
        record = self._record
        if record is not None:
            record.timeline.response_started(self._carrier.clock(), status, streamed=False)
        transport = self._connection.transport
        if transport is None or transport.is_closing() or self._head_written:
            return
        self._head_written = True
        transport.write(
            raw_error_response(status, HTTPStatus(status).phrase, kind, text, keep_alive=keep_alive)
        )

    # -- the verdict ---------------------------------------------------------------------

    def _finish(self, verdict: Verdict) -> None:
        """The one verdict: the upstream connection back to the pool (or closed), the record
        given its outcome, and the client connection handed back."""
        if self.done:
            return
        self.done = True
        self._cancel_timer()
        relay, self._relay = self._relay, None
        if relay is not None:  # (only a failure of the sidecar's own ends it before its end)
            relay.settle()
        conn, self._conn = self._conn, None
        if conn is not None and self._pool is not None:
            # A complete keep-alive response returns the connection to the pool; anything else
            # closes it, which is how the server learns to stop generating for a gone client.
            self._pool.release(conn)
        record = self._record
        if record is not None:
            self._carrier.records.close(record, verdict)
        # Kept alive as the head told the client (a head written before the drain began said
        # so: the next request on it gets an answer that says the connection closes); else
        # the connection closes once what was written is flushed.
        self._connection.carried_done(self, self.keep_alive)

    def _guarded(self, step: Callable[..., None], *args: object) -> None:
        """Run one step from a callback: a bug in it never leaves the request hanging (the
        client gets a 500 if nothing was written yet, else the connection closes) and is
        recorded as the sidecar's own failure."""
        try:
            step(*args)
        except Exception:
            _log.exception("exchange_failed", step=getattr(step, "__name__", repr(step)))
            if self.done:
                return
            try:
                if self._record is None:
                    self._record = self._open(None)
                self.keep_alive = False
                relay = self._relay
                if relay is not None and relay.ended is None:
                    relay.stop(Verdict.INTERNAL)
                self._answer(
                    500,
                    Verdict.INTERNAL.error_type,
                    "the sidecar failed to relay the request",
                    keep_alive=False,
                )
            finally:
                self._finish(Verdict.INTERNAL)

    def _arm(self, delay: float, then: Callable[[], None]) -> None:
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(delay, then)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
