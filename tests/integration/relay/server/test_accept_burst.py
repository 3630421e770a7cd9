"""Connections opened together are accepted together, and every one of them is answered.

A load generator (or a fleet's clients reconnecting after a restart) opens hundreds of
keep-alive connections at once and sends a request on each. uvloop's server accepts one
connection per turn of the event loop; while the loop is saturated a turn is long, so the
connections at the back of the kernel's accept queue waited seconds with their first
request sent, while the ones accepted first were served turn after turn (a p99 of seconds
beside a p50 of tenths, docs/performance.md "Overload without starvation").

Counted, not timed: the clients connect and send while the loop does not run (the kernel
completes the handshakes), then the test counts the loop's turns until the proxy port
holds every connection. On either loop, as ``serve`` runs it (uvloop) and as asyncio's
own; the production ``ProxyRunner`` in front of an upstream that answers at once."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import uvloop
from prometheus_client import CollectorRegistry

from sidecar.app import ProxyRunner, build_sidecar
from sidecar.config import Settings
from tests.integration.relay.server.test_one_way_in import post, read_response
from tests.support.scripted_server import ScriptedServer, response, serve

pytestmark = pytest.mark.integration

CONNECTIONS = 300
"""Opened at once: within the port's listen backlog, far more than the turns allowed."""
TURNS = 20
"""Loop turns the port may take to hold every connection (a batch takes about three: the
accept, the transport's task, ``connection_made``); one accept a turn needs 300."""

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


async def turns_until(done: Callable[[], bool], limit: int) -> int:
    """Turns of the running loop until ``done()`` holds, counted by a callback that
    schedules itself once a turn; ``limit`` when it never did."""
    loop = asyncio.get_running_loop()
    counted = loop.create_future()
    turns = 0

    def tick() -> None:
        nonlocal turns
        turns += 1
        if done() or turns >= limit:
            counted.set_result(turns)
        else:
            loop.call_soon(tick)

    loop.call_soon(tick)
    return await counted


async def burst() -> tuple[int, int, list[bytes]]:
    """Open :data:`CONNECTIONS` connections at once, each with a request sent: the turns
    until the port held them all, how many it held then, and every connection's answer."""
    upstream = await ScriptedServer(serve(response(b'{"ok":true}'))).start()
    sc = build_sidecar(Settings(upstream=upstream.url), CollectorRegistry(), access_log=False)
    runner = ProxyRunner(sc, shutdown_timeout=1.0)
    clients: list[socket.socket] = []
    try:
        await runner.setup()
        await runner.listen("127.0.0.1", 0)
        port = runner.port
        address = runner.addresses[0][:2]
        for _ in range(CONNECTIONS):  # the loop does not run: the kernel queues them all
            client = socket.create_connection(address)
            clients.append(client)
            client.sendall(post())
        turns = await turns_until(lambda: len(port.connections) >= CONNECTIONS, TURNS * 10)
        held = len(port.connections)

        async def answer(client: socket.socket) -> bytes:
            client.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=client)
            try:
                return await read_response(reader)
            finally:
                writer.close()

        async with asyncio.timeout(60):  # a hang, not a threshold: seconds on an idle loop
            answers = await asyncio.gather(*(answer(c) for c in clients))
        return turns, held, answers
    finally:
        for client in clients:
            client.close()
        await runner.cleanup()
        await upstream.stop()


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_a_burst_of_connections_is_accepted_in_a_few_turns_and_each_answered(
    loop_name: str,
) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        turns, held, answers = runner.run(burst())
    assert turns <= TURNS, (
        f"{loop_name}: the proxy port held {held} of {CONNECTIONS} connections opened "
        f"together after {turns} turns of the loop (one accept a turn?)"
    )
    refused = [a[:40] for a in answers if not a.startswith(b"HTTP/1.1 200")]
    assert not refused, f"{len(refused)} of {CONNECTIONS} connections were not answered 200"
