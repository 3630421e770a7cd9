"""The relay's body sink (``sidecar.relay.data.body_relay.BodyRelay``) with fake transports: what it writes to
the client for each shape of read, before it measures. No sockets: the integration tests
cover the same path end to end."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from sidecar.base.outcomes import Verdict
from sidecar.base.routes import match_route
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.timeline import RequestTimeline
from sidecar.relay.data.body_relay import BodyRelay


class Transport:
    def __init__(self, closing: bool = False, buffered: int = 0) -> None:
        self.written: list[bytes] = []
        self.closing = closing
        self.buffered = buffered

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered


async def drain_never_called() -> None:
    raise AssertionError("the relay waits for the client's drain only when paused")


class Conn:
    # These tests are of the Python path: no token lane is ever opened on this connection
    # (tests/unit/relay/data/test_token_lane.py has the lanes, against the Python path).
    parser = SimpleNamespace(between_chunks=False)

    def __init__(self) -> None:
        self.closed = False
        self.paused = False

    def set_lane(self, lane) -> None:
        assert lane is None

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True


EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
)


def _relay(transport: Transport, chunked: bool = True):
    route, _ = match_route("/v1/chat/completions", "POST")
    timeline = RequestTimeline(0.0, "POST", route.template, "m")
    observer = ResponseObserver(route, timeline, "text/event-stream")
    conn = Conn()
    relay = BodyRelay(transport, conn, observer, lambda: 1.0, chunked=chunked)
    return relay, conn, timeline


def test_a_whole_chunk_goes_out_as_received():
    transport = Transport()
    relay, _, timeline = _relay(transport)
    frame = b"%08X\r\n%b\r\n" % (len(EVENT), EVENT)  # unusual but valid: upper case, zeros
    relay.chunk(frame, EVENT)
    assert transport.written == [frame]
    assert transport.written[0] is frame  # not a copy
    assert timeline.stream_tokens == 1  # measured after the write


def test_a_usage_chunk_goes_out_as_received_and_is_measured():
    transport = Transport()
    relay, _, timeline = _relay(transport)
    piece = EVENT + USAGE
    frame = b"%x\r\n%b\r\n" % (len(piece), piece)
    relay.chunk(frame, piece)
    assert transport.written == [frame]
    assert timeline.usage is not None


def test_several_whole_chunks_in_one_read_go_out_in_one_write_and_are_each_measured():
    transport = Transport()
    relay, _, timeline = _relay(transport)
    frames = b"".join(b"%x\r\n%b\r\n" % (len(EVENT), EVENT) for _ in range(3))
    relay.chunks(frames, [EVENT, EVENT, EVENT])
    assert transport.written == [frames]
    assert transport.written[0] is frames  # not a copy
    assert timeline.stream_tokens == 3
    assert list(timeline.gaps) == [0.0, 0.0]  # arrived in the same read: gaps of 0


def test_several_chunks_to_a_client_that_is_not_chunked_go_out_bare_in_one_write():
    transport = Transport()
    relay, _, timeline = _relay(transport, chunked=False)
    frames = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (EVENT, USAGE))
    relay.chunks(frames, [EVENT, USAGE])
    assert transport.written == [EVENT + USAGE]
    assert timeline.stream_tokens == 1 and timeline.usage is not None


def test_a_client_response_that_is_not_chunked_gets_the_bare_piece():
    transport = Transport()
    relay, _, _ = _relay(transport, chunked=False)
    relay.chunk(b"%x\r\n%b\r\n" % (len(EVENT), EVENT), EVENT)
    relay.body(EVENT)
    assert transport.written == [EVENT, EVENT]


def test_a_gone_client_ends_the_relay_and_closes_the_upstream():
    transport = Transport(closing=True)
    relay, conn, timeline = _relay(transport)
    relay.chunk(b"%x\r\n%b\r\n" % (len(EVENT), EVENT), EVENT)
    assert transport.written == [] and conn.closed
    assert relay.ended is Verdict.CLIENT_DISCONNECTED
    assert timeline.stream_tokens == 0
    relay.body(EVENT)  # anything later is dropped
    assert transport.written == []


def test_a_full_client_buffer_pauses_the_upstream():
    transport = Transport(buffered=1 << 20)
    relay, conn, _ = _relay(transport)
    relay.body(EVENT)
    assert conn.paused and relay.paused
    assert transport.written  # the piece itself was still written


def test_run_returns_how_the_body_ended():
    async def main():
        transport = Transport()
        relay, _, _ = _relay(transport)

        class PushingConn(Conn):
            def push(self, sink):
                asyncio.get_running_loop().call_soon(sink.end, Verdict.UPSTREAM_READ_TIMEOUT)

        relay._conn = PushingConn()
        return await relay.run(drain_never_called)

    assert asyncio.run(main()) is Verdict.UPSTREAM_READ_TIMEOUT


DONE = b"data: [DONE]\n\n"


def test_the_read_that_ends_the_body_goes_out_with_the_last_chunk_in_one_write():
    """A stream's ``[DONE]`` and the end of its body usually come in one read: one write to
    the client (and one wake-up of it), with the chunked body's last chunk, measured."""
    transport = Transport()
    relay, _, timeline = _relay(transport)
    relay.last([EVENT, DONE])
    assert transport.written == [
        b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(EVENT), EVENT, len(DONE), DONE)
    ]
    assert relay.terminated and relay.ended == Verdict.OK
    assert relay.sent == len(transport.written[0])
    assert timeline.stream_tokens == 1


