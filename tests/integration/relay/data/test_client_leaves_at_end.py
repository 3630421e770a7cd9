"""Over real sockets, many times in a row, for every dialect's end marker: a client that closes
its connection as soon as it has read the stream's end (``data: [DONE]``, ``message_stop``,
``response.completed``, ``done: true`` ..., or for OpenAI/Anthropic every choice finished)
got its whole answer, so the request is ``ok``; one that leaves mid-answer is ``cancelled``.

Load generators (aiperf, vLLM's benchmark) stop reading at ``[DONE]`` and close before the
HTTP response's terminating chunk; when the close lands before the sidecar finished
relaying, the request must still be filed as ``ok``, not ``cancelled``. Two upstreams:
``paced`` sends one event per write, a millisecond apart, and ends the response right after
the last one, as a real server does (the race is about timing: written all at once, a
response seldom shows it); ``hold`` keeps the response open after the stream (a
server slow to end it), so every client close lands before the sidecar finished.

The client is a raw socket: it reads the response head and de-chunks the body itself, and
closes the moment the expected bytes are in, never reading the terminating chunk.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from sidecar.base.routes import match_route
from sidecar.streams.dialects import dialect_of
from tests.fixtures.streams.harness import (
    END_MARKER_STREAMS,
    FINISHED_BEFORE_MARKER,
    cut_before_marker,
    events_of,
    load,
    up_to_generation_done,
)
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ROUNDS = 50
IDS = [f"{d}/{n}" for d, n, _, _ in END_MARKER_STREAMS]
FINISHED_IDS = [f"{d}/{n}" for d, n, _, _ in FINISHED_BEFORE_MARKER]
_BODY = b'{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}],"prompt":"hi"}'


def sending(raw: bytes, content_type: str, hold: bool):
    ndjson = content_type == "application/x-ndjson"

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        if hold:  # all at once, then the server is slow to end the response (the sidecar closes it)
            await resp.write(raw)
            await asyncio.sleep(30)
        else:  # one event per decode step, as a server sends them, and the end right after the last
            for event in events_of(raw, ndjson):
                await resp.write(event)
                await asyncio.sleep(0.001)
        await resp.write_eof()
        return resp

    return handler


async def read_then_close(port: int, path: str, expect: bytes) -> bytes:
    """POST, read the chunked body until ``expect`` is all in, then close at once."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), len(_BODY), _BODY)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert b"transfer-encoding: chunked" in head.lower(), head
        got = b""
        while len(got) < len(expect):
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            assert size > 0, "the response ended before the expected bytes"
            got += await reader.readexactly(size)
            await reader.readexactly(2)
        return got
    finally:
        writer.close()  # right at the end: the terminating chunk is never read


def outcomes(s) -> dict[str, float]:
    counts: dict[str, float] = {}
    for metric in s.registry.collect():
        if metric.name == "llm_requests":
            for smp in metric.samples:
                if smp.name == "llm_requests_total":
                    counts[smp.labels["outcome"]] = counts.get(smp.labels["outcome"], 0) + smp.value
    return counts


async def rounds(
    upstream, sidecar_factory, path: str, ctype: str, sent: bytes, hold: bool, n: int
) -> dict[str, float]:
    up = await upstream.start(lambda app: app.router.add_post(path, sending(sent, ctype, hold)))
    s = await sidecar_factory(up.url)
    for i in range(n):
        assert await read_then_close(s.port, path, sent) == sent
        # One at a time: the next request starts once this one was filed.
        await wait_for(lambda i=i: sum(outcomes(s).values()) == i + 1)
    return outcomes(s)


@pytest.mark.parametrize("hold", [True, False], ids=["hold", "paced"])
@pytest.mark.parametrize("where,name,path,ctype", END_MARKER_STREAMS, ids=IDS)
async def test_close_right_after_the_end_marker_is_ok(
    upstream, sidecar_factory, where, name, path, ctype, hold
):
    counts = await rounds(upstream, sidecar_factory, path, ctype, load(where, name), hold, ROUNDS)
    assert counts == {"ok": ROUNDS}


@pytest.mark.parametrize("where,name,path,ctype", FINISHED_BEFORE_MARKER, ids=FINISHED_IDS)
async def test_close_once_every_choice_finished_is_ok(
    upstream, sidecar_factory, where, name, path, ctype
):
    """The finish_reason (stop_reason) chunk is in, the usage chunk and the marker not yet."""
    sent = up_to_generation_done(dialect_of(match_route(path)[0]).stream, load(where, name), False)
    counts = await rounds(upstream, sidecar_factory, path, ctype, sent, True, ROUNDS // 5)
    assert counts == {"ok": ROUNDS // 5}


@pytest.mark.parametrize("where,name,path,ctype", END_MARKER_STREAMS, ids=IDS)
async def test_leaving_mid_answer_is_cancelled(upstream, sidecar_factory, where, name, path, ctype):
    raw = load(where, name)
    sent = cut_before_marker(
        dialect_of(match_route(path)[0]).stream, raw, ctype == "application/x-ndjson"
    )
    counts = await rounds(upstream, sidecar_factory, path, ctype, sent, True, ROUNDS // 5)
    assert counts == {"cancelled": ROUNDS // 5}
