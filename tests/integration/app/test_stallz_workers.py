"""``/stallz`` of ``serve --workers 2`` over real sockets and processes: the pod's supervisor
answers it from both workers' own, so a hung engine is one verdict for the pod, and one
worker's stalled streams are not the engine's while the other worker's stream moves.

The upstream is an aiohttp server in the test: a request with ``x-mode: stall`` gets its
head and one token, then nothing until the test releases it (the connection open: a hung
engine); ``x-mode: move`` gets a token every 0.2 s until released. Each stream is its own
connection, so the kernel spreads them over the workers (``SO_REUSEPORT``); the test opens
stalled streams until the pod's answer shows both workers hold some.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.support.in_process import start_app
from tests.support.serve import start_pod
from tests.support.sse import DONE, chat_chunk
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ROUTE = "/v1/chat/completions"
STALL, PROBE = 1, 2  # --stall-seconds, --stall-probe-seconds
BODY = {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class HangingUpstream:
    def __init__(self) -> None:
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(ROUTE, self.chat)
        app.router.add_get("/health", _ok)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chat_chunk(role=True, model="m1"))
        await resp.write(chat_chunk("t", model="m1"))
        if request.headers["x-mode"] == "stall":
            await self.release.wait()
        else:
            while not self.release.is_set():
                await asyncio.sleep(0.2)
                await resp.write(chat_chunk("t", model="m1"))
        await resp.write(chat_chunk(finish="stop", model="m1"))
        await resp.write(DONE)
        await resp.write_eof()
        return resp


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


class Stream:
    """One streamed request on its own connection, read in the background."""

    def __init__(self, proxy: str, mode: str) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self.task = asyncio.ensure_future(self._run(proxy, mode))
        self.first = asyncio.Event()

    async def _run(self, proxy: str, mode: str) -> bytes:
        async with self.session.post(proxy + ROUTE, json=BODY, headers={"x-mode": mode}) as r:
            assert r.status == 200
            await r.content.readline()
            self.first.set()
            return await r.read()

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.session.close()


async def _stallz(admin: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.get(admin + "/stallz") as r:
            return r.status, await r.json()


async def test_the_pods_stallz_judges_over_every_workers_requests(serve_process, tmp_path: Path):
    upstream = HangingUpstream()
    runner, port = await start_app(upstream.app())
    streams: list[Stream] = []
    try:
        pod = await start_pod(
            serve_process, f"http://127.0.0.1:{port}", tmp_path, 2,
            "--stall-seconds", str(STALL), "--stall-probe-seconds", str(PROBE),
        )  # fmt: skip
        async with aiohttp.ClientSession() as s:
            async with s.get(pod.admin_url + "/") as r:
                assert "/stallz" in await r.text()  # the supervisor's index lists it
        status, doc = await _stallz(pod.admin_url)
        assert status == 200 and doc["in_flight"] == 0
        assert [w["worker"] for w in doc["workers"]] == [0, 1]

        # Stalled streams until both workers hold some (each its own connection).
        for _ in range(24):
            streams.append(Stream(pod.url, "stall"))
            await asyncio.wait_for(streams[-1].first.wait(), 10)
            status, doc = await _stallz(pod.admin_url)
            if len(streams) >= 2 and all(w["in_flight"] > 0 for w in doc["workers"]):
                break
        assert all(w["in_flight"] > 0 for w in doc["workers"]), doc

        async def hung() -> dict | None:
            status, doc = await _stallz(pod.admin_url)
            return doc if status == 503 else None

        await wait_for(hung, timeout=PROBE + 10)
        status, doc = await _stallz(pod.admin_url)
        assert status == 503 and doc["stalled_engine"] is True
        assert doc["in_flight"] == len(streams) and doc["stalled"] == len(streams)
        assert [w["stalled_engine"] for w in doc["workers"]] == [True, True]

        # One moving stream, on one worker: the engine works, whatever the other worker holds.
        moving = Stream(pod.url, "move")
        streams.append(moving)
        await asyncio.wait_for(moving.first.wait(), 10)
        status, doc = await _stallz(pod.admin_url)
        assert status == 200 and doc["stalled_engine"] is False, doc
        assert doc["in_flight"] == len(streams)
        # The worker without the moving stream, alone, would have said hung.
        assert sorted(w["stalled_engine"] for w in doc["workers"]) == [False, True], doc
        await asyncio.sleep(PROBE + 1)  # past the threshold, it keeps moving
        assert (await _stallz(pod.admin_url))[0] == 200

        upstream.release.set()
        bodies = await asyncio.wait_for(asyncio.gather(*(s.task for s in streams)), 30)
        assert all(body.rstrip().endswith(b"data: [DONE]") for body in bodies)
        status, doc = await _stallz(pod.admin_url)
        assert status == 200 and doc["in_flight"] == 0 and doc["seconds_since_completed"] < 5
    finally:
        upstream.release.set()
        for stream in streams:
            await stream.close()
        await runner.cleanup()