@pytest.mark.parametrize("chunked", [True, False])
def test_a_read_of_whole_chunks_that_ends_the_body_goes_out_as_received(chunked):
    """The read that ended the body was whole chunks and the last one (``frames``): a
    chunked client gets those bytes as they came, as for any read of whole chunks; one
    that is not gets the pieces bare. Either way each piece is measured."""
    frames = b"%x\r\n%b\r\n%x\r\n%b\r\n000\r\n\r\n" % (len(EVENT), EVENT, len(DONE), DONE)
    transport = Transport()
    relay, _, timeline = _relay(transport, chunked=chunked)
    relay.last([EVENT, DONE], frames)
    assert transport.written == [frames if chunked else EVENT + DONE]
    assert relay.terminated is chunked and relay.ended == Verdict.OK
    assert relay.sent == len(transport.written[0])
    assert timeline.stream_tokens == 1


def test_an_end_in_a_read_of_its_own_writes_the_last_chunk_at_once():
    transport = Transport()
    relay, _, _ = _relay(transport)
    relay.body(EVENT)
    relay.last([])  # the read was "0\r\n\r\n" alone
    assert transport.written[1:] == [b"0\r\n\r\n"]
    assert relay.terminated and relay.sent == sum(map(len, transport.written))


def test_a_client_that_is_not_chunked_gets_the_last_pieces_bare_and_no_last_chunk():
    transport = Transport()
    relay, _, _ = _relay(transport, chunked=False)
    relay.last([EVENT, DONE])
    assert transport.written == [EVENT + DONE]
    assert not relay.terminated and relay.ended == Verdict.OK


@pytest.mark.parametrize(
    "error", [Verdict.UPSTREAM_DISCONNECTED, Verdict.UPSTREAM_INVALID_RESPONSE]
)
def test_a_body_cut_short_never_gets_a_last_chunk(error):
    """A truncated stream must not look complete to the client."""
    transport = Transport()
    relay, _, _ = _relay(transport)
    relay.body(EVENT)
    relay.end(error)
    assert not relay.terminated and b"0\r\n\r\n" not in b"".join(transport.written)
    assert relay.ended is error


def test_a_relay_already_ended_writes_nothing_more():
    transport = Transport(closing=True)
    relay, _, _ = _relay(transport)
    relay.body(EVENT)  # the client is gone: the relay ends
    transport.closing = False
    relay.last([DONE])
    assert transport.written == [] and not relay.terminated
    assert relay.ended is Verdict.CLIENT_DISCONNECTED


@pytest.mark.parametrize(
    "send_timeout, every", [(60.0, 5.0), (12.0, 1.0), (1.2, 0.1), (600.0, 5.0)]
)
def test_the_clients_progress_is_checked_twelve_times_per_send_timeout_at_most_every_5_s(
    send_timeout, every
):
    """Each check is a read the token lane leaves to Python: once a second it cost 3-6 % of
    the CPU of 200 streams. A reader that stopped is let go within send_timeout + every."""
    transport = Transport()
    transport.get_extra_info = lambda name: None  # no socket: the transport's buffer alone
    route, _ = match_route("/v1/chat/completions", "POST")
    timeline = RequestTimeline(0.0, "POST", route.template, "m")
    observer = ResponseObserver(route, timeline, "text/event-stream")
    now = [100.0]
    relay = BodyRelay(
        transport, Conn(), observer, lambda: now[0], send_timeout=send_timeout, chunked=True
    )
    checked = []
    for step in range(1, 41):  # ten intervals, a write every quarter of one
        now[0] = 100.0 + step * every / 4
        due = relay.pace.check_at
        relay.body(EVENT)
        if relay.pace.check_at != due:
            checked.append(now[0])
            assert relay.pace.check_at == pytest.approx(now[0] + every)
    assert checked == pytest.approx([100.0 + k * every for k in range(1, 11)])
