"""Request bodies held while they arrive have one process-wide budget.

Sixteen clients each declaring 30 MiB, sending all but the last byte, held 536 MiB in the
sidecar (a byte a minute keeps each alive), past the chart's 512Mi limit. Now bodies that do
not fit the budget (``max_buffered_request_bytes``) are streamed to the upstream as they
arrive, so the sidecar holds about the budget, every request still completes when its last
byte comes, and the model is still read from every body (in flight for the streamed ones).

A ``serve`` subprocess (its RSS read from /proc) in front of a raw upstream that reads each
body as it comes."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.census import CHART_LIMIT, MiB, proc_status, reset_peak
from tests.support.raw import BodyReadingUpstream
from tests.support.samples import sample_of

pytestmark = pytest.mark.integration

CLIENTS = 12
BODY = 24 * MiB


async def test_bodies_held_at_once_stay_within_the_budget_and_all_complete(serve_process):
    up = BodyReadingUpstream()
    sc = serve_process(await up.start())
    await sc.wait_alive()
    pid = sc.proc.pid
    body = b'{"model":"m","stream":true,"pad":"' + b"p" * (BODY - 40) + b'"}'
    await asyncio.sleep(0.2)
    before = proc_status(pid, "VmRSS")
    reset_peak(pid)

    async def all_but_the_last_byte():
        reader, writer = await asyncio.open_connection("127.0.0.1", sc.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        )
        writer.write(b"Content-Length: %d\r\n\r\n" % len(body))
        view = memoryview(body)
        for i in range(0, len(body) - 1, 1 << 20):
            writer.write(view[i : min(i + (1 << 20), len(body) - 1)])
            await writer.drain()
        return reader, writer

    clients = await asyncio.gather(*(all_but_the_last_byte() for _ in range(CLIENTS)))
    await asyncio.sleep(1.0)  # let the sidecar take what it was sent
    held = proc_status(pid, "VmHWM") - before
    for _, writer in clients:
        writer.write(body[-1:])
    replies = [await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 30) for reader, _ in clients]
    for _, writer in clients:
        writer.close()
    up.server.close()

    print(
        f"{CLIENTS} x {BODY // MiB} MiB bodies, last byte withheld: peak rose by {held / MiB:.0f} MiB"
    )
    # The default budget is 64 MiB; the rest of the bodies went on to the upstream.
    assert held < 128 * MiB, f"the sidecar held {held / MiB:.0f} MiB of unfinished bodies"
    assert proc_status(pid, "VmHWM") < CHART_LIMIT // 2
    assert all(r.startswith(b"HTTP/1.1 200 ") and b"[DONE]" in r for r in replies)
    # (The sidecar's own requests, model discovery and health, have no body.)
    assert [n for n in up.received if n] == [len(body)] * CLIENTS
    text = await sc.metrics()
    # Every request labelled with its model, the streamed ones included.
    assert sample_of(text, "llm_requests_total", model="m", outcome="ok") == CLIENTS
