"""The upstream health probe (/readyz, /upstreamz, the watcher's log lines) reports the
server's state, not a stale pooled connection's: a keep-alive connection the server drops as
it is reused is asked once more on a new connection (app/test_serve_errors_and_signals.py's outage test saw
"Cannot write to closing transport" as the reason when a probe reused the connection of a
server that was shutting down)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from sidecar.app import build_sidecar
from sidecar.config import Settings

pytestmark = pytest.mark.integration

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


async def _server_dropping_reused_connections() -> tuple[asyncio.Server, int, list[int]]:
    """Answers the first request on each connection, keeps it alive, and closes it without an
    answer when a second request arrives on it."""
    heads: list[int] = []  # requests seen, per connection, in order of connections

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(heads)
        heads.append(0)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                heads[index] += 1
                if heads[index] > 1:
                    return  # dropped as reused
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], heads


class _ClosingPool:
    """A session whose pooled connection is being closed by the server as the probe writes on
    it: aiohttp raises ``ClientConnectionError("Cannot write to closing transport")`` (no OS
    error: nothing was asked of the network). A race, so injected here."""

    def __init__(self) -> None:
        self.asked = 0

    def get(self, url, **kwargs):
        self.asked += 1
        raise aiohttp.ClientConnectionError("Cannot write to closing transport")


@pytest.fixture
async def dropping():
    """(the server dropping reused connections, a sidecar in front of it, its heads per connection)."""
    server, port, heads = await _server_dropping_reused_connections()
    yield server, build_sidecar(Settings(upstream=f"http://127.0.0.1:{port}")), heads
    server.close()
    await server.wait_closed()


async def test_a_pooled_connection_closing_as_it_is_reused_is_asked_again_on_a_new_one(dropping):
    _, sc, heads = dropping
    pooled = _ClosingPool()
    assert await sc.upstream_status(pooled) == 200  # answered on a new connection
    assert pooled.asked == 1 and heads == [1]


async def test_a_pooled_connection_dropped_as_it_is_reused_still_gives_the_servers_answer(dropping):
    _, sc, heads = dropping
    async with aiohttp.ClientSession() as pooled:
        assert await sc.upstream_status(pooled) == 200
        assert await sc.upstream_status(pooled) == 200
    assert heads[0] == 2 and sum(heads) == 3  # the reused one dropped, a new one answered


async def test_a_server_that_is_gone_is_reported_as_such_after_the_second_ask(dropping):
    server, sc, _ = dropping
    async with aiohttp.ClientSession() as pooled:
        assert await sc.upstream_status(pooled) == 200
        server.close()  # the listener goes first; the pooled connection is dropped when reused
        await server.wait_closed()
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await sc.upstream_status(pooled)
    assert isinstance(caught.value.os_error, ConnectionRefusedError)
