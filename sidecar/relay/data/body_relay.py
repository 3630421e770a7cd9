"""The response leg of a request: the upstream's answer from its head to its end, relayed
to the client and measured, and the one owner of the client's transport from the head on.

It writes the response head, then is the sink the upstream connection pushes each read to:
note the time, write to the client, then measure
(:class:`~sidecar.measure.observe.ResponseObserver`; a token lane does the same in one
compiled call: sidecar/relay/data/token_lane.py). It keeps the client's pace, by the one
rule of sidecar/relay/data/client_pace.py: the upstream is paused while the client's buffer
is past the high-water mark, and a reader that takes nothing for ``send_timeout`` is let go
(its transport aborted: a close would wait to flush bytes it never takes). After the body's
end it waits for the client to take what is queued for it, so a client that pipelines
requests without reading gets no further request forwarded while the answers pile up. Then
it ends, once, with a :class:`~sidecar.base.outcomes.Verdict` and whether the connection
carries on or closes (``on_end``): complete, as the head said; anything else closes, after
flushing what was relayed (a truncated stream, never a false clean end).

Everything runs from callbacks (the upstream's reads, the client's transport draining or
going, one timer); :meth:`BodyRelay.run` awaits the body's end instead, with a writer's
``drain`` for back-pressure, for a caller that has one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import structlog

from ...base.outcomes import Verdict
from ...measure.observe import ResponseObserver
from .client_pace import SEND_TIMEOUT, ClientPace
from .token_lane import AVAILABLE as _LANES, lane_for
from .upstream import UpstreamConnection

if TYPE_CHECKING:
    from .token_lane_py import TokenLane

__all__ = ["BodyRelay", "ClientWriting"]

_log = structlog.get_logger("sidecar.proxy")


_LAST_CHUNK = b"0\r\n\r\n"
"""The end of a chunked body (no trailers: the upstream's are hop-by-hop here)."""
_HIGH_WATER = 64 << 10
"""Bytes queued for the client beyond which the upstream is paused (aiohttp's write limit)."""


class ClientWriting(Protocol):
    """What the response leg asks of the client connection besides its transport."""

    @property
    def writing_paused(self) -> bool:
        """The client's transport is past its high-water mark (``resume_writing`` to come)."""


class BodyRelay:
    """The response leg of one request (the module doc), and the body sink of its upstream
    connection (:class:`~sidecar.relay.data.upstream.BodySink`).

    Called from the upstream connection's ``data_received`` for each piece: note the time,
    write the piece to the client (re-framed as one HTTP chunk when the client's response
    is chunked), then hand the same piece to the observer. Nothing else runs per token: the
    leg only acts on the body's end, an error, or back-pressure (the client's socket buffer
    passed ``_HIGH_WATER`` and the upstream is paused until the client drains it).

    With ``client`` and ``on_end`` (a request carried from the client connection's
    callbacks) the leg owns the rest: :meth:`client_drained` and :meth:`client_gone` come
    from the connection, and ``on_end(verdict, keep_alive)`` is called once at the end. A
    complete body ends ok, or as an error when the upstream's ``status`` was a 5xx, and the
    connection carries on as the head said (``keep_alive``).
    """

    __slots__ = (
        "_transport", "_conn", "_observer", "_timeline", "_clock", "_chunked", "_waiter", "pace", "_lane",
        "_linkable", "_client", "_on_end", "_keep_alive", "_status", "_waiting", "_timer",
        "ended", "paused", "terminated",
    )  # fmt: skip

    def __init__(
        self,
        transport: asyncio.Transport,
        conn: UpstreamConnection,
        observer: ResponseObserver,
        clock: Callable[[], float],
        send_timeout: float = SEND_TIMEOUT,
        chunked: bool = False,
        *,
        client: ClientWriting | None = None,
        on_end: Callable[[Verdict, bool], None] | None = None,
        keep_alive: bool = False,
        status: int = 200,
    ) -> None:
        self._transport = transport  # the client's, open
        self._conn = conn
        self._observer = observer
        self._timeline = observer.timeline  # (the observer's for its life: read once)
        self._clock = clock
        # Whether the client's body goes out in chunks: the head the leg writes says.
        self._chunked = chunked
        self._waiter: asyncio.Future[None] | None = None  # run()'s wait
        self._client = client
        self._on_end = on_end
        self._keep_alive = keep_alive
        self._status = status
        self._waiting = False  # for the client to take what is queued for it
        self._timer: asyncio.TimerHandle | None = None  # the client's pace, while waiting
        # How the body ended: OK (complete), the client's leaving or stalling, the upstream's
        # failure: a Verdict, never a word a typo could turn into another cause.
        self.ended: Verdict | None = None
        self.paused = False
        self.terminated = False  # a chunked client's last chunk is written (see end)
        # The client's progress: every byte written to it, the head's included.
        self.pace = ClientPace(transport, send_timeout, clock())
        # The token lane standing for the observer's armed template (token_lane.py): only a
        # chunked client's relay passes reads on as they came, which is all a lane does.
        self._lane: TokenLane | None = None
        self._linkable = _LANES and self._chunked and observer.templated

    def start(self, head: bytes = b"") -> None:
        """Write the response ``head`` (none when the caller wrote its own), then take the
        body's reads (some may be delivered at once, from the upstream connection's buffer,
        and the leg may end before this returns)."""
        if head:
            self._transport.write(head)
            self.pace.written += len(head)
            self._timeline.client_head_sent = self._clock()
        self._conn.push(self)

    def body(self, piece: bytes) -> None:
        now = self._clock()
        if self.ended is not None:
            return
        if piece and not self.write(piece, now):
            return
        self._observer.feed(piece, now)
        if self._linkable:
            self._link()

    def chunk(self, frame: bytes, piece: bytes) -> None:
        """A read that was one whole, well-formed chunk: when the client's response is
        chunked too, the upstream's frame is already the right bytes, so it goes out as
        received: no re-framing copy."""
        now = self._clock()
        if self.ended is not None:
            return
        if not self._write_framed(frame if self._chunked else piece, now):
            return
        self._observer.feed(piece, now)
        if self._linkable:
            self._link()

    def _link(self) -> None:
        """After a read the Python path took: open a token lane on the connection for the
        template the dialect has armed now (token_lane.py), when the relay and the parser
        are where a lane may take the next read; the same lane again while the template
        is the same one. A measuring bug never reaches the relay: any error here ends
        lanes for this response (``_lane_failed``)."""
        conn = self._conn
        parser = conn.parser  # (the parser's own state, read: no call to ask it)
        if self.ended is not None or self.paused or parser is None or not parser.between_chunks:
            return
        if self._transport.get_write_buffer_size():
            return  # a lane would leave the next read to Python too: a slow reader's stays shut
        try:
            steady = self._observer.steady()
            if steady is None:
                return
            lane = self._lane
            if lane is None or lane.memo is not steady[0]:
                if lane is not None and lane.off:
                    self._lane_failed()
                    return
                lane = lane_for(
                    steady, clock=self._clock, transport=self._transport, timeline=self._timeline,
                    on_sent=self._lane_sent, high_water=_HIGH_WATER,
                )  # fmt: skip
                self._lane = lane
                if lane is None:
                    return
            if lane.open(self.pace.check_at, self._timeline.last_token):
                conn.set_lane(lane)
            elif lane.off:
                self._lane_failed()
        except Exception:
            _log.exception("token_lane_link_failed", route=self._timeline.route)
            self._lane_failed()

    @property
    def sent(self) -> int:
        """Bytes written to the client (with the head, when the exchange's pace counts it)."""
        return self.pace.written

    def _lane_sent(self, sent: int) -> None:
        """Bytes a token lane wrote to the client, handed over with its notes."""
        self.pace.written += sent

    def _lane_failed(self) -> None:
        """A lane switched itself off on an error in measuring, or could not be made (a bug:
        what it reads is pinned by tests): the Python path takes every read from here on,
        and the response counts one parse error, as a dialect that failed does. The bytes
        went through regardless."""
        _log.error("token_lane_failed", route=self._timeline.route)
        self._timeline.parse_errors += 1
        self._lane = None
        self._linkable = False
        self._conn.set_lane(None)

    def chunks(self, frames: bytes, pieces: list[bytes]) -> None:
        """A read that was several whole, well-formed chunks (a busy upstream's reads
        coalesce): one write to the client, not one per piece, then each piece measured
        as if it had come alone, all at the time of the read."""
        now = self._clock()
        if self.ended is not None:
            return
        if self._write_framed(frames if self._chunked else b"".join(pieces), now):
            self._measure_all(pieces, now)

    def several(self, pieces: list[bytes]) -> None:
        """Several pieces of one read that were not all whole chunks (a chunk split across
        reads, a Content-Length body after its head): one write to the client as well.

        One write per read is not only cheaper: uvloop retries its whole buffered list on
        every write once a slow client's buffer is past the high-water mark, so a read of
        thousands of tiny events written one by one would cost quadratic time and hold the
        event loop for over a second."""
        now = self._clock()
        if self.ended is not None:
            return
        data = self._framed(pieces)
        if not data or self._write_framed(data, now):
            self._measure_all(pieces, now)

    def _framed(self, pieces: list[bytes], last: bytes = b"") -> bytes:
        """Pieces as the client's body carries them: each its own chunk for a chunked client
        (``last``, the body's last chunk, after them), else as they are."""
        if not self._chunked:
            return b"".join(pieces)
        framed: list[bytes] = []
        for piece in pieces:
            if piece:
                framed += (b"%x\r\n%b\r\n" % (len(piece), piece),)  # (no generator to resume)
        framed += (last,)
        return b"".join(framed)

    def last(self, pieces: list[bytes], frames: bytes | None = None) -> None:
        """The read that completed the body: its pieces and, for a chunked client, the last
        chunk in one write (a stream's ``[DONE]`` event and the end of the body usually come
        in one read: one write and one wake-up of the client, not two), then the end. A
        read of whole chunks (``frames``) goes to a chunked client as received, as
        :meth:`chunks` does: it ends with the last chunk already."""
        now = self._clock()
        try:
            if self.ended is None:
                if frames is not None and self._chunked:
                    data = frames
                else:
                    data = self._framed(pieces, _LAST_CHUNK)
                if not data or self._write_framed(data, now):
                    self.terminated = self._chunked
                    feed = self._observer.feed
                    for piece in pieces:
                        feed(piece, now)
        finally:
            self.end(None)

    def _measure_all(self, pieces: list[bytes], now: float) -> None:
        """The pieces of one read, written: each measured as if it had come alone."""
        feed = self._observer.feed
        for piece in pieces:
            feed(piece, now)
        if self._linkable:
            self._link()

    def write(self, data: bytes, now: float) -> bool:
        """Write to the client; False (and the relay ends) when the client is gone."""
        return self._write_framed(
            b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data, now
        )

    def _write_framed(self, data: bytes, now: float) -> bool:
        """The one write to the client and the flow check after it (a token lane takes a
        read only when this check could not fire: sidecar/relay/data/token_lane.py)."""
        transport = self._transport
        if transport.is_closing():
            self.client_gone()
            return False
        transport.write(data)
        pace = self.pace
        pace.written += len(data)
        if (
            not self.paused and transport.get_write_buffer_size() > _HIGH_WATER
        ) or now >= pace.check_at:
            return self._flow(transport, now)
        return True

    def _flow(self, transport: asyncio.Transport, now: float) -> bool:
        """After a write that left the client's buffer past ``_HIGH_WATER`` (the upstream is
        paused until the client drains it) or came when the client's progress is due a
        check; False when that check ended the relay."""
        if not self.paused and transport.get_write_buffer_size() > _HIGH_WATER:
            self.paused = True
            self._conn.pause_reading()
            self._wake()
            return True
        return self._reader_alive(now)

    def _reader_alive(self, now: float) -> bool:
        """The client's pace, checked as it is due (client_pace.py): a reader that took
        nothing for ``send_timeout`` is let go."""
        if self.pace.alive(now):
            return True
        self.stop(Verdict.CLIENT_SEND_TIMEOUT)
        return False

    def end(self, error: Verdict | None) -> None:
        """The body ended. Complete, a chunked client's last chunk is written now, from the
        upstream's read (the leg owns the end of the body)."""
        if error is None and self._chunked and not self.terminated and self.ended is None:
            transport = self._transport
            if not transport.is_closing():
                transport.write(_LAST_CHUNK)
                self.pace.written += len(_LAST_CHUNK)
                self.terminated = True
        self._end(Verdict.OK if error is None else error)

    def _end(self, ended: Verdict) -> None:
        if type(ended) is not Verdict:  # (an enum's members are of its own type, never a subclass)
            raise TypeError(f"a relay ends with a Verdict, not {ended!r}")
        if self.ended is None:
            self.ended = ended
            self._wake()

    def _wake(self) -> None:
        """The body ended, or the upstream was paused: the client's buffer is full."""
        if self._on_end is None:
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif not self._waiting:  # (an end while waiting is taken once the client drained)
            if self.ended is not None:
                self._body_ended(self.ended)
            elif self.paused and not self._wait_for_client():
                self.resumed()

    def resumed(self) -> None:
        """The client drained what was queued for it: the upstream may send again."""
        self.paused = False
        self._conn.resume_reading()

    def stop(self, ended: Verdict) -> None:
        """End the leg from outside (the client went, or stopped reading, or the sidecar
        failed): the upstream request is closed, so the server stops generating."""
        self._cancel_wait()
        if self.ended is None:
            if self._lane is not None:  # (an end from the connection comes with its lane gone)
                self._conn.set_lane(None)  # its notes are flushed as the body is settled
            self._conn.close()
            self._end(ended)
        else:  # the body was over: the leg was waiting for the client to take it
            self._finish(ended)

    def settle(self) -> None:
        """The body is over: what a token lane noted goes into the timeline before anyone
        reads it, and the lane, which refers to this relay, is dropped (so a finished relay
        is freed at once, not by the cyclic collector much later, with its timeline)."""
        lane, self._lane = self._lane, None
        if lane is not None:
            if self.ended is None:  # (an ended leg's connection has dropped it: stop, _end)
                self._conn.set_lane(None)
            lane.flush()
            if lane.off:
                self._lane_failed()

    # -- the client's pace and the leg's end (with on_end) -------------------------------

    def _body_ended(self, ended: Verdict) -> None:
        """The body is over: its figures are complete. A whole body waits for the client to
        take it; anything else ends the leg now (the connection closes after flushing what
        was relayed)."""
        self.paused = False  # (nothing more to read: the wait from here is the end's)
        self.settle()
        self._observer.close(self._clock())
        if ended is not Verdict.OK or not self._wait_for_client():
            self._finish(ended)

    def _wait_for_client(self) -> bool:
        """Wait for the client to take what is queued for it (the transport's
        ``resume_writing``: :meth:`client_drained`), for as long as it makes progress by the
        one rule (client_pace.py); False when nothing is queued past the high-water mark
        (the caller carries on)."""
        transport = self._transport
        if transport.is_closing():
            self.client_gone()
            return True
        client = self._client
        if client is None or not transport.get_write_buffer_size() or not client.writing_paused:
            return False
        self._waiting = True
        self._arm(self.pace.wait(self._clock()))
        return True

    def client_drained(self) -> None:
        """The client's transport drained (``resume_writing``): after back-pressure the body
        goes on (or, if its end came meanwhile, is over now); after the body, the leg ends."""
        if not self._waiting:
            return
        self._cancel_wait()
        ended = self.ended
        if not self.paused:
            self._finish(Verdict.OK)
        elif ended is None:
            self.resumed()
        else:
            self._body_ended(ended)

    def client_gone(self) -> None:
        """The client connection is closing or lost: the upstream request is stopped (the
        server stops generating for nobody)."""
        self.stop(Verdict.CLIENT_DISCONNECTED)

    def _progress(self) -> None:
        """The pace timer, while waiting: the client took something in time, or is let go."""
        self._timer = None
        if not self._waiting:
            return
        if self._transport.is_closing():
            self.client_gone()
            return
        now = self._clock()
        if self._reader_alive(now):  # a slow reader keeps its stream
            self._arm(self.pace.wait(now))

    def _finish(self, ended: Verdict) -> None:
        """The leg's one end: the verdict (a complete body's by the upstream's status), and
        whether the connection carries on (complete: as the head said) or closes. A client
        let go for its pace is aborted with its unread bytes (a close would wait to flush
        them)."""
        if self._timer is not None:
            self._cancel_wait()
        self._waiting = False
        if self._lane is not None:
            self.settle()
        if ended is Verdict.CLIENT_SEND_TIMEOUT:
            self._transport.abort()
        on_end = self._on_end
        if on_end is not None:
            complete = ended is Verdict.OK
            if complete and self._status >= 500:
                ended = Verdict.UPSTREAM_STATUS
            on_end(ended, complete and self._keep_alive)

    def _arm(self, delay: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay, self._progress)

    def _cancel_wait(self) -> None:
        self._waiting = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the awaited form -----------------------------------------------------------------

    async def run(self, drain: Callable[[], Awaitable[None]]) -> Verdict:
        """Relay until the body ends, waiting out back-pressure with ``drain`` (a writer's);
        returns how it ended (``Verdict.OK``: complete)."""
        try:
            return await self._run(drain)
        finally:
            self.settle()

    async def _run(self, drain: Callable[[], Awaitable[None]]) -> Verdict:
        self.start()
        loop = asyncio.get_running_loop()
        while self.ended is None:
            if self.paused:
                await self._drained(drain)
                continue
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.ended

    async def _drained(self, drain: Callable[[], Awaitable[None]]) -> None:
        """Wait out back-pressure with ``drain``, the client's pace checked as it is due;
        ``drain`` is only cancelled when the client is let go (it is the writer's shared
        waiter)."""
        drained = asyncio.ensure_future(drain())
        while True:
            done, _ = await asyncio.wait((drained,), timeout=self.pace.wait(self._clock()))
            if done:
                if drained.exception() is not None:
                    self.client_gone()
                else:
                    self.resumed()
                return
            if self._transport.is_closing():
                drained.cancel()
                self.client_gone()
                return
            if not self._reader_alive(self._clock()):
                drained.cancel()
                return
