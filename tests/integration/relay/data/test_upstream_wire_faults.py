"""Upstream responses that break HTTP itself, through a real sidecar: a raw TCP upstream
sends exactly the bytes scripted here. (The pool's own behaviour is tested in
test_upstream_pool.py; these check what the *client* gets and how it is counted.)"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.support.sse import http_chunk
from tests.support.waits import wait_for

# Relay tests: each runs with the early path on (as served) and off (through the handler).
pytestmark = pytest.mark.integration

LABELS = {"model": "m1", "route": "/v1/chat/completions"}
CHUNK_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
EVENT = b'data: {"id":"c1","object":"chat.completion.chunk","model":"m1","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'


async def raw_upstream(answer: bytes):
    """A server that reads one request head and writes ``answer``, then holds the line."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            await reader.read()  # until the sidecar closes
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/9.9 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
        # no status class past 5xx: never a ``code`` label value, a bad response
        b"HTTP/1.1 600 Six\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 799 Custom\r\nContent-Type: text/event-stream\r\n\r\n" + EVENT,
        b"HTTP/1.1 999 High\r\nContent-Length: 0\r\n\r\n",
    ],
    ids=["bad-status-line", "conflicting-lengths", "gzip-coding", "bare-lf", "600", "799", "999"],
)
async def test_invalid_upstream_response_is_502_json(sidecar_factory, answer):
    server, url = await raw_upstream(answer)
    async with server:
        sc = await sidecar_factory(url)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.post(
                sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
            ) as r:
                assert r.status == 502
                doc = await r.json()
    assert doc["error"]["type"] == "upstream_invalid_response"
    await wait_for(
        lambda: sc.sample("llm_requests_total", code="502", outcome="error", **LABELS) == 1
    )
    assert sc.in_flight() == 0
    codes = {
        sample.labels.get("code")
        for family in sc.registry.collect()
        for sample in family.samples
        if "code" in sample.labels
    }
    assert codes == {"502"}, codes


async def test_broken_chunk_mid_stream_truncates_after_every_valid_byte(sidecar_factory):
    """The valid chunk before the fault and the one in the same read as the fault reach the
    client; then the stream is cut (never a clean end), and the tokens are counted."""
    answer = CHUNK_HEAD + http_chunk(EVENT) + http_chunk(EVENT) + b"zz\r\n"
    server, url = await raw_upstream(answer)
    async with server:
        sc = await sidecar_factory(url)
        received = b""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.post(
                sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
            ) as r:
                assert r.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for piece in r.content.iter_any():
                        received += piece
    assert received == EVENT + EVENT
    await wait_for(
        lambda: sc.sample("llm_requests_total", code="200", outcome="error", **LABELS) == 1
    )
    assert sc.sample("llm_tokens_total", type="output", **LABELS) == 2
