"""The wire tap the live tests trust to say what a real server sent: over real sockets, two
kept-alive exchanges (one chunked stream, one with Content-Length) come back exactly."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from tests.real.tap import WireTap


async def _stream(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "X-Seen": str(len(body))}
    )
    await resp.prepare(request)
    for i in range(3):
        await resp.write(b'data: {"i": %d}\n\n' % i)
    await resp.write_eof()
    return resp


async def _plain(request: web.Request) -> web.Response:
    return web.json_response({"ok": True}, status=201)


async def test_the_tap_records_each_exchange_of_a_kept_alive_connection(aiohttp_server):
    app = web.Application()
    app.router.add_post("/stream", _stream)
    app.router.add_get("/plain", _plain)
    server = await aiohttp_server(app)
    tap = await WireTap("127.0.0.1", server.port).start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(tap.url + "/stream", data=b'{"prompt":"hi"}') as resp:
                streamed = await resp.read()
            async with session.get(tap.url + "/plain") as resp:
                plain = await resp.read()
        assert len(tap.recordings) == 1, "the client kept its connection alive"
        first, second = tap.exchanges()
    finally:
        await tap.close()
    assert (first.method, first.target, first.request_body) == (
        "POST",
        "/stream",
        b'{"prompt":"hi"}',
    )
    assert first.status == 200 and ("x-seen", "15") in first.response_headers
    assert ("transfer-encoding", "chunked") in first.response_headers
    assert (
        first.response_body == streamed == b'data: {"i": 0}\n\ndata: {"i": 1}\n\ndata: {"i": 2}\n\n'
    )
    assert (second.method, second.status, second.response_body) == ("GET", 201, plain)
    assert plain == b'{"ok": true}'


async def test_an_exchange_still_in_flight_is_left_out():
    from tests.real.tap import exchanges

    head = b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    assert exchanges(head, reply) == []
    done = exchanges(head, reply + b"0\r\n\r\n")
    assert [(x.request_body, x.response_body) for x in done] == [(b"hi", b"abc")]
