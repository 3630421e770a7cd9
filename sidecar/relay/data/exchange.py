"""Every request on the proxy port, carried from its client connection's own callbacks: the
relay's one way in.

The proxy port's connection (:class:`~sidecar.relay.server.proxy_port.ProxyConnection`, the
sidecar's own over aiohttp's parser) hands every request head the parser completes, in order,
to the :class:`Carrier`; no aiohttp ``Request``, handler task or ``StreamResponse`` stands
between a read and the upstream (docs/performance.md says what those loop turns cost). Each
request becomes an :class:`Exchange`, which owns its request leg: the rest of its body, its
record (:class:`~sidecar.measure.record.RecordBook`: timeline, labels, span, opened here) and
the upstream request. Once the upstream's head is in, the response leg
(:class:`~sidecar.relay.data.body_relay.BodyRelay`) owns the client's transport: the head and
body, the client's pace, the wait for the client to take it all, carry-on or close.

An exchange is in one :class:`ExchangeState` at a time, and ends through one of two doors: a
failure before any response head was written (the sidecar's own answer, if the client is
still there), or the response leg's end. Either hands one
:class:`~sidecar.base.outcomes.Verdict` to the record and the connection back for its next
request. Every step runs from a callback: the client's reads, the upstream's head and body
reads, the client's transport draining, a timer. No task runs for it, unless no pooled
upstream connection is idle (then one connects and sends it) or its body is streamed (a task
sends it as it comes).

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
  the client connection aborted; outcome ``cancelled``, error type ``client_send_timeout``;
- request body larger than ``max_request_body_bytes`` -> 413: before the upstream is asked
  when ``Content-Length`` says so (also in answer to ``Expect: 100-continue``, so the
  client never sends it), else as soon as a chunked body passes the limit (the upstream
  then sees its request cut off, never a complete one);
- request body stalls for ``client_body_timeout`` between two reads -> 408 (a streamed body
  is cut off as above). This also bounds a body whose framing breaks mid-way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from enum import Enum
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING, Protocol

import structlog
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader

from ...base.outcomes import Verdict
from ...base.routes import Route, match_route
from ...measure.request_fields import RequestFieldScanner, scan_request_fields
from ..server.errors import raw_error_response
from .body_budget import BodyBudget
from .body_relay import BodyRelay
from .client_head import client_head
from .forwarded import ClientPeer, peer_of, request_headers
from .limits import RelayLimits
from .request_body import (
    BodyRefused,
    BoundedBody,
    HeldBody,
    Refusal,
    head_says,
    late_fields,
    upstream_target,
)
from .upstream import UpstreamConnection, UpstreamError, UpstreamPool
from .upstream_request import UpstreamRequest

if TYPE_CHECKING:
    from ...measure.record import RecordBook, RequestRecord

__all__ = ["Carrier", "ClientConnection", "DrainState", "Exchange", "ExchangeState"]

_log = structlog.get_logger("sidecar.proxy")

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_FAILED = "the sidecar failed to relay the request"


class ClientConnection(Protocol):
    """What an exchange needs of the client connection that carries it."""

    transport: asyncio.Transport | None
    peer: ClientPeer | None  # who it is to the upstream: made at its first request, kept

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


class ExchangeState(Enum):
    """Where a request is; each moves only forward."""

    RECEIVING = "receiving"  # its head is in; a body held whole is being read
    SENDING = "sending"  # on its way upstream (a streamed body still coming): no answer yet
    RELAYING = "relaying"  # the upstream's head is in: the response leg owns the rest
    DONE = "done"  # its verdict is given and the connection handed back


RECEIVING, SENDING, RELAYING, DONE = ExchangeState


class Exchange:
    """One request's request leg, from its head to its verdict (the module doc). The
    connection calls :meth:`start` once it took the request off its queue, :meth:`body_arrived`
    after each read while the body is still coming, :meth:`client_drained` when its transport
    drains and :meth:`client_gone` when it is lost. How the request is asked of the pool is
    its :class:`~sidecar.relay.data.upstream_request.UpstreamRequest`'s."""

    __slots__ = (
        "_start", "_carrier", "_connection", "_pool", "_message", "_payload", "_route",
        "_path_model", "_held", "_streamed", "_record", "asked", "_conn", "_leg", "state",
        "keep_alive",
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
        self._held: HeldBody | None = None  # a body read whole before it is sent
        self._streamed: BoundedBody | None = None  # a body streamed upstream, until answered
        self._record: RequestRecord | None = None  # opened as the request goes upstream
        self.asked: UpstreamRequest | None = None  # how it was asked of the pool, once it was
        self._conn: UpstreamConnection | None = None  # the upstream connection that answered
        self._leg: BodyRelay | None = None  # the response leg, from RELAYING
        self.state = RECEIVING
        # After an Upgrade the connection's bytes are no HTTP: it closes after the answer.
        self.keep_alive = not message.should_close and not message.upgrade

    # -- receiving -----------------------------------------------------------------------

    def start(self) -> None:
        self._guarded(self._begin)

    def _begin(self) -> None:
        """What the head says: an answer of the sidecar's own, or how the body goes."""
        carrier, message = self._carrier, self._message
        headers = message.headers
        own = carrier.refused(headers)
        if own is None and carrier.drain.refusing:
            own = carrier.drain.refusal(message.method, peer_of(self._connection.transport))
        if own is not None:  # nothing goes upstream, nothing is recorded
            self._end_early(Verdict.OK, own, keep_alive=False)
            return
        self._pool = carrier.pool()
        limits = carrier.limits
        says = head_says(message, self._route, limits)
        if says.refused is not None:
            self._refuse(says.refused)
            return
        if says.expect:  # invite the body, as aiohttp's default handler does
            transport = self._connection.transport
            if transport is not None and not transport.is_closing():
                transport.write(CONTINUE)
        if not says.body:
            self._send(None)
            return
        payload = self._payload
        size = says.hold
        if size and payload.is_eof():  # it came with its head: all of it in one read
            self._send(payload.read_nowait())
            return
        if size and carrier.budget.reserve(size):
            held = self._held = HeldBody(
                payload, carrier.budget, size, limits.client_body_timeout, carrier.clock,
                partial(self._guarded, self._send), partial(self._guarded, self._refuse),
            )  # fmt: skip
            held.take()
            return
        # Streamed; an API body streamed because held bodies are at their process-wide limit
        # (body_budget) has its fields read as it goes.
        scanner = RequestFieldScanner() if size else None
        body = BoundedBody(
            payload, limits.max_request_body_bytes, limits.client_body_timeout, scanner
        )
        self._send(None, body)

    def body_arrived(self) -> None:
        if self.state is RECEIVING and self._held is not None:
            self._held.take()

    def _open(self, body: bytes | None) -> RequestRecord:
        message = self._message
        fields = scan_request_fields(body) if body else None
        record = self._record = self._carrier.records.open(
            self._start, message.method, self._route, self._path_model, fields, message.headers
        )
        return record

    # -- sending -------------------------------------------------------------------------

    def _send(self, body: bytes | None, streamed: BoundedBody | None = None) -> None:
        """Send the request: its body in (or none), on an idle pooled connection at once,
        else from a task; or ``streamed``, a task sending its body as it comes."""
        record = self._open(body)
        self.state = SENDING
        self._held = None  # (all in: its bytes are no longer held against the budget)
        clock = self._carrier.clock
        if streamed is None:
            record.timeline.body_received = clock()
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            self._client_left()
            return
        pool = self._pool
        if pool is None:  # the proxy app has not started (or has stopped)
            self._fail(Verdict.INTERNAL, _FAILED)
            return
        message = self._message
        method, target = message.method, upstream_target(message)
        peer = self._connection.peer
        if peer is None:
            peer = self._connection.peer = ClientPeer(transport)
        fields = request_headers(message, peer, body_is_bytes=body is not None)
        self._carrier.records.trace_into(record, fields)
        headers = list(fields.items())
        asked = self.asked = UpstreamRequest(
            pool, partial(self._guarded, self._respond), self._failed, self._mark_sent
        )
        if streamed is not None:
            self._streamed = streamed
            asked.stream(method, target, headers, streamed)
            return
        try:
            if asked.send(method, target, headers, body):
                record.timeline.upstream_sent = clock()
        except ValueError:  # a field line that cannot be written
            _log.exception("request_not_sendable")
            self._fail(Verdict.INTERNAL, "the request has a header field that cannot be relayed")

    def _mark_sent(self) -> None:
        if self._record is not None:
            self._record.timeline.upstream_sent = self._carrier.clock()

    def _failed(self, error: BaseException) -> None:
        """No answer from the upstream: why."""
        if isinstance(error, BodyRefused):  # the streamed body broke a limit: cut off upstream
            self._guarded(self._refuse, error.refusal)
        elif isinstance(error, UpstreamError):
            self._guarded(self._fail, error.verdict, str(error))
        else:
            _log.error("upstream_request_failed", exc_info=error)
            self._guarded(self._fail, Verdict.INTERNAL, _FAILED)

    def _respond(self, conn: UpstreamConnection) -> None:
        """The upstream's head is in: the response leg takes over."""
        record = self._record
        head = conn.head
        assert record is not None and head is not None  # answered once the head arrived
        self._conn = conn
        record.upstream = conn  # the live view asks it when the last byte came
        carrier = self._carrier
        streamed, self._streamed = self._streamed, None
        if streamed is not None and streamed.fields is not None:
            late_fields(record.timeline, streamed.fields)
        observer = carrier.records.observe(record, self._route, head.status, head.headers)
        transport = self._connection.transport
        if transport is None or transport.is_closing():  # the answer is for nobody
            observer.close(carrier.clock())
            conn.close()  # (its server stops generating; an answer already whole is not kept)
            self._client_left()
            return
        # The upstream's head bytes (client_head); while draining, the connection closes after.
        message = self._message
        out = client_head(
            head,
            http11=message.version >= HttpVersion11,
            method=message.method,
            client_keep_alive=self.keep_alive and not carrier.drain.draining,
        )
        leg = self._leg = BodyRelay(
            transport, conn, observer, carrier.clock, carrier.limits.send_timeout, out.chunked,
            client=self._connection, on_end=self._finish, keep_alive=out.keep_alive,
            status=head.status,
        )  # fmt: skip
        self.state = RELAYING
        leg.start(out.data)

    # -- the client connection's news ------------------------------------------------------

    def client_drained(self) -> None:
        if self.state is RELAYING:
            assert self._leg is not None
            self._guarded(self._leg.client_drained)

    def client_gone(self) -> None:
        """The client connection was lost: whatever is on its way upstream is stopped (the
        server stops generating for nobody)."""
        state = self.state
        if state is RELAYING:
            assert self._leg is not None
            self._guarded(self._leg.client_gone)
        elif state is not DONE:
            self._client_left()

    # -- the first door: no response head was written ------------------------------------

    def _client_left(self) -> None:
        self._end_early(Verdict.CLIENT_DISCONNECTED, None, keep_alive=False)

    def _fail(self, verdict: Verdict, text: str) -> None:
        """No answer from the upstream: the sidecar's JSON error, outcome error."""
        status = verdict.answer_status or 502
        answer = self._error(status, verdict.error_type, text, self.keep_alive)
        self._end_early(verdict, answer, self.keep_alive)

    def _refuse(self, refused: Refusal) -> None:
        """A client error the sidecar answers itself (refused by its head, or a body that
        stalled or grew past its limit): outcome ok with its 4xx code, as an upstream's 4xx
        is; the unread rest of the body is not wanted, so the connection closes after."""
        if self.state is RECEIVING:  # (no record yet)
            self._open(None)
        self.keep_alive = False
        self._end_early(Verdict.OK, self._error(*refused, keep_alive=False), keep_alive=False)

    def _error(self, status: int, kind: str, text: str, keep_alive: bool) -> bytes:
        record = self._record
        if record is not None:
            record.timeline.response_started(self._carrier.clock(), status, streamed=False)
        reason = HTTPStatus(status).phrase
        return raw_error_response(status, reason, kind, text, keep_alive=keep_alive)

    def _end_early(self, verdict: Verdict, answer: bytes | None, keep_alive: bool) -> None:
        """The request ends before any response head was written: the sidecar's own answer
        goes out if the client is still there (the request leg's only write but the 100)."""
        transport = self._connection.transport
        if answer is not None and transport is not None and not transport.is_closing():
            transport.write(answer)
        self._finish(verdict, keep_alive)

    # -- the end -------------------------------------------------------------------------

    def _finish(self, verdict: Verdict, keep_alive: bool) -> None:
        """The one end, through either door (the second is the response leg's ``on_end``):
        the upstream connection back to the pool (or closed), the record given its verdict,
        and the client connection handed back, kept alive as the answer's head said (a head
        written before the drain began said so: the next request on it gets an answer that
        says the connection closes), else closed once what was written is flushed."""
        if self.state is DONE:
            return
        self.state = DONE
        if self._held is not None:  # (a held body that never came whole)
            self._held.release()
        if self.asked is not None and self._conn is None:  # (an answer not in is for nobody)
            self.asked.cancel()
        conn = self._conn
        if conn is not None and self._pool is not None:
            # A complete keep-alive response returns the connection to the pool; anything else
            # closes it, which is how the server learns to stop generating for a gone client.
            self._pool.release(conn)
        record = self._record
        if record is not None:
            self._carrier.records.close(record, verdict)
        self._connection.carried_done(self, keep_alive)

    def _guarded(self, step: Callable[..., None], *args: object) -> None:
        """Run one step from a callback: a bug in it never leaves the request hanging (the
        client gets a 500 if no head was written yet, else the connection closes) and is
        recorded as the sidecar's own failure."""
        try:
            step(*args)
        except Exception:
            _log.exception("exchange_failed", step=getattr(step, "__name__", repr(step)))
            if self.state is DONE:
                return
            try:
                if self._leg is not None:
                    self._leg.stop(Verdict.INTERNAL)  # its end is the second door
                else:
                    if self._record is None:
                        self._open(None)
                    self.keep_alive = False
                    self._fail(Verdict.INTERNAL, _FAILED)
            finally:
                self._finish(Verdict.INTERNAL, False)  # (if neither door was reached)
