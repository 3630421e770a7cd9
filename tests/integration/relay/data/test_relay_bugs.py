"""A bug in the relay never leaves a request hanging, over real sockets against the simulated
server: before any response head was written the client gets the sidecar's 500 and the
connection closes; after the head, the connection closes without a body's last chunk (a
truncated answer, never a false clean end). Either way the request is recorded once, as the
sidecar's own failure (``error_type="internal"``), and nothing stays in flight.

The bug is planted with ``monkeypatch`` in one step of the production relay (the response
head's construction, or the upstream connection handing the body to the response leg)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from sidecar.relay.data import exchange
from sidecar.relay.data.upstream import UpstreamConnection
from tests.support.rig import CHAT, Rig
from tests.support.samples import in_flight_total
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

MODEL = "sim-llama-3-8b"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
HEADERS = {"x-sim-ttft": "0.01", "x-sim-tpot": "0.005", "x-sim-tokens": "5"}


def planted(*args: object, **kwargs: object) -> None:
    raise RuntimeError("a planted bug")


async def recorded_internal(rig: Rig, code: str) -> None:
    """``code``: the upstream's status, which the record keeps once the upstream answered."""
    labels = {"model": MODEL, "route": CHAT, "code": code, "outcome": "error"}
    await wait_for(lambda: rig.sample("llm_requests_total", error_type="internal", **labels) == 1)
    assert rig.sample("llm_requests_total", **labels) == 1  # once, and for nothing else
    assert in_flight_total(rig.registry) == 0


async def test_a_bug_before_the_head_is_answered_500_and_the_connection_closes(
    rig_factory, monkeypatch
):
    rig = await rig_factory()
    monkeypatch.setattr(exchange, "client_head", planted)
    async with aiohttp.ClientSession() as s, asyncio.timeout(10):
        async with s.post(rig.url + CHAT, json=BODY, headers=HEADERS) as r:
            assert r.status == 500 and r.headers["Connection"] == "close"
            assert (await r.json())["error"]["type"] == "internal"
    await recorded_internal(rig, "200")  # the upstream's answer was in when the bug struck


async def test_a_bug_after_the_head_closes_the_connection_without_a_last_chunk(
    rig_factory, monkeypatch
):
    rig = await rig_factory()
    monkeypatch.setattr(UpstreamConnection, "push", planted)
    async with aiohttp.ClientSession() as s, asyncio.timeout(10):
        async with s.post(rig.url + CHAT, json=BODY, headers=HEADERS) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()  # the connection closed before a complete body
    await recorded_internal(rig, "200")
