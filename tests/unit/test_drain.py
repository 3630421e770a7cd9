"""sidecar/relay/drain.py: the three steps of a shutdown that loses no request, driven directly."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from sidecar.relay.drain import POLL_SECONDS, RETRY_AFTER_SECONDS, Drain


class Upstream:
    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.asked = 0

    async def __call__(self) -> bool:
        self.asked += 1
        if self.up is None:
            raise aiohttp.ClientConnectionError("refused")
        return self.up


async def test_keeps_serving_while_the_upstream_answers_then_refuses():
    upstream, in_flight = Upstream(True), [0]
    drain = Drain(upstream, lambda: in_flight[0])
    task = asyncio.create_task(drain.run(10))
    await asyncio.sleep(3 * POLL_SECONDS)
    assert drain.draining and not drain.refusing and upstream.asked >= 2
    upstream.up = None  # the server closed its listener
    await asyncio.sleep(2 * POLL_SECONDS)
    assert drain.refusing and task.done(), "nothing in flight: the proxy may close"


async def test_waits_for_in_flight_requests_once_the_upstream_is_gone():
    in_flight = [2]
    drain = Drain(Upstream(False), lambda: in_flight[0])
    task = asyncio.create_task(drain.run(10))
    await asyncio.sleep(0.2)
    assert drain.refusing and not task.done()
    in_flight[0] = 0
    await asyncio.wait_for(task, 1)


async def test_drain_seconds_bounds_every_step():
    started = time.monotonic()
    await Drain(Upstream(True), lambda: 1).run(0.6)  # upstream never leaves, a stream never ends
    assert 0.5 < time.monotonic() - started < 1.5


async def test_a_hanging_health_check_counts_as_gone_at_the_deadline():
    async def hangs() -> bool:
        await asyncio.sleep(60)
        return True

    drain = Drain(hangs, lambda: 0)
    started = time.monotonic()
    await drain.run(0.5)
    assert drain.refusing and time.monotonic() - started < 1.5


@pytest.mark.parametrize("refusing", [False, True])
async def test_gate_refuses_with_503_json_and_retry_after_only_when_refusing(refusing):
    drain = Drain(Upstream(), lambda: 0)
    drain.refusing = refusing

    async def handler(request):
        return web.Response(text="relayed")

    response = await drain.gate(make_mocked_request("POST", "/v1/chat/completions"), handler)
    if not refusing:
        assert response.text == "relayed"
        return
    assert response.status == 503
    assert response.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert response.content_type == "application/json"
    assert orjson.loads(response.body)["error"]["type"] == "draining"
    assert not response.keep_alive, "the client reconnects, to another pod"


@pytest.mark.parametrize("draining", [False, True])
async def test_responses_close_their_connection_once_draining(draining):
    drain = Drain(Upstream(), lambda: 0)
    drain.draining = draining
    response = web.StreamResponse()
    await drain.close_connections(make_mocked_request("GET", "/v1/models"), response)
    assert response.keep_alive is (False if draining else None)
    assert response.headers.get("Connection") == ("close" if draining else None)
