"""Connections that never finish a head, and more connections than file descriptors: the
proxy port lets them go or refuses them, and the admin port (the kubelet's probes, the
scrape) keeps answering. ``serve`` subprocesses on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import resource
import time

import aiohttp
import pytest

from tests.support.raw import TCP_ESTABLISHED, tcp_state
from tests.support.serve import ServeProcess
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


class LimitedServe(ServeProcess):
    """``serve`` with its open-files limit (soft and hard) set before it starts."""

    def __init__(self, upstream_url: str, nofile: int, *extra: str) -> None:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        super().__init__(upstream_url, *extra, preexec_fn=limit)


async def open_idle(port: int, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    return [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]


async def admin_answers(sc: ServeProcess) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ("/healthz", "/metrics"):
            async with s.get(sc.admin_url + path, timeout=aiohttp.ClientTimeout(total=5)) as r:
                assert r.status == 200, path


async def read_to_eof(reader: asyncio.StreamReader, wait: float = 5.0) -> bytes:
    out = b""
    async with asyncio.timeout(wait):
        while chunk := await reader.read(65536):
            out += chunk
    return out


async def test_connections_past_the_fd_limit_get_503_and_the_admin_port_answers(
    serve_process, upstream
):
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    await upstream.start(lambda app: app.router.add_get("/v1/models", models))
    sc = LimitedServe(upstream.url, 256)
    try:
        await sc.wait_alive()
        held = await open_idle(sc.port, 200)  # above the cap (256 - 128) // 2 = 64
        answers = []
        for reader, _ in held[64:]:
            answers.append(await read_to_eof(reader))
        refused = [a for a in answers if a]
        assert len(refused) == len(answers) == 136
        head, _, body = refused[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert (
            b"\r\nRetry-After: 1\r\n" in head and b"\r\nContent-Type: application/json\r\n" in head
        )
        assert json.loads(body)["error"]["type"] == "too_many_connections"
        for reader, _ in held[:64]:  # the accepted ones are still open, nothing was said
            assert not reader.at_eof() and not reader._buffer
        await admin_answers(sc)

        for _, writer in held:
            writer.close()

        async def admitted() -> bool:  # once the sidecar has seen the closes
            async with aiohttp.ClientSession() as s:
                async with s.get(sc.url + "/v1/models") as r:
                    if r.status == 503:
                        return False
                    assert r.status == 200 and await r.json() == {"data": []}
                    return True

        await wait_for(admitted)
    finally:
        out, err = sc.stop()
        err = out + err
    lines = [json.loads(line) for line in err.splitlines() if "connection_limit_reached" in line]
    assert len(lines) == 1 and lines[0]["max_connections"] == 64, err[
        -2000:
    ]  # rate-limited: one line


async def test_configured_connection_cap(serve_process):
    sc = serve_process("http://127.0.0.1:9", "--max-connections", "5")
    await sc.wait_alive()
    held = await open_idle(sc.port, 5)
    reader, writer = await asyncio.open_connection("127.0.0.1", sc.port)
    assert (await read_to_eof(reader)).startswith(b"HTTP/1.1 503 ")
    await admin_answers(sc)
    held[0][1].close()

    async def admitted() -> bool:  # once the sidecar has seen the close
        reader, writer = await asyncio.open_connection("127.0.0.1", sc.port)
        try:
            writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await read_to_eof(reader)
        except ConnectionResetError:  # refused: its 503 and close crossed our request
            return False
        finally:
            writer.close()
        if answer.startswith(b"HTTP/1.1 503 "):
            return False
        assert answer.startswith(b"HTTP/1.1 502 "), answer  # admitted: no upstream there
        return True

    await wait_for(admitted)
    for _, w in held:
        w.close()


async def test_heads_that_never_finish_are_let_go_after_client_header_timeout(serve_process):
    sc = serve_process("http://127.0.0.1:9", "--client-header-timeout", "1")
    await sc.wait_alive()
    idle = await open_idle(sc.port, 100)
    dribble_reader, dribble = await asyncio.open_connection("127.0.0.1", sc.port)
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 300
    started = time.monotonic()
    closed_at = None
    for byte in head:  # one byte every 0.1 s: 30 s for the head
        try:
            dribble.write(bytes([byte]))
            await dribble.drain()
        except ConnectionError:
            closed_at = time.monotonic()
            break
        if (
            dribble_reader.at_eof()
            or tcp_state(dribble.get_extra_info("socket")) != TCP_ESTABLISHED
        ):
            closed_at = time.monotonic()
            break
        await asyncio.sleep(0.1)
        try:
            if await asyncio.wait_for(dribble_reader.read(1), 0.001) == b"":
                closed_at = time.monotonic()
                break
        except TimeoutError:
            pass
    # Let go after the 1 s timeout (late on a loaded machine), long before the head is done.
    assert closed_at is not None and closed_at - started < 15, "the half head kept its connection"
    for reader, _ in idle:  # idle ones too, never a byte sent
        assert await read_to_eof(reader) == b""
    await admin_answers(sc)
    for _, w in idle:
        w.close()
