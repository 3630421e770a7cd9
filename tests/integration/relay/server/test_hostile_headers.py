"""The response head reaches the client as the upstream sent it; odd request targets and
HTTP/1.0 clients are relayed, not stuck or answered with aiohttp's text 404. Raw
sockets both sides, the sidecar in this event loop."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.raw import raw_exchange
from tests.support.rig import CHAT
from tests.support.sse import chunked
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ODD_HEAD = (
    b"HTTP/1.1 200 Caf\xe9 tr\xe8s OK\r\n"
    b"X-Name: caf\xe9\xffXYZ\r\n"
    b"Set-Cookie: s=\xff\xfe; Path=/\r\n"
    b"X-Ctl: a\x01b\x7fc\r\n"
    b"x-lower-case:  spaced value\t\r\n"
    b"X-Dup: 1\r\nX-Dup: 2\r\n"
)


def split(raw: bytes) -> tuple[bytes, list[bytes], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *fields = head.split(b"\r\n")
    return status, fields, body


async def test_upstream_head_bytes_reach_the_client_unchanged(rig_factory, raw_upstream):
    up = await raw_upstream(response=ODD_HEAD + b"Content-Length: 2\r\nConnection: close\r\n\r\nok")
    rig = await rig_factory(upstream=up.url)
    raw = await raw_exchange(
        rig.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    status, fields, body = split(raw)
    assert status == b"HTTP/1.1 200 Caf\xe9 tr\xe8s OK"  # a latin-1 reason, byte for byte
    assert fields == ODD_HEAD.split(b"\r\n")[1:-1] + [b"Content-Length: 2", b"Connection: close"]
    assert body == b"ok"
    # Nothing added: no Content-Type, Server or Date the upstream did not send.
    assert not any(f.lower().startswith((b"content-type", b"server", b"date")) for f in fields)


async def test_streamed_response_with_odd_header_bytes_is_relayed_and_counted_ok(
    rig_factory, raw_upstream
):
    events = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n' + b"data: [DONE]\n\n"
    up = await raw_upstream(
        response=ODD_HEAD
        + b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + chunked(events)
    )
    rig = await rig_factory(upstream=up.url)
    body = b'{"model":"m","stream":true,"messages":[]}'
    raw = await raw_exchange(
        rig.port,
        b"POST %b HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%b"
        % (CHAT.encode(), len(body), body),
    )
    status, fields, framed = split(raw)
    assert status == b"HTTP/1.1 200 Caf\xe9 tr\xe8s OK"
    assert fields[:6] == ODD_HEAD.split(b"\r\n")[1:-1]
    assert b"Transfer-Encoding: chunked" in fields and not any(
        f.lower().startswith(b"content-length") for f in fields
    )
    assert framed == chunked(events)
    await wait_for(
        lambda: (
            rig.sample("llm_requests_total", model="m", route=CHAT, code="200", outcome="ok") == 1
        )
    )


async def test_repeated_content_length_is_sent_once_plain(rig_factory, raw_upstream):
    # RFC 9110 8.6: "5, 5" may be replaced by one value; a proxy must not forward it as is.
    up = await raw_upstream(
        response=b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nX-A: b\r\nConnection: close\r\n\r\nhello"
    )
    rig = await rig_factory(upstream=up.url)
    status, fields, body = split(
        await raw_exchange(rig.port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    )
    assert status == b"HTTP/1.1 200 OK"
    assert fields == [b"X-A: b", b"Connection: close", b"Content-Length: 5"] or fields == [
        b"X-A: b",
        b"Content-Length: 5",
        b"Connection: close",
    ]
    assert body == b"hello"


async def test_every_client_x_forwarded_for_is_kept(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url)
    await raw_exchange(
        rig.port,
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1\r\nX-Forwarded-For: 10.0.0.2, 10.0.0.3\r\nConnection: close\r\n\r\n",
    )
    (request,) = up.requests
    xff = [line for line in request.split(b"\r\n") if line.lower().startswith(b"x-forwarded-for")]
    assert xff == [b"X-Forwarded-For: 10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"]


async def test_http10_keep_alive_client_gets_the_end_of_a_stream(rig_factory, raw_upstream):
    events = b"data: [DONE]\n\n"
    up = await raw_upstream(
        response=b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + chunked(events)
    )
    rig = await rig_factory(upstream=up.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    writer.write(
        b"POST %b HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}" % CHAT.encode()
    )
    out = b""
    async with asyncio.timeout(3):  # hung for 100 s and more: no length, and kept alive
        while chunk := await reader.read(65536):
            out += chunk
    status, fields, body = split(out)
    assert status == b"HTTP/1.0 200 OK"
    assert body == events  # close-delimited: HTTP/1.0 has no chunks
    assert not any(
        f.lower().startswith((b"transfer-encoding", b"connection: keep-alive")) for f in fields
    )
    writer.close()


async def test_http10_keep_alive_with_a_length_keeps_the_connection(rig_factory, upstream):
    from aiohttp import web

    async def ok(request: web.Request) -> web.Response:
        return web.Response(body=b"ok")

    await upstream.start(lambda app: app.router.add_get("/x", ok))
    rig = await rig_factory(upstream=upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    for _ in range(2):
        writer.write(b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert head.startswith(b"HTTP/1.0 200 ") and b"\r\nConnection: keep-alive\r\n" in head
        assert await asyncio.wait_for(reader.readexactly(2), 3) == b"ok"
    writer.close()


@pytest.mark.parametrize(
    "request_line, upstream_line",
    [
        (b"OPTIONS * HTTP/1.1", b"OPTIONS * HTTP/1.1"),
        (b"GET http://evil.example HTTP/1.1", b"GET / HTTP/1.1"),
        (b"GET http://evil.example?q=1 HTTP/1.1", b"GET /?q=1 HTTP/1.1"),
        (b"GET /a%0Ab%0Dc HTTP/1.1", b"GET /a%0Ab%0Dc HTTP/1.1"),
    ],
    ids=["options-star", "absolute-no-path", "absolute-query-only", "encoded-line-ends"],
)
async def test_odd_targets_are_relayed_not_404(
    rig_factory, raw_upstream, request_line, upstream_line
):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url)
    raw = await raw_exchange(rig.port, request_line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and raw.endswith(b"\r\n\r\nok")
    (request,) = up.requests
    assert request.split(b"\r\n")[0] == upstream_line
    # Never where the request goes: the upstream's Host (X-Forwarded-Host may name it).
    assert request.split(b"\r\n")[1] == b"Host: 127.0.0.1:%d" % up.port


async def test_connect_is_refused_with_json_and_never_relayed(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url)
    raw = await raw_exchange(
        rig.port, b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n"
    )
    status, fields, body = split(raw)
    assert status.startswith(b"HTTP/1.1 405 ")
    assert json.loads(body)["error"]["type"] == "method_not_allowed"
    assert up.requests == []
