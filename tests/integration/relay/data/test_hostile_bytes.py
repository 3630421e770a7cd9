"""Pass-through is exact for any bytes, over real sockets: an upstream answers every measured
route (and an unmeasured one) with hypothesis-chosen bytes, written in hypothesis-chosen
pieces with a flush after each, and the client must receive exactly those bytes, whatever
the dialect made of them (or, on an OpenAI stream whose usage the sidecar asked for on the
client's behalf, exactly those bytes minus the usage-only events). The byte mix is the one the dialect fuzzing uses
(:mod:`tests.unit.streams.test_fuzz_dialects`): recorded streams cut into lines, garbage, every line
end, long lines, JSON objects with the keys the dialects read.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings, strategies as st
from prometheus_client import CollectorRegistry

from sidecar.app import ProxyRunner, build_sidecar
from sidecar.base.routes import ROUTES
from sidecar.config import Settings
from tests.fixtures.streams.harness import split_at
from tests.support.fuzz import hostile_bytes

pytestmark = pytest.mark.integration

# A concrete path for each route template, with the content type its stream is read as.
PATHS = {t.replace("{model}", "m"): r.stream_mime for t, r in ROUTES.items() if r.measured}
PATHS["/not/measured"] = "text/event-stream"


class Echo:
    """Upstream whose next answer is set by the test: status, content type and pieces."""

    def __init__(self) -> None:
        self.answer: tuple[int, str, list[bytes]] = (200, "text/event-stream", [])

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        status, content_type, pieces = self.answer
        resp = web.StreamResponse(status=status, headers={"Content-Type": content_type})
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
            await asyncio.sleep(0)  # let each piece leave on its own
        await resp.write_eof()
        return resp


async def _start(
    app: web.Application, runner_cls=web.AppRunner, **kwargs
) -> tuple[web.AppRunner, int]:
    runner = runner_cls(app, **kwargs)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def _start_proxy(sc) -> tuple[ProxyRunner, int]:
    runner = ProxyRunner(sc, shutdown_timeout=1.0)
    await runner.setup()
    await runner.listen("127.0.0.1", 0)
    return runner, runner.addresses[0][1]


def test_any_bytes_any_route_any_pieces_pass_through_exactly():
    loop = asyncio.new_event_loop()
    echo = Echo()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo.handle)
    up_runner, up_port = loop.run_until_complete(_start(app))
    sc = build_sidecar(
        Settings(upstream=f"http://127.0.0.1:{up_port}", max_sse_line_bytes=256),
        CollectorRegistry(),
        access_log=False,
    )
    runner, port = loop.run_until_complete(_start_proxy(sc))
    session = loop.run_until_complete(_session())

    async def roundtrip(path: str, body: dict) -> tuple[int, bytes]:
        async with session.post(f"http://127.0.0.1:{port}{path}", json=body) as r:
            return r.status, await r.read()

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.sampled_from(sorted(PATHS)),
        st.data(),
        st.sampled_from([200, 200, 200, 404, 500]),
        st.booleans(),
        st.booleans(),
    )
    def check(path: str, data, status: int, declared_json: bool, client_asked_usage: bool) -> None:
        raw = data.draw(hostile_bytes)
        pieces = split_at(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
        content_type = "application/json" if declared_json else PATHS[path]
        echo.answer = (status, content_type, pieces)
        body = {"model": "m", "stream": not declared_json, "messages": [], "prompt": "x"}
        if client_asked_usage:
            body["stream_options"] = {"include_usage": True}
        got_status, got = loop.run_until_complete(roundtrip(path, body))
        assert got_status == status
        assert got == raw

    try:
        check()
    finally:
        loop.run_until_complete(session.close())
        loop.run_until_complete(runner.cleanup())
        loop.run_until_complete(up_runner.cleanup())
        loop.close()


async def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(auto_decompress=False)
