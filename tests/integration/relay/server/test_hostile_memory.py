"""Bounded memory per request, whatever the client sends.

A ``serve`` subprocess in front of a raw upstream that reads the whole request and answers
with a short stream; the peak (``VmHWM``) and current RSS of the sidecar process are read
from /proc. The bodies are the probe's: 33 MB of one million small chat messages, and 33 MB
of ``[{},{},...]``. Parsing them whole held 450 and 874 MiB (peaks 563 and 1,073) for the
whole stream, past the chart's 512Mi limit.

The same for a response: an upstream answering a non-streamed chat completion with 15.9 MiB
of ``{"choices":[{},{},...]}`` would take the sidecar from 55 to 554 MiB and stall its loop
1.5 s if the body were parsed whole.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.census import CHART_LIMIT, MiB, answer_times, proc_status, reset_peak
from tests.support.raw import BodyReadingUpstream, post_raw
from tests.support.samples import sample_of

pytestmark = pytest.mark.integration


def messages_body() -> bytes:
    return (
        b'{"model":"m","stream":true,"messages":['
        + b",".join([b'{"role":"user","content":"x"}'] * 1_100_000)
        + b"]}"
    )


def empties_body() -> bytes:
    return b"[" + b",".join([b"{}"] * 11_000_000) + b"]"


@pytest.mark.parametrize(
    "make_body", [messages_body, empties_body], ids=["million-messages", "empty-objects"]
)
async def test_largest_accepted_body_stays_far_below_the_chart_limit(serve_process, make_body):
    up = BodyReadingUpstream(
        event=b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n', hold=True
    )
    url = await up.start()
    sc = serve_process(url, "--max-request-body-bytes", str(64 * MiB))
    await sc.wait_alive()
    pid = sc.proc.pid
    body = make_body()
    assert 31 * MiB < len(body) <= 32 * MiB  # the largest body read to learn its model
    # Warm the code paths once, then measure from here.
    reader, writer = await post_raw(
        sc.port, b"/v1/chat/completions", b'{"model":"m","stream":true}'
    )
    await asyncio.wait_for(up.in_stream.wait(), 60)
    up.finish.set()
    await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 60)
    writer.close()
    up.finish.clear()
    up.in_stream.clear()
    await asyncio.sleep(0.2)
    before = proc_status(pid, "VmRSS")
    reset_peak(pid)

    reader, writer = await post_raw(sc.port, b"/v1/chat/completions", body)
    del body
    await asyncio.wait_for(up.in_stream.wait(), 60)
    await asyncio.sleep(0.3)
    during = proc_status(pid, "VmRSS")
    peak = proc_status(pid, "VmHWM")
    up.finish.set()
    data = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 60)
    writer.close()
    up.server.close()

    assert up.received[-1] > 31 * MiB and data.startswith(b"HTTP/1.1 200 ")
    print(
        f"rss before {before / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, during the stream {during / MiB:.0f} MiB"
    )
    # The raw bytes pass through a few buffers (aiohttp's reader, the joined body, the
    # upstream transport): a few times 33 MB at the peak, never a parsed object.
    assert peak - before < 200 * MiB, (before, peak)
    assert peak < CHART_LIMIT // 2
    # Nothing of the body is kept while the response streams.
    assert during - before < 40 * MiB, (before, during)


# -- a hostile non-streamed JSON response --------------------------------------------------------


def choices_body() -> bytes:
    """The finding's body: just under the default ``max_response_inspect_bytes`` (16 MiB) of
    ``{"choices":[{},{},...]}``, with a usage the sidecar must still read."""
    body = (
        b'{"id":"x","model":"m","choices":['
        + b",".join([b"{}"] * 5_550_000)
        + b'],"usage":{"prompt_tokens":7,"completion_tokens":11}}'
    )
    assert 15.8 * MiB < len(body) < 16 * MiB
    return body


async def test_huge_json_response_is_read_in_bounded_memory_and_never_stalls_the_loop(
    serve_process,
):
    """Parsed whole, this body took the sidecar from 53 to 553 MiB and stalled its loop 1.5 s.
    Read by the skeleton reader: the client gets every byte, the usage is counted, the
    peak stays within tens of MiB of idle and ``/healthz`` keeps answering at once."""
    import aiohttp
    from aiohttp import web

    big = choices_body()
    small = b'{"id":"w","model":"m","choices":[{"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(
            body=big if request.headers.get("x-big") else small, content_type="application/json"
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    sc = serve_process(f"http://127.0.0.1:{port}")
    try:
        await sc.wait_alive()
        pid = sc.proc.pid

        async with aiohttp.ClientSession() as s:
            for _ in range(2):  # warm the code paths (the JSON path included), then measure
                async with s.post(sc.url + "/v1/chat/completions", json={"model": "m"}) as r:
                    assert await r.read() == small
            await asyncio.sleep(0.3)
            before = proc_status(pid, "VmRSS")
            reset_peak(pid)

            async with answer_times(s, sc.admin_url + "/healthz") as waits:
                async with s.post(
                    sc.url + "/v1/chat/completions", json={"model": "m"}, headers={"x-big": "1"}
                ) as r:
                    got = await r.read()
                    status = r.status
                await asyncio.sleep(0.3)  # the observer's close runs after the last byte
            peak = proc_status(pid, "VmHWM")
            metrics = await sc.metrics()
    finally:
        await runner.cleanup()

    assert status == 200 and got == big  # byte-exact
    labels = {"route": "/v1/chat/completions", "model": "m"}
    assert sample_of(metrics, "llm_tokens_total", type="input", **labels) == 1 + 1 + 7
    assert sample_of(metrics, "llm_tokens_total", type="output", **labels) == 1 + 1 + 11
    print(
        f"rss before {before / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB; /healthz slowest {max(waits) * 1e3:.0f} ms of {len(waits)}"
    )
    # Before: +500 MiB (the body joined, then ~5.5 M dicts). The relay's own buffers and
    # the skeleton's 64 KiB pieces remain.
    assert peak - before < 64 * MiB, (before, peak)
    assert len(waits) >= 5 and max(waits) < 0.5, waits
