"""An upstream that is the sidecar itself, and the model name a client asked for, over a
real ``serve`` subprocess and real sockets.

On main, ``--upstream`` at the sidecar's own ``--listen`` address started, relayed every
request back to itself until a head passed its budget (431), and ``/readyz`` blamed the
inference server; a 404 for an unknown model logged ``model: other`` and not the name."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

from sidecar.export.logs import MAX_REQUESTED_MODEL, requested_model
from tests.support.ports import free_port
from tests.support.serve import ServeProcess
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("listen_host", "upstream_host"),
    [("127.0.0.1", "127.0.0.1"), ("127.0.0.1", "localhost"), ("0.0.0.0", "127.0.0.1")],
)
def test_upstream_at_the_own_listen_address_is_refused_in_one_line(listen_host, upstream_host):
    port = free_port()
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--listen", f"{listen_host}:{port}",
         "--metrics-listen", "127.0.0.1:0", "--upstream", f"http://{upstream_host}:{port}"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2, (r.stdout, r.stderr)  # refused, not served (the timeout would fire)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert (
        "--upstream" in lines[0] and "own --listen address" in lines[0] and f":{port}" in lines[0]
    )
    assert '"started"' not in r.stdout


def test_another_port_on_the_same_host_is_not_a_loop():
    """The usual set-up (the server on 8000, the sidecar on 8080, both on localhost) starts."""
    sc = ServeProcess("http://127.0.0.1:1", clean_env=True)
    try:
        sc.ports()
    finally:
        sc.stop()


async def _forwarder(target: list[int]) -> asyncio.AbstractServer:
    """A TCP port forward to ``target[0]`` (set once the sidecar has its port): a loop the
    start-up check cannot see, as through a Service or a ``-p`` port mapping."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def on_client(reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target[0])
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(on_client, "127.0.0.1", 0)


async def test_a_loop_through_a_forwarder_is_named_on_readyz_not_blamed_on_the_server():
    target = [0]
    server = await _forwarder(target)
    forward_port = server.sockets[0].getsockname()[1]
    sc = ServeProcess(f"http://127.0.0.1:{forward_port}", clean_env=True)
    try:
        await sc.wait_started()
        target[0] = sc.port
        async with aiohttp.ClientSession() as s:
            body = {}

            async def not_ready_with_a_reason() -> bool:
                async with s.get(sc.admin_url + "/readyz") as r:
                    body.update(await r.json())
                    return r.status == 503 and "reason" in body

            await wait_for(not_ready_with_a_reason, timeout=30)
        # On main: "the inference server is not healthy: /health answered 431" (or a timeout).
        assert "relays back to this sidecar" in body["reason"], body
        assert sc.proc.poll() is None
    finally:
        sc.stop()
        server.close()
        await server.wait_closed()


def test_requested_model_is_bounded_and_printable():
    assert requested_model("llama-3-8b") == "llama-3-8b"
    long = "m" * 1000
    assert requested_model(long) == "m" * MAX_REQUESTED_MODEL + "..."
    assert requested_model("a\nb\x1b[31mc\u2028") == "a?b?[31mc?"


async def test_a_404_for_an_unknown_model_logs_the_name_asked(upstream):
    async def chat(request: web.Request) -> web.Response:
        doc = await request.json()
        return web.json_response(
            {"error": {"message": f"model {doc['model']} not found"}}, status=404
        )

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "served-model"}]})

    def routes(app):
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)

    up = await upstream.start(routes)
    sc = ServeProcess(up.url, clean_env=True)
    asked = ["lama-3-8b-instruct", "x" * 300 + "\n"]
    try:
        await sc.wait_alive()
        async with aiohttp.ClientSession() as s:
            for name in asked:
                async with s.post(
                    sc.url + "/v1/chat/completions", json={"model": name, "messages": []}
                ) as r:
                    assert r.status == 404

        def request_lines() -> list[dict]:
            return [json.loads(line) for line in sc.out if '"event": "request"' in line]

        await wait_for(lambda: len(request_lines()) == 2, timeout=30)
    finally:
        sc.stop()
    first, second = request_lines()
    assert (first["status"], first["model"]) == (404, "other")
    assert first["requested_model"] == "lama-3-8b-instruct"  # what the client asked for
    assert second["requested_model"] == "x" * MAX_REQUESTED_MODEL + "..."
    assert "\n" not in second["requested_model"]
