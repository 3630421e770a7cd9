"""Every upstream and client fault over real sockets, against the simulated server: what the
client receives, the outcome counted, and that nothing is left behind.

"Nothing left behind" is a census of the test process, which holds the simulator, the
sidecar and the client: asyncio tasks, open file descriptors, and the TCP state of every
socket among them (from /proc). It is taken before the fault and must come back to exactly
that once the client has gone, except for an upstream keep-alive connection the sidecar
pooled on purpose after a cleanly ended response (counted explicitly where it happens).

The sidecar under test runs behind :class:`sidecar.app.SidecarRunner`, as ``serve`` runs it
(``tests.support.rig``); the census is ``tests.support.census``.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
import tracemalloc

import aiohttp
import pytest
from aiohttp import web

from sidecar.tools.sim.core import SIM_STATS, SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.support.census import quiet_census, rss_bytes, settles_to, tcp_sockets
from tests.support.rig import CHAT, Rig, start_site
from tests.support.samples import in_flight_total, sample_of
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

MODEL = "sim-llama-3-8b"
LABELS = {"model": MODEL, "route": CHAT}

# -- requests to the rig --------------------------------------------------------------------------


def chat_body(stream: bool = True, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        **extra,
    }


def sim_headers(tokens: int = 20, **extra: str) -> dict[str, str]:
    return {
        "x-sim-ttft": "0.01",
        "x-sim-tpot": "0.005",
        "x-sim-tokens": str(tokens),
        **{f"x-sim-{k.replace('_', '-')}": v for k, v in extra.items()},
    }


async def read_all(
    url: str, body: dict, headers: dict
) -> tuple[int | None, bytes, BaseException | None]:
    """POST and read to the end; the status, every byte relayed, and how the read ended."""
    got = bytearray()
    status = None
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(url, json=body, headers=headers) as r:
                status = r.status
                async with asyncio.timeout(10):  # a fault must never hang the client
                    async for chunk in r.content.iter_any():
                        got += chunk
    except aiohttp.ClientPayloadError as exc:
        return status, bytes(got), exc
    return status, bytes(got), None


async def counted(rig: Rig, code: str, outcome: str, labels: dict = LABELS) -> None:
    await wait_for(
        lambda: rig.sample("llm_requests_total", code=code, outcome=outcome, **labels) == 1
    )
    assert in_flight_total(rig.registry) == 0


# -- the simulator's fault modes, directly --------------------------------------------------------


async def test_simulator_fault_modes(rig_factory):
    rig = await rig_factory()
    sim_url = f"http://127.0.0.1:{rig.sim_port}{CHAT}"
    inc = chat_body(stream_options={"include_usage": True})
    _, full, end = await read_all(sim_url, inc, sim_headers(10))
    assert end is None and full.endswith(b"data: [DONE]\n\n") and full.count(b'"content":"') == 11

    _, cut, end = await read_all(sim_url, inc, sim_headers(10, fail="truncate"))
    assert end is None and b"[DONE]" not in cut and b'"usage"' not in cut
    assert cut.count(b'"content":"') == 6  # role chunk + 5 tokens, then a clean end

    _, long, end = await read_all(
        sim_url, inc, sim_headers(10, fail="longline", line_bytes="100000")
    )
    assert (
        end is None
        and long.endswith(b"data: [DONE]\n\n")
        and b"\ndata: " + b"x" * 100000 + b"\n\n" in long
    )

    messages_url = f"http://127.0.0.1:{rig.sim_port}/v1/messages"
    messages = {
        "model": MODEL,
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    for url, body in ((sim_url, inc), (messages_url, messages)):  # reset: on every route
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await read_all(url, body, sim_headers(10, fail="reset"))
    async with aiohttp.ClientSession() as s:  # the other dialects refuse the OpenAI-only modes
        async with s.post(messages_url, json=messages, headers={"x-sim-fail": "stall"}) as r:
            assert r.status == 400 and b"x-sim-fail" in await r.read()
    assert (rig.sim.completed, rig.sim.truncated, rig.sim.dropped) == (2, 1, 2)


# -- faults ------------------------------------------------------------------------------------------


async def test_upstream_refuses(rig_factory, refused_url):
    rig = await rig_factory(upstream=refused_url)
    before = await quiet_census()
    status, body, _ = await read_all(rig.url + CHAT, chat_body(), {})
    assert status == 502 and b'"type":"upstream_unreachable"' in body
    await counted(rig, "502", "error")
    await settles_to(before)


async def test_upstream_resets_before_headers(rig_factory):
    rig = await rig_factory()
    before = await quiet_census()
    status, body, _ = await read_all(rig.url + CHAT, chat_body(), sim_headers(fail="reset"))
    assert status == 502 and b'"type":"upstream_disconnected"' in body
    await counted(rig, "502", "error")
    assert rig.sim.dropped == 1
    await settles_to(before)


async def test_upstream_resets_mid_stream(rig_factory):
    rig = await rig_factory()
    before = await quiet_census()
    status, body, end = await read_all(rig.url + CHAT, chat_body(), sim_headers(fail="drop"))
    assert status == 200 and isinstance(
        end, aiohttp.ClientPayloadError
    )  # truncated, never a clean end
    assert body.endswith(b"}\n\n") and b"[DONE]" not in body and body.count(b'"content":"') == 11
    await counted(rig, "200", "error")
    assert rig.sample("llm_tokens_total", type="output", **LABELS) == 10  # partial figures kept
    await settles_to(before)


async def test_upstream_stalls_past_idle_timeout(rig_factory):
    rig = await rig_factory(read_timeout=0.5)
    before = await quiet_census()
    # The stall lasts a day and read_all gives up after 10 s: a cut before that is the 0.5 s timeout.
    status, body, end = await read_all(rig.url + CHAT, chat_body(), sim_headers(fail="stall"))
    assert status == 200 and isinstance(end, aiohttp.ClientPayloadError)
    assert body.count(b'"content":"') == 11 and b"[DONE]" not in body
    await counted(rig, "200", "error")
    await wait_for(lambda: rig.sim.cancelled == 1, timeout=30)  # the stalled upstream is let go
    await settles_to(before)


async def test_upstream_closes_without_done(rig_factory):
    rig = await rig_factory()
    before = await quiet_census()
    status, body, end = await read_all(rig.url + CHAT, chat_body(), sim_headers(fail="truncate"))
    # Exactly what the upstream sent, ending cleanly: the sidecar adds no [DONE] and cuts nothing.
    assert (
        status == 200 and end is None and b"[DONE]" not in body and body.count(b'"content":"') == 11
    )
    # A clean HTTP end without [DONE] is how a server that died between chunks looks: an
    # error (upstream_stream_truncated) with the upstream's 200; tokens estimated from the stream.
    await counted(rig, "200", "error")
    assert rig.sample("llm_tokens_total", type="output", **LABELS) == 10
    assert rig.sample("llm_token_count_source_total", source="estimated", **LABELS) == 1
    assert rig.sim.truncated == 1
    # A cleanly ended response returns its upstream connection to the pool, on purpose.
    await settles_to(before.plus(tasks=1, fds=2, established=2))


async def test_endless_line_passes_with_bounded_buffers(rig_factory):
    """A 32 MiB line with no line end: every byte reaches the client, the parser gives up on
    that line (one parse error) and picks up after it, and memory stays far below the line."""
    line = 32 << 20
    rig = await rig_factory(max_sse_line_bytes=64 << 10)
    before = await quiet_census()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        size = 0
        tail = b""
        xs = 0
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(
                rig.url + CHAT,
                json=chat_body(),
                headers=sim_headers(fail="longline", line_bytes=str(line)),
            ) as r:
                async for chunk in r.content.iter_any():  # streamed, never held whole
                    size += len(chunk)
                    xs += chunk.count(b"x")
                    tail = (tail + chunk)[-64:]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size > line and xs >= line and tail.endswith(b"data: [DONE]\n\n")
    # Client, sidecar and simulator share this process: all three together stay bounded.
    assert peak - base < 8 << 20, (
        f"peak {(peak - base) >> 20} MiB while relaying a {line >> 20} MiB line"
    )
    await counted(rig, "200", "ok")
    assert rig.sample("llm_stream_parse_errors_total", route=CHAT) == 1
    assert (
        rig.sample("llm_tokens_total", type="output", **LABELS) == 20
    )  # from the usage after the line
    await settles_to(before.plus(tasks=1, fds=2, established=2))


async def test_client_disconnects_before_headers(rig_factory):
    """The upstream has answered nothing yet (a whole-body request still generating)."""
    rig = await rig_factory()
    before = await quiet_census()
    async with aiohttp.ClientSession() as s:
        task = asyncio.create_task(
            s.post(rig.url + CHAT, json=chat_body(stream=False), headers={"x-sim-fail": "stall"})
        )
        await wait_for(lambda: rig.sim.started == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # A stall holds the upstream for a day: only the client's leaving, passed on, ends it.
    await wait_for(lambda: rig.sim.cancelled == 1, timeout=30)
    # nginx's 499: no response ever reached the client.
    await counted(rig, "499", "cancelled")
    await settles_to(before)


async def test_client_disconnects_mid_stream(rig_factory):
    rig = await rig_factory()
    before = await quiet_census()
    async with aiohttp.ClientSession() as s:
        async with s.post(
            rig.url + CHAT, json=chat_body(), headers=sim_headers(tokens=10_000)
        ) as r:
            seen = b""
            async for chunk in r.content.iter_any():
                seen += chunk
                if seen.count(b'"content":"') > 5:
                    break
            r.close()
    await wait_for(lambda: rig.sim.cancelled == 1, timeout=2)
    await counted(rig, "200", "cancelled")
    await settles_to(before)


# -- slow client: backpressure reaches the upstream -----------------------------------------------


def event(i: int) -> bytes:
    """Event ``i`` of the firehose: ~1 KiB, content derived from ``i`` so a prefix is checkable."""
    return b'data: {"choices":[{"index":0,"delta":{"content":"%08d%s"}}]}\n\n' % (i, b"z" * 1000)


async def test_slow_client_backpressure_reaches_upstream(upstream, serve_process):
    """A client reading one byte at a time: the upstream's writes block (it is paused, not
    buffered for), the sidecar's memory stays flat, the bytes that arrive are exact."""
    state = {"written": 0, "ended": None}

    async def firehose(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(1 << 20):  # up to ~1 GiB if nothing pushed back
                data = event(i)
                await resp.write(data)
                state["written"] += len(data)
        except (ConnectionError, asyncio.CancelledError):
            state["ended"] = "client gone"
            raise
        return resp

    async def warm(request: web.Request) -> web.Response:
        await request.read()
        resp = web.Response(text="warm")
        resp.force_close()  # not pooled: the census below starts with no upstream connection
        return resp

    def routes(app: web.Application) -> None:
        app.router.add_post(CHAT, firehose)
        app.router.add_post("/warm", warm)

    up = await upstream.start(routes)
    sc = serve_process(up.url)
    await sc.wait_alive()
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(sc.url + "/warm", json={"model": MODEL}) as r:
                assert await r.text() == "warm"
    pid = sc.proc.pid
    await asyncio.sleep(0.2)
    before = await quiet_census(pid)
    rss_start = rss_bytes(pid)

    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", sc.port))
    body = (
        b'{"model":"%s","stream":true,"stream_options":{"include_usage":true},"messages":[]}'
        % MODEL.encode()
    )
    # HTTP/1.0: the body comes back unchunked, so the bytes read are the upstream's bytes.
    await loop.sock_sendall(
        sock,
        b"POST %s HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (CHAT.encode(), len(body), body),
    )
    got = bytearray()
    marks = {}
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < 3.0:
        b = await loop.sock_recv(sock, 1)  # one byte at a time
        assert b, "the sidecar closed the slow client's connection"
        got += b
        if len(got) % 64 == 0:
            await asyncio.sleep(0.001)
        if elapsed > 1.5 and "mid" not in marks:
            marks["mid"] = state["written"]
    marks["end"] = state["written"]
    rss_end = rss_bytes(pid)
    head, _, relayed = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and len(relayed) > 1000
    expected = b"".join(event(i) for i in range(len(relayed) // len(event(0)) + 1))
    assert relayed == expected[: len(relayed)]  # exact and in order
    # Paused: in the last 1.5 s the upstream wrote about what the client read, not more.
    assert marks["end"] - marks["mid"] < 1 << 20, marks
    # Bounded: socket buffers along the path, not the 1 GiB the upstream would send.
    assert marks["end"] < 64 << 20, marks
    assert rss_end - rss_start < 16 << 20, (rss_start, rss_end)
    print(
        f"\nslow client: read {len(got)} B one byte at a time; upstream wrote {marks['end'] >> 10} KiB then blocked; sidecar RSS {rss_start >> 20} -> {rss_end >> 20} MiB"
    )

    sock.close()
    await wait_for(lambda: state["ended"] == "client gone", timeout=30)

    async def cancelled() -> bool:
        return (
            sample_of(await sc.metrics(), "llm_requests_total", code="200", outcome="cancelled")
            == 1
        )

    await wait_for(cancelled, timeout=30)
    await settles_to(before, pid)


# -- SIGTERM with streams in flight ----------------------------------------------------------------


_LEAK_SIGNS = (
    "Unclosed",
    "Task was destroyed",
    "was never awaited",
    "ResourceWarning",
    "Traceback",
)


async def test_sigterm_drains_concurrent_streams_and_leaves_nothing(serve_process):
    """Extends test_lifecycle's drain test: several streams at once, in dev mode, and the exit
    must be clean (no unclosed session, connection or task reported) with the upstream left
    holding no connection from the sidecar."""
    app = build_simulator_app(SimulatorConfig(ttft=0.05, tpot=0.05, jitter=0, tokens=20))
    sim_runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    sim_port = await start_site(sim_runner)
    try:
        sc = serve_process(
            f"http://127.0.0.1:{sim_port}", "--drain-seconds", "60", env={"PYTHONDEVMODE": "1"}
        )
        await sc.wait_alive()

        async def stream() -> bytes:
            async with aiohttp.ClientSession() as s:
                async with s.post(
                    sc.url + CHAT,
                    json=chat_body(),
                    headers={"x-sim-tokens": "20", "x-sim-tpot": "0.05"},
                ) as r:
                    return await r.read()

        streams = [asyncio.create_task(stream()) for _ in range(5)]
        await wait_for(lambda: app[SIM_STATS].started == 5, timeout=30)
        sc.proc.send_signal(signal.SIGTERM)
        async with (
            aiohttp.ClientSession() as s
        ):  # relayed while the upstream answers (sidecar/relay/server/drain.py)

            async def draining() -> bool:
                async with s.get(sc.admin_url + "/readyz") as r:
                    return r.status == 503

            await wait_for(draining, timeout=30)
            async with s.get(sc.url + "/v1/models") as r:
                assert r.status == 200
        bodies = await asyncio.gather(*streams)
        assert all(
            b.endswith(b"data: [DONE]\n\n") and b.count(b'"content":"') == 21 for b in bodies
        )
        t0 = time.monotonic()
        for site in list(sim_runner.sites):  # the server stops listening, as in a pod's shutdown
            await (
                site.stop()
            )  # (its idle keep-alive connections stay open: the drain must not be fooled)
        assert await asyncio.to_thread(sc.proc.wait, 45) == 0
        assert time.monotonic() - t0 < 30, (
            "exits once the upstream is gone, not at drain_seconds (60)"
        )
        out, err = sc.stop()
        for sign in _LEAK_SIGNS:
            assert sign not in out and sign not in err, (sign, out, err)
        assert app[SIM_STATS].completed == 5 and app[SIM_STATS].in_flight == 0
        await wait_for(
            lambda: (
                not [
                    s
                    for s in tcp_sockets()
                    if s[1] == sim_port and s[0] != "LISTEN" and s[0] != "TIME_WAIT"
                ]
            )
        )
    finally:
        await sim_runner.cleanup()
