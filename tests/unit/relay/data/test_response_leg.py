"""The response leg (``sidecar.relay.data.body_relay.BodyRelay`` with ``on_end``) with fake
transports: how it ends (with a Verdict and whether the connection carries on), the
wait for a client that is behind, and the stalled reader let go. The integration tests
(tests/integration/relay/) drive the same paths over real sockets through the proxy port."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from sidecar.base.outcomes import Verdict
from sidecar.base.routes import match_route
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.timeline import RequestTimeline
from sidecar.relay.data.body_relay import BodyRelay

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.buffered = 0
        self.closing = False
        self.aborted = False

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str) -> None:
        return None  # no socket: the client's progress is the transport's buffer alone

    def abort(self) -> None:
        self.aborted = self.closing = True


class Conn:
    """The upstream connection: pushes nothing by itself (the test calls the sink)."""

    parser = SimpleNamespace(between_chunks=False)

    def __init__(self) -> None:
        self.closed = False
        self.reading = True

    def push(self, sink: BodyRelay) -> None:
        pass

    def set_lane(self, lane: object) -> None:
        assert lane is None

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Client:
    writing_paused = False


class Leg:
    """One response leg and what it reported at its end."""

    def __init__(self, status: int = 200, send_timeout: float = 60.0) -> None:
        route, _ = match_route("/v1/chat/completions", "POST")
        self.timeline = RequestTimeline(0.0, "POST", route.template, "m")
        observer = ResponseObserver(route, self.timeline, "text/event-stream")
        self.transport, self.conn, self.client = Transport(), Conn(), Client()
        self.ends: list[tuple[Verdict, bool]] = []
        self.leg = BodyRelay(
            self.transport, self.conn, observer, asyncio.get_running_loop().time,  # type: ignore[arg-type]
            send_timeout, chunked=True, client=self.client, keep_alive=True, status=status,
            on_end=lambda verdict, keep_alive: self.ends.append((verdict, keep_alive)),
        )  # fmt: skip
        self.leg.start(HEAD)

    @property
    def sent(self) -> bytes:
        return b"".join(self.transport.written)


@pytest.mark.parametrize("status, verdict", [(200, Verdict.OK), (503, Verdict.UPSTREAM_STATUS)])
def test_a_complete_answer_ends_once_by_its_status_and_the_connection_carries_on(status, verdict):
    async def main() -> None:
        it = Leg(status)
        it.leg.body(EVENT)
        it.leg.last([])
        assert it.sent == HEAD + b"%x\r\n%b\r\n" % (len(EVENT), EVENT) + b"0\r\n\r\n"
        assert it.ends == [(verdict, True)]
        assert it.timeline.client_head_sent is not None and not it.conn.closed

    asyncio.run(main())


def test_a_body_cut_short_ends_as_its_cause_and_the_connection_closes():
    async def main() -> None:
        it = Leg()
        it.leg.body(EVENT)
        it.leg.end(Verdict.UPSTREAM_DISCONNECTED)
        assert it.ends == [(Verdict.UPSTREAM_DISCONNECTED, False)]
        assert not it.sent.endswith(b"0\r\n\r\n") and not it.transport.aborted

    asyncio.run(main())


def test_a_client_behind_at_the_end_is_waited_for_before_the_leg_ends():
    """A client that pipelines without reading gets no next request while its answer waits."""

    async def main() -> None:
        it = Leg()
        it.transport.buffered, it.client.writing_paused = 1 << 20, True
        it.leg.last([EVENT])
        assert it.ends == []
        it.transport.buffered, it.client.writing_paused = 0, False
        it.leg.client_drained()
        assert it.ends == [(Verdict.OK, True)]

    asyncio.run(main())


def test_an_end_during_back_pressure_is_taken_once_the_client_drained():
    async def main() -> None:
        it = Leg()
        it.transport.buffered, it.client.writing_paused = 1 << 20, True
        it.leg.body(EVENT)
        assert not it.conn.reading and it.leg.paused  # the upstream waits for the client
        it.leg.last([EVENT])
        assert it.ends == []
        it.transport.buffered, it.client.writing_paused = 0, False
        it.leg.client_drained()
        assert it.ends == [(Verdict.OK, True)]

    asyncio.run(main())


def test_a_reader_that_takes_nothing_after_the_body_is_let_go_at_send_timeout():
    """Timed from the last byte it took: aborted (a close would wait to flush what it never
    reads), the connection not carried on; the upstream's complete answer is not cut."""

    async def main() -> float:
        it = Leg(send_timeout=0.24)
        it.transport.buffered, it.client.writing_paused = 1 << 20, True
        started = asyncio.get_running_loop().time()
        it.leg.last([EVENT])
        while not it.ends:
            await asyncio.sleep(0.01)
            assert asyncio.get_running_loop().time() - started < 2.0, "never let go"
        assert it.ends == [(Verdict.CLIENT_SEND_TIMEOUT, False)]
        assert it.transport.aborted and not it.conn.closed
        return asyncio.get_running_loop().time() - started

    waited = asyncio.run(main())
    assert 0.24 <= waited < 0.24 + 0.5


def test_a_client_gone_while_the_leg_waits_ends_it_as_disconnected():
    async def main() -> None:
        it = Leg()
        it.transport.buffered, it.client.writing_paused = 1 << 20, True
        it.leg.body(EVENT)
        it.leg.client_gone()
        assert it.ends == [(Verdict.CLIENT_DISCONNECTED, False)]
        assert it.conn.closed  # the server stops generating for nobody
        await asyncio.sleep(0.05)
        assert it.ends == [(Verdict.CLIENT_DISCONNECTED, False)]  # no timer fired after it

    asyncio.run(main())
