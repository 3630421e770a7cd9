"""One response's body, relayed: the sink an upstream connection pushes each read to, which
writes it to the client and hands a copy to the observer, and the wait for the end, an error
or back-pressure (a callback, ``on_wake``, for a request carried from the client
connection's own callbacks, sidecar/relay/data/exchange.py; an awaited :meth:`BodyRelay.run`
for one aiohttp's handler answers).

Order of duties for every read: note the time, write to the client, then measure
(:class:`~sidecar.measure.observe.ResponseObserver`; a token lane does the same in one
compiled call: sidecar/relay/data/token_lane.py). The client's own pace is watched here too:
a paused upstream while the client's buffer is past the high-water mark, and a reader that
takes nothing for ``send_timeout`` let go (sidecar/relay/data/client_pace.py, the one rule).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog

from ...base.outcomes import Verdict
from ...measure.observe import ResponseObserver
from .client_pace import SEND_TIMEOUT, ClientPace
from .token_lane import AVAILABLE as _LANES, lane_for
from .upstream import UpstreamConnection

if TYPE_CHECKING:
    from .token_lane_py import TokenLane

__all__ = ["BodyRelay"]

_log = structlog.get_logger("sidecar.proxy")


_LAST_CHUNK = b"0\r\n\r\n"
"""The end of a chunked body (no trailers: the upstream's are hop-by-hop here)."""
_HIGH_WATER = 64 << 10
"""Bytes queued for the client beyond which the upstream is paused (aiohttp's write limit)."""


class BodyRelay:
    """The body sink of one response (:class:`~sidecar.relay.data.upstream.BodySink`).

    Called from the upstream connection's ``data_received`` for each piece: note the time,
    write the piece to the client (re-framed as one HTTP chunk when the client's response
    is chunked), then hand the same piece to the observer. No task switch per token: the
    handler task (:meth:`run`) only wakes for the end, an error, or back-pressure, when the
    client's socket buffer passed ``_HIGH_WATER`` and the upstream was paused until the
    client drained it. With ``on_wake`` (a request carried from the connection's callbacks)
    there is no task: ``on_wake`` is called instead, and the carrier reads :attr:`ended`
    and :attr:`paused`.
    """

    __slots__ = (
        "_on_wake", "_transport", "_conn", "_observer", "_clock", "_chunked", "_waiter", "pace",
        "_lane", "_linkable", "ended", "paused", "terminated",
    )  # fmt: skip

    def __init__(
        self,
        transport: asyncio.Transport,
        conn: UpstreamConnection,
        observer: ResponseObserver,
        clock: Callable[[], float],
        send_timeout: float = SEND_TIMEOUT,
        chunked: bool = False,
        on_wake: Callable[[], None] | None = None,
        pace: ClientPace | None = None,
    ) -> None:
        self._transport = transport  # the client's, open: a head was just written to it
        self._on_wake = on_wake
        self._conn = conn
        self._observer = observer
        self._clock = clock
        # Whether the client's body goes out in chunks: the head the proxy wrote says.
        self._chunked = chunked
        self._waiter: asyncio.Future[None] | None = None
        # How the body ended: OK (complete), the client's leaving or stalling, the upstream's
        # failure: a Verdict, never a word a typo could turn into another cause.
        self.ended: Verdict | None = None
        self.paused = False
        self.terminated = False  # a chunked client's last chunk is written (see end)
        # The client's progress (its bytes written count there): the exchange's, which
        # keeps watching it after the body's end, or the relay's own.
        self.pace = pace if pace is not None else ClientPace(transport, send_timeout, clock())
        # The token lane standing for the observer's armed template (token_lane.py): only a
        # chunked client's relay passes reads on as they came, which is all a lane does.
        self._lane: TokenLane | None = None
        self._linkable = _LANES and self._chunked and observer.templated

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
        if self.ended is not None or self.paused or not conn.between_chunks:
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
                    steady, clock=self._clock, transport=self._transport, timeline=self._observer.timeline,
                    on_sent=self._lane_sent, high_water=_HIGH_WATER,
                )  # fmt: skip
                self._lane = lane
                if lane is None:
                    return
            if lane.open(self.pace.check_at, self._observer.timeline.last_token):
                conn.set_lane(lane)
            elif lane.off:
                self._lane_failed()
        except Exception:
            _log.exception("token_lane_link_failed", route=self._observer.timeline.route)
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
        _log.error("token_lane_failed", route=self._observer.timeline.route)
        self._observer.timeline.parse_errors += 1
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
        if self._chunked:
            return b"".join([*(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces if p), last])
        return b"".join(pieces)

    def last(self, pieces: list[bytes]) -> None:
        """The read that completed the body: its pieces and, for a chunked client, the last
        chunk in one write (a stream's ``[DONE]`` event and the end of the body usually come
        in one read: one write and one wake-up of the client, not two), then the end."""
        now = self._clock()
        try:
            if self.ended is None:
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
            self._gone()
            return False
        transport.write(data)
        pace = self.pace
        pace.written += len(data)
        if (
            not self.paused and transport.get_write_buffer_size() > _HIGH_WATER
        ) or now >= pace.check_at:
            return self._flow(transport, now)
        return True

    def _gone(self) -> None:
        """The client's transport is closing: the relay ends."""
        self._conn.close()  # stop the server generating for nobody
        self._end(Verdict.CLIENT_DISCONNECTED)

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
        """The client's pace, checked while the response is being written (client_pace.py)."""
        if self.pace.alive(now):
            return True
        self._conn.close()  # the server stops generating for a reader that stopped
        self._end(Verdict.CLIENT_SEND_TIMEOUT)
        return False

    def end(self, error: Verdict | None) -> None:
        """The body ended. Complete, a chunked client's last chunk is written now, from the
        upstream's read (the relay owns the end of the body; the handler only ends aiohttp's
        message after it)."""
        if error is None and self._chunked and not self.terminated and self.ended is None:
            transport = self._transport
            if not transport.is_closing():
                transport.write(_LAST_CHUNK)
                self.pace.written += len(_LAST_CHUNK)
                self.terminated = True
        self._end(Verdict.OK if error is None else error)

    def _end(self, ended: Verdict) -> None:
        if not isinstance(ended, Verdict):
            raise TypeError(f"a relay ends with a Verdict, not {ended!r}")
        if self.ended is None:
            self.ended = ended
            if self._lane is not None:
                self._conn.set_lane(None)  # its notes are flushed as run() returns
            self._wake()

    def _wake(self) -> None:
        if self._on_wake is not None:
            self._on_wake()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def start(self) -> None:
        """Take the body's reads from now on (some may be delivered at once, from the
        upstream connection's buffer)."""
        self._conn.push(self)

    def resumed(self) -> None:
        """The client drained what was queued for it: the upstream may send again."""
        self.paused = False
        self._conn.resume_reading()

    def stop(self, ended: Verdict) -> None:
        """End the relay from outside (the client went, or stopped reading): the upstream
        request is closed, so the server stops generating."""
        self._conn.close()
        self._end(ended)

    def settle(self) -> None:
        """The relay is over: what a token lane noted goes into the timeline before anyone
        reads it, and the lane, which refers to this relay, is dropped (so a finished relay
        is freed at once, not by the cyclic collector much later, with its timeline)."""
        lane, self._lane = self._lane, None
        if lane is not None:
            self._conn.set_lane(None)
            lane.flush()
            if lane.off:
                self._lane_failed()

    async def run(self, drain: Callable[[], Awaitable[None]]) -> Verdict:
        """Relay until the body ends, waiting out back-pressure with ``drain`` (aiohttp's
        writer's); returns how it ended (``Verdict.OK``: complete)."""
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
        """Wait out back-pressure with ``drain`` (aiohttp's writer's), the client's pace
        checked as it is due; ``drain`` is only cancelled when the client is let go (it is
        the writer's shared waiter)."""
        drained = asyncio.ensure_future(drain())
        while True:
            done, _ = await asyncio.wait((drained,), timeout=self.pace.wait(self._clock()))
            if done:
                if drained.exception() is not None:
                    self.stop(Verdict.CLIENT_DISCONNECTED)
                else:
                    self.resumed()
                return
            if self._transport.is_closing():
                drained.cancel()
                self.stop(Verdict.CLIENT_DISCONNECTED)
                return
            if not self.pace.alive(self._clock()):
                drained.cancel()
                self.stop(Verdict.CLIENT_SEND_TIMEOUT)  # the server stops generating for nobody
                return
