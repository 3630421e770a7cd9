"""The drain over a real ``serve`` subprocess and real sockets, outside Kubernetes and in a pod
(docs/reliability.md): outside Kubernetes SIGTERM with a stream in flight exits once the
stream has ended, not after the whole ``drain_seconds`` (30 s), and the drain says what it
waits for and that a second signal exits now."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest
from aiohttp import web

from tests.support.serve import ServeProcess
from tests.support.sse import chat_chunk, scripted
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


def events(sc: ServeProcess) -> list[dict]:
    out = []
    for line in sc.out + sc.err:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def logged(sc: ServeProcess, event: str) -> dict | None:
    return next((e for e in events(sc) if e.get("event") == event), None)


async def exited(sc: ServeProcess, timeout: float) -> int:
    """The exit code, waiting off the event loop (the upstream runs on it)."""
    return await asyncio.to_thread(sc.proc.wait, timeout)


def routes_with(script):
    async def health(request):
        return web.json_response({})

    async def models(request):
        return web.json_response({"data": [{"id": "m1"}]})

    def routes(app):
        app.router.add_post("/v1/chat/completions", scripted(script))
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)

    return routes


async def test_outside_kubernetes_sigterm_exits_when_the_last_stream_ends(upstream):
    script = [(0.0, chat_chunk(role=True))] + [(0.1, chat_chunk(f"t{i}")) for i in range(10)]
    script += [(0.0, b"data: [DONE]\n\n")]
    up = await upstream.start(routes_with(script))
    sc = ServeProcess(up.url, "--drain-seconds", "30", clean_env=True)  # no KUBERNETES_SERVICE_HOST
    try:
        await sc.wait_alive()
        received = b""
        async with aiohttp.ClientSession() as s:
            async with s.post(
                sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
            ) as r:
                async for chunk in r.content.iter_any():
                    received += chunk
                    if (
                        b"t1" in received
                        and sc.proc.poll() is None
                        and logged(sc, "draining") is None
                    ):
                        sc.proc.send_signal(signal.SIGTERM)
                        await wait_for(lambda: logged(sc, "draining") is not None, timeout=30)
        stream_end = time.monotonic()
        assert received.endswith(b"data: [DONE]\n\n"), "the stream in flight finished whole"
        assert await exited(sc, 45) == 0
        # On main: 30 s (drain_seconds) after the stream ended, the upstream still answering.
        assert time.monotonic() - stream_end < 5, "exits once nothing is in flight"
    finally:
        sc.stop()
    draining = logged(sc, "draining")
    assert draining["in_flight"] == 1 and draining["drain_seconds"] == 30
    assert draining["waits_for"] == "1 request in flight to end", draining
    assert "again to exit now" in draining["exit_now"], draining
    assert logged(sc, "drained") is not None and logged(sc, "stopped") is not None


async def test_in_kubernetes_the_drain_waits_for_the_upstream_and_a_second_signal_ends_it(upstream):
    """In a pod the endpoints still send requests for a few seconds after SIGTERM: an idle
    sidecar keeps relaying while the upstream answers (the pre-stop grace is kept), says so,
    and a second signal exits at once."""
    up = await upstream.start(
        routes_with([(0.0, chat_chunk(role=True)), (0.0, b"data: [DONE]\n\n")])
    )
    sc = ServeProcess(
        up.url,
        "--drain-seconds",
        "60",
        clean_env=True,
        env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
    )
    try:
        await sc.wait_alive()
        sc.proc.send_signal(signal.SIGTERM)
        await wait_for(lambda: logged(sc, "draining") is not None, timeout=30)
        async with aiohttp.ClientSession() as s:
            async with s.get(sc.url + "/v1/models") as r:  # a request the endpoints still sent
                assert r.status == 200 and await r.json() == {"data": [{"id": "m1"}]}
                assert r.headers.get("Connection") == "close"
        await asyncio.sleep(1.0)
        assert sc.proc.poll() is None, "in a pod the drain waits while the upstream answers"
        draining = logged(sc, "draining")
        assert draining["in_flight"] == 0 and "inference server to stop" in draining["waits_for"], (
            draining
        )
        assert "again to exit now" in draining["exit_now"]
        forced_at = time.monotonic()
        sc.proc.send_signal(signal.SIGTERM)
        assert await exited(sc, 30) == 0
        assert time.monotonic() - forced_at < 3, "a second signal exits at once"
    finally:
        sc.stop()
    assert logged(sc, "forced_exit") is not None
