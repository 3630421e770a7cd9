"""Where the time goes, through a real sidecar over real sockets: each engine's queue time
reaches Prometheus (``llm_upstream_queue_seconds``) and the span, the sidecar's own cost
(``llm_sidecar_overhead_seconds``) counts only the sidecar's time, and the client gets the
server's bytes and headers unchanged all along.
"""

from __future__ import annotations

import asyncio
from functools import partial

import aiohttp
import orjson
import pytest
from aiohttp import web

from sidecar.base.labels import UNKNOWN as UNKNOWN_MODEL
from sidecar.export import semconv as sc
from tests.fixtures.streams.harness import load
from tests.support.samples import per_model
from tests.support.spans import one_span
from tests.support.sse import replaying
from tests.support.waits import wait_for

# Relay tests: each runs with the early path on (as served) and off (through the handler).
pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
VLLM = load("openai", "vllm032_chat_per_request_metrics.txt")
sse = partial(replaying, piece=101)  # a recording in 101-byte writes
SERVER_WAIT = 1.0  # how long the slow upstream thinks; none of it is the sidecar's (long, so a loaded CI machine's scheduling stalls stay far below half of it)


def _metrics(raw: bytes) -> dict:
    for line in raw.split(b"\n"):
        if b'"metrics"' in line:
            return orjson.loads(line[6:])["metrics"]
    raise AssertionError("no metrics")


async def test_vllm_queue_time_reaches_prometheus_and_the_span(upstream, traced, spans):
    _, exporter = spans
    up = await upstream.start(lambda app: app.router.add_post(CHAT, sse(VLLM)))
    s = await traced(up.url)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        async with session.post(s.url + CHAT, json=body) as r:
            got = await r.read()
    assert got == VLLM  # the client gets the server's bytes
    m = _metrics(VLLM)
    labels = {"model": "tiny", "route": CHAT}
    await wait_for(lambda: s.sample("llm_upstream_queue_seconds_count", **per_model(labels)) == 1)
    assert s.sample("llm_upstream_queue_seconds_sum", **per_model(labels)) == pytest.approx(
        m["queue_time_ms"] / 1000
    )
    assert s.sample("llm_upstream_prefill_seconds_sum", **per_model(labels)) == pytest.approx(
        m["time_to_first_token_ms"] / 1000
    )
    assert s.sample("llm_upstream_decode_seconds_sum", **per_model(labels)) == pytest.approx(
        m["generation_time_ms"] / 1000
    )
    span = await one_span(exporter)
    assert span.attributes[sc.LLM_SIDECAR_ENGINE_QUEUE] == pytest.approx(m["queue_time_ms"] / 1000)
    assert span.attributes[sc.LLM_SIDECAR_ENGINE_PREFILL] == pytest.approx(
        m["time_to_first_token_ms"] / 1000
    )
    assert 0 <= span.attributes[sc.LLM_SIDECAR_OVERHEAD_REQUEST] < 1
    assert 0 <= span.attributes[sc.LLM_SIDECAR_OVERHEAD_RESPONSE] < 1


async def test_tgi_timing_headers_are_read_and_relayed_unchanged(upstream, sidecar_factory):
    headers = {"x-queue-time": "187", "x-inference-time": "1044", "x-prompt-tokens": "11", "x-generated-tokens": "20",
               "x-time-per-token": "52", "x-compute-type": "gpu+optimized"}  # fmt: skip

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"generated_text": " hi"}, headers=headers)

    up = await upstream.start(lambda app: app.router.add_post("/generate", generate))
    s = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as session:
        async with session.post(s.url + "/generate", json={"inputs": "hello"}) as r:
            assert await r.json() == {"generated_text": " hi"}
            assert {k: r.headers[k] for k in headers} == headers
    labels = {"model": UNKNOWN_MODEL, "route": "/generate"}
    await wait_for(lambda: s.sample("llm_upstream_queue_seconds_count", **per_model(labels)) == 1)
    assert s.sample("llm_upstream_queue_seconds_sum", **per_model(labels)) == pytest.approx(0.187)
    assert s.sample("llm_tokens_total", type="output", **labels) == 20
    assert s.sample("llm_token_count_source_total", source="engine", **labels) == 1


async def test_sglang_generate_stream_through_the_sidecar(upstream, sidecar_factory):
    raw = load("sglang", "generate_stream_metrics.txt")
    up = await upstream.start(lambda app: app.router.add_post("/generate", sse(raw)))
    s = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as session:
        async with session.post(s.url + "/generate", json={"text": "hi", "stream": True}) as r:
            assert await r.read() == raw
    labels = {"model": UNKNOWN_MODEL, "route": "/generate"}
    await wait_for(lambda: s.sample("llm_requests_total", code="200", outcome="ok", **labels) == 1)
    assert s.sample("llm_upstream_queue_seconds_sum", **per_model(labels)) == pytest.approx(0.0123)
    assert s.sample("llm_tokens_total", type="output", **labels) == 5
    assert s.sample("llm_tokens_total", type="cached_input", **labels) == 3


async def test_overhead_excludes_the_servers_time(upstream, sidecar_factory):
    """A server that thinks for SERVER_WAIT before its head: TTFB holds it, the sidecar's own
    cost (either direction) does not."""
    up = await upstream.start(lambda app: app.router.add_post(CHAT, sse(VLLM, wait=SERVER_WAIT)))
    s = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            s.url + CHAT, json={"model": "tiny", "messages": [], "stream": True}
        ) as r:
            await r.read()
    await wait_for(
        lambda: s.sample("llm_sidecar_overhead_seconds_count", direction="response") == 1
    )
    assert s.sample("llm_sidecar_overhead_seconds_count", direction="request") == 1
    assert s.sample("llm_time_to_first_byte_seconds_sum", model="tiny") >= SERVER_WAIT
    assert s.sample("llm_sidecar_overhead_seconds_sum", direction="request") < SERVER_WAIT / 2
    assert s.sample("llm_sidecar_overhead_seconds_sum", direction="response") < SERVER_WAIT / 2


async def test_overhead_excludes_a_slow_clients_upload(upstream, sidecar_factory):
    """The client sends its head, then its body SERVER_WAIT later: that wait is the client's."""
    up = await upstream.start(lambda app: app.router.add_post(CHAT, sse(VLLM)))
    s = await sidecar_factory(up.url)
    body = orjson.dumps({"model": "tiny", "messages": [], "stream": True})
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    writer.write(head)
    await writer.drain()
    await asyncio.sleep(SERVER_WAIT)
    writer.write(body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in answer
    await wait_for(lambda: s.sample("llm_sidecar_overhead_seconds_count", direction="request") == 1)
    assert s.sample("llm_request_duration_seconds_sum", model="tiny", outcome="ok") >= SERVER_WAIT
    assert s.sample("llm_sidecar_overhead_seconds_sum", direction="request") < SERVER_WAIT / 2


async def test_a_streamed_request_body_has_no_request_overhead_figure(upstream, sidecar_factory):
    """A body on an unmeasured route streams through as it arrives: its time is the client's
    upload as much as ours, so no request figure is made up for it."""

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    up = await upstream.start(lambda app: app.router.add_post("/upload", echo))
    s = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as session:
        async with session.post(s.url + "/upload", data=b"x" * 1000) as r:
            assert await r.read() == b"x" * 1000
    await wait_for(
        lambda: s.sample("llm_sidecar_overhead_seconds_count", direction="response") == 1
    )
    assert s.sample("llm_sidecar_overhead_seconds_count", direction="request") == 0
