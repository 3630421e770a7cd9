"""Pins every aiohttp private name :mod:`sidecar.relay.server.aiohttp_internals` uses, on the
installed aiohttp, over a real socket: an upgrade that renames one fails here by name."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from sidecar.relay.server import aiohttp_internals as ai


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hi")


async def test_rebuilt_server_gets_aiohttp_kwargs_and_builds_its_handler_class():
    seen: dict[str, object] = {}

    class Handler(ai.RequestHandler):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            server = ai.handler_server(self)
            seen["server"] = server
            seen["loop"] = ai.handler_loop(self)
            seen["open_before"] = ai.open_connections(server)
            super().connection_made(transport)

    class Server(ai.HandlerServer):
        handler_class = Handler

    class Runner(ai.RebuildingRunner):
        def rebuild_server(self, built, kwargs):
            seen["kwargs"] = dict(kwargs)
            server = Server(
                built.request_handler,
                request_factory=built.request_factory,
                handler_cancellation=built.handler_cancellation,
                loop=asyncio.get_running_loop(),
                **kwargs,
            )
            seen["rebuilt"] = server
            return server

    app = web.Application()
    app.router.add_get("/", _hello)
    runner = Runner(app, access_log=None, keepalive_timeout=7.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/") as resp:
                assert await resp.text() == "hi"
                assert ai.open_connections(seen["rebuilt"]) == 1  # type: ignore[arg-type]
    finally:
        await runner.cleanup()
    assert seen["kwargs"]["keepalive_timeout"] == 7.5  # web.Server._kwargs as passed
    assert seen["server"] is seen["rebuilt"]  # RequestHandler._manager
    assert seen["loop"] is asyncio.get_running_loop()  # RequestHandler._loop
    assert seen["open_before"] == 0  # web.Server._connections


def test_request_count_and_last_message_are_the_handler_slots_data_received_fills():
    # The head budget (sidecar/app.py) reads these right after RequestHandler.data_received.
    slots = {name for cls in ai.RequestHandler.__mro__ for name in getattr(cls, "__slots__", ())}
    assert {"_request_count", "_messages", "_upgraded"} <= slots  # _upgraded: BaseProtocol's
    handler = ai.RequestHandler.__new__(ai.RequestHandler)
    handler._request_count, handler._messages = 3, __import__("collections").deque([("m", "p")])
    assert ai.request_count(handler) == 3 and ai.last_message(handler) == ("m", "p")
    handler._messages.clear()
    handler._upgraded = True
    assert ai.last_message(handler) == (None, None) and ai.upgraded(handler)


def test_the_handler_methods_guarded_request_handler_overrides_exist_with_their_signatures():
    import inspect

    for name, params in {
        "connection_made": ["self", "transport"],
        "data_received": ["self", "data"],
        "eof_received": ["self"],
        "connection_lost": ["self", "exc"],
        "handle_error": ["self", "request", "status", "exc", "message"],
        "_handle_request": ["self", "request", "start_time", "request_handler"],
    }.items():
        method = getattr(ai.RequestHandler, name)
        assert method is not getattr(object, name, None), name
        assert list(inspect.signature(method).parameters) == params, name
    assert (
        issubclass(ai.GuardedServer, ai.HandlerServer)
        and ai.GuardedServer.handler_class is ai.GuardedRequestHandler
    )
