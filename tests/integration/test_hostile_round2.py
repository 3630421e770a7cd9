"""Hostile clients, round two (issue 23), over raw sockets and real ports.

Finding 1: a whole request head has a budget on both ports: a client that sends many fields,
each within the per-field limit, and never ends the head gets 431 with the JSON error body as
soon as it passes the budget, instead of pinning up to ~1 MiB per connection until the head
timeout; request bodies do not count. Finding 5: the admin port caps its connections."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import wait_for
from tests.support.raw import RawUpstream, raw_exchange, raw_upstream, status_and_json  # noqa: F401 - fixture
from tests.support.rig import CHAT, rig_factory  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

# 126 fields of 8,000 B, as the probe sent: each within the 8,190 B field limit, never ended.
UNENDED = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 7990) for i in range(126))


async def test_an_unended_oversized_head_gets_431_on_both_ports(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url)
    for port in (rig.port, rig.admin_port):
        # The head timeout is 60 s: a reply within 5 s can only come from the budget.
        raw = await raw_exchange(port, UNENDED, wait=5.0)
        assert raw, f"port {port}: nothing answered an unended 1 MiB head"
        status, doc, head = status_and_json(raw)
        assert (status, doc["error"]["type"]) == (431, "request_head_too_large"), port
        assert b"content-type: application/json" in head.lower()
    assert up.requests == []


async def test_heads_within_the_budget_and_large_bodies_are_relayed(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url, max_request_head_bytes=48 * 1024)
    ok = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 1000) for i in range(40)) + b"\r\n"
    assert (await raw_exchange(rig.port, ok)).endswith(b"\r\n\r\nok")
    over = b"GET /x HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 1000) for i in range(60)) + b"\r\n"
    assert status_and_json(await raw_exchange(rig.port, over))[0] == 431
    # A body far larger than the head budget, then a second request on the same connection:
    # neither the body nor the next head is refused.
    body = b'{"model":"m","pad":"' + b"p" * 300_000 + b'"}'
    two = (
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
        + b"GET /y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    raw = await raw_exchange(rig.port, two, wait=5.0)
    assert raw.count(b"HTTP/1.1 200") == 2 and b" 431 " not in raw
    assert len(up.requests) == 3


async def test_the_admin_port_caps_its_connections_and_answers_503_past_the_cap(rig_factory, raw_upstream):
    """Issue 23, finding 5: 1,100 idle admin connections used to use up the open files."""
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url, max_admin_connections=5)
    idle = [await asyncio.open_connection("127.0.0.1", rig.admin_port) for _ in range(5)]
    raw = await raw_exchange(rig.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", wait=5.0)
    status, doc, head = status_and_json(raw)
    assert (status, doc["error"]["type"]) == (503, "too_many_connections")
    assert b"retry-after: 1" in head.lower()
    # The proxy port is not affected, and the admin port answers again once the idle ones go.
    assert (await raw_exchange(rig.port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).endswith(b"ok")
    for _, writer in idle:
        writer.close()

    async def healthz_ok() -> bool:
        return (await raw_exchange(rig.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).startswith(b"HTTP/1.1 200")

    await wait_for(healthz_ok)
