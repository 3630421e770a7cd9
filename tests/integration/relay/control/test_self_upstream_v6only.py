"""The self-pointing upstream check (sidecar/relay/control/self_loop.py) must not refuse a server
that is not the sidecar. asyncio binds a ``::`` listener IPv6-only (``IPV6_V6ONLY``), so a
sidecar on ``[::]:P`` is never reached by ``127.0.0.1:P``, where an inference server can
listen at the same time; the check called that a loop and the sidecar refused to start.
Real sockets: the sidecar's proxy bound on ``::``, a server on ``127.0.0.1`` at the same port."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from sidecar.relay.control.self_loop import loop_reason

pytestmark = pytest.mark.integration


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6(), reason="no IPv6 on this host")
async def test_an_ipv4_server_at_the_port_of_an_ipv6_only_listener_is_not_a_loop():
    runner = web.AppRunner(web.Application())
    await runner.setup()
    await web.TCPSite(runner, "::", 0).start()
    try:
        port = runner.addresses[0][1]
        server = await asyncio.start_server(
            lambda r, w: w.close(), "127.0.0.1", port
        )  # the inference server
        try:
            assert await loop_reason(f"http://127.0.0.1:{port}", runner.addresses) is None
            assert await loop_reason(f"http://[::ffff:127.0.0.1]:{port}", runner.addresses) is None
            # The sidecar's own IPv6 address still is a loop.
            assert await loop_reason(f"http://[::1]:{port}", runner.addresses) is not None
        finally:
            server.close()
            await server.wait_closed()
    finally:
        await runner.cleanup()


async def test_the_loop_token_rides_only_on_the_sidecars_own_requests(upstream, sidecar_factory):
    """The probes carry X-LLM-Sidecar-Loop; a client's request reaches the server with the
    headers it sent and no other (a client's own X-LLM-Sidecar-Loop relayed as sent, not cut)."""
    import aiohttp

    from sidecar.relay.control.self_loop import LOOP_HEADER

    seen: list[tuple[str, str, str | None]] = []

    async def any_path(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, request.headers.get(LOOP_HEADER)))
        await request.read()
        return web.json_response({"object": "list", "data": []})

    up = await upstream.start(lambda app: app.router.add_route("*", "/{tail:.*}", any_path))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):  # the second may go upstream from the read that completes it (early)
            async with s.post(sc.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
        async with s.get(sc.url + "/health", headers={LOOP_HEADER: "a-client-value"}) as r:
            assert r.status == 200
            await r.read()
        async with s.get(sc.admin_url + "/readyz") as r:
            await r.read()
    probes = [h for m, p, h in seen if p == "/health"]
    assert [h for m, p, h in seen if p == "/v1/chat/completions"] == [None, None]
    assert "a-client-value" in probes  # relayed as the client sent it
    assert any(h not in (None, "a-client-value") for h in probes)  # the readiness probe's own token
