"""Over real sockets: the request families' cells are updated without client_python's lock
(sidecar/export/prometheus_internals.py: ``Count``, ``Observed``, ``Row``), which is right
only while they have one writer. This holds the production sidecar to it: with streams
relayed while /metrics is scraped over and over (rendered on its own thread:
sidecar/export/scrape.py), every update of a cell runs on the event loop's thread, the
render runs on another and writes none, and the counts come out exact."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest

from sidecar.export import prometheus_internals as internals
from tests.fixtures.streams.harness import load
from tests.support.sse import replaying
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ROUTE = "/v1/chat/completions"
REQUESTS = 24


async def test_every_cell_update_is_on_the_loop_while_pages_render(
    upstream, sidecar_factory, monkeypatch
):
    writers: set[int] = set()
    renders: set[int] = set()

    def noted(name: str, where: object) -> None:
        own = getattr(where, name)

        def update(*args, **kwargs):
            writers.add(threading.get_ident())
            return own(*args, **kwargs)

        monkeypatch.setattr(where, name, update)

    for name in ("write",):
        noted(name, internals.Row)
    for name in ("add",):
        noted(name, internals.Count)
        noted(name, internals._LockedCount)
    for name in ("observe", "observe_many", "observe_repeated"):
        noted(name, internals.Observed)
    collect = internals.WithoutCreated.collect

    def rendered(self):
        renders.add(threading.get_ident())
        return collect(self)

    monkeypatch.setattr(internals.WithoutCreated, "collect", rendered)

    raw = load("openai", "built_vllm_chat.txt")
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, replaying(raw, piece=61)))
    sc = await sidecar_factory(up.url)
    loop_thread = threading.get_ident()
    done = asyncio.Event()

    async def scrape(s: aiohttp.ClientSession) -> int:
        pages = 0
        while not done.is_set():
            async with s.get(sc.admin_url + "/metrics") as r:
                assert r.status == 200
                await r.read()
            pages += 1
        return pages

    async def one(s: aiohttp.ClientSession) -> None:
        async with s.post(sc.url + ROUTE, json={"model": "m", "stream": True}) as r:
            assert r.status == 200
            assert await r.read() == raw

    async with aiohttp.ClientSession() as s:
        scraping = asyncio.ensure_future(scrape(s))
        for _ in range(REQUESTS // 4):
            await asyncio.gather(*(one(s) for _ in range(4)))
        await wait_for(
            lambda: (
                sc.sample("llm_requests_total", route=ROUTE, model="m", code="200", outcome="ok")
                == REQUESTS
            )
        )
        done.set()
        assert await scraping > 0
    assert writers == {loop_thread}
    assert renders and loop_thread not in renders
    assert sc.sample("llm_request_duration_seconds_count", model="m", outcome="ok") == REQUESTS
