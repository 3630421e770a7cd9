"""Clients that stop reading, pipeline without reading, or dawdle: they cannot hold the
upstream (and the server's generation slot), memory or the process.

Real sockets on 127.0.0.1: raw client sockets with a small receive buffer, a raw keep-alive
upstream that counts what reaches it, and the sidecar in this event loop (``rig_factory``).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from tests.support.raw import TCP_ESTABLISHED, raw_socket, tcp_state
from tests.support.rig import CHAT
from tests.support.samples import in_flight_total
from tests.support.sse import scripted
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


class CountingUpstream:
    """Keep-alive HTTP/1.1 server answering every request with a ``Content-Length`` body."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.requests = 0
        self.open = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%b"
                    % (len(self.body), self.body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def close(self) -> None:
        self.server.close()


async def test_pipelining_without_reading_is_bounded_and_let_go(rig_factory):
    up = CountingUpstream(b"x" * 65536)
    rig = await rig_factory(upstream=await up.start(), send_timeout=1.5)
    loop = asyncio.get_running_loop()
    sock = await raw_socket(rig.port)
    request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    sending = asyncio.ensure_future(loop.sock_sendall(sock, request * 5000))  # never read back

    await asyncio.sleep(1.0)
    early = up.requests
    await asyncio.sleep(1.0)
    # Each answer waits for the client to take the previous one, so the next pipelined
    # request is not forwarded: only what the socket buffers along the path hold. Before,
    # every request was forwarded at once and the answers piled up in the sidecar.
    assert up.requests < 400, up.requests
    assert up.requests - early <= 1, (early, up.requests)

    # The stalled reader is let go after send_timeout: the sidecar closes the connection
    # (our socket leaves ESTABLISHED) and forwards nothing more.
    await wait_for(lambda: tcp_state(sock) != TCP_ESTABLISHED, timeout=10.0)
    forwarded = up.requests
    await asyncio.sleep(0.5)
    assert up.requests == forwarded
    sending.cancel()
    sock.close()
    await up.close()


def _endless_stream(up_state: dict, interval: float = 0.0):
    """1 KiB events for ever, one every ``interval`` seconds (0: as fast as the writes go, a
    real generation pace otherwise); ``up_state`` notes when it started, the bytes sent and
    when it was closed."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        up_state["started"] = time.monotonic()
        event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"z" * 1000 + b'"}}]}\n\n'
        try:
            while True:
                await response.write(event)
                up_state["sent"] = up_state.get("sent", 0) + len(event)
                await asyncio.sleep(interval)
        except (ConnectionError, asyncio.CancelledError):
            up_state["closed"] = time.monotonic()
            raise
        return response

    return handler


async def _post_stream(port: int, rcvbuf: int = 4096) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = await raw_socket(port, rcvbuf)
    body = b'{"model":"m","stream":true,"messages":[]}'
    await loop.sock_sendall(
        sock,
        b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
        % (CHAT.encode(), len(body), body),
    )
    return sock


async def _recv(sock: socket.socket, n: int) -> bytes:
    try:
        return await asyncio.get_running_loop().sock_recv(sock, n)
    except ConnectionResetError:
        return b""


async def test_reader_that_stops_is_let_go_and_the_upstream_closed(upstream, rig_factory):
    state: dict = {}
    await upstream.start(lambda app: app.router.add_post(CHAT, _endless_stream(state)))
    rig = await rig_factory(upstream=upstream.url, send_timeout=1.0)
    sock = await _post_stream(rig.port)
    await wait_for(lambda: "started" in state)

    # The client reads nothing at all. Within send_timeout (plus a poll) the sidecar closes
    # the upstream request, so the server stops generating, and closes the client.
    await wait_for(lambda: "closed" in state)
    assert state["closed"] - state["started"] < 10, "let go after send_timeout (1 s), not never"
    labels = {"model": "m", "route": CHAT}
    await wait_for(
        lambda: rig.sample("llm_requests_total", code="200", outcome="cancelled", **labels) == 1
    )
    assert in_flight_total(rig.registry) == 0
    async with asyncio.timeout(10):
        while await _recv(sock, 1 << 16):
            pass  # ends with EOF: the sidecar closed the connection
    sock.close()


async def test_reader_that_stops_on_a_paced_stream_is_let_go_within_send_timeout(
    upstream, rig_factory
):
    """At a token pace the kernel's send buffer (autotuned to MiBs) takes the stream for a
    minute or more before any write queues, so a send timeout counted from a queued write
    would let the server generate for nobody for 126 s with send_timeout 60 s. The client's
    progress is read from the kernel instead: let go within send_timeout + ~2 s."""
    state: dict = {}
    await upstream.start(
        lambda app: app.router.add_post(CHAT, _endless_stream(state, 0.01))
    )  # ~100 KiB/s
    rig = await rig_factory(upstream=upstream.url, send_timeout=1.0)
    sock = await _post_stream(rig.port)  # 4 KiB receive buffer, never read
    await wait_for(lambda: "started" in state)
    await wait_for(lambda: "closed" in state)
    # send_timeout + ~2 s on a quiet machine; the margin is for a loaded one, and still far
    # short of the minute the kernel's buffer can hide the stall for.
    assert state["closed"] - state["started"] < 12, state["closed"] - state["started"]
    await wait_for(
        lambda: (
            rig.sample("llm_requests_total", code="200", outcome="cancelled", model="m", route=CHAT)
            == 1
        )
    )
    sock.close()


async def test_slow_but_live_reader_is_never_cut_off(upstream, rig_factory):
    state: dict = {}
    await upstream.start(lambda app: app.router.add_post(CHAT, _endless_stream(state)))
    rig = await rig_factory(upstream=upstream.url, send_timeout=1.0)
    # A reader taking ~200 KiB/s (TCP on loopback moves a window only in steps of about
    # two segments of 64 KiB, so a reader of a few KiB/s shows no progress for a while).
    sock = await _post_stream(rig.port, rcvbuf=256 << 10)
    await wait_for(lambda: "started" in state)
    got = 0
    deadline = time.monotonic() + 4.0  # four send_timeouts
    while time.monotonic() < deadline:
        chunk = await asyncio.wait_for(_recv(sock, 65536), 2.0)
        assert chunk, "cut off"
        got += len(chunk)
        await asyncio.sleep(0.3)
    assert "closed" not in state
    assert (
        rig.sample("llm_requests_total", code="200", outcome="cancelled", model="m", route=CHAT)
        is None
    )
    sock.close()
    await wait_for(lambda: "closed" in state)


async def test_long_unterminated_event_in_small_pieces_never_stalls_the_loop(upstream, rig_factory):
    """A held incomplete event rescanned per piece costs quadratic time (23 s of CPU per
    MiB in 200-byte pieces, the admin port stalled); this keeps such a hold from anywhere on
    the path (the SSE
    decoder's held line included): a 1 MiB event in 200-byte pieces is relayed byte for byte
    while /healthz on the admin port keeps answering."""
    import aiohttp

    line = b"data: {" + b'"x":"' + b"y" * ((1 << 20) - 20) + b'"}'
    pieces = [line[i : i + 200] for i in range(0, len(line), 200)] + [b"\n\n", b"data: [DONE]\n\n"]

    await upstream.start(
        lambda app: app.router.add_post(CHAT, scripted([(0, piece) for piece in pieces]))
    )
    rig = await rig_factory(upstream=upstream.url)
    worst = 0.0
    done = asyncio.Event()

    async def probe(session: aiohttp.ClientSession) -> None:
        nonlocal worst
        while not done.is_set():
            t0 = time.monotonic()
            async with session.get(f"http://127.0.0.1:{rig.admin_port}/healthz") as r:
                assert r.status == 200
            worst = max(worst, time.monotonic() - t0)
            await asyncio.sleep(0.02)

    async with aiohttp.ClientSession(auto_decompress=False) as s:
        prober = asyncio.create_task(probe(s))
        async with s.post(rig.url + CHAT, json={"model": "m", "stream": True}) as r:
            got = await r.read()
        done.set()
        await prober
    assert got == b"".join(pieces)
    # Generous: a probe answers in milliseconds; the quadratic filter stalled it 24 s.
    assert worst < 2.0, worst
