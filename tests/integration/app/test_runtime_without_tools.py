"""The runtime stands without the tools: ``llm-sidecar serve`` relays and measures a
stream while every import of ``sidecar.tools`` (simulator, demo, dashboards and SLO
generators) and of the tools' extra (the Grafana SDK) fails, as in an install without the
``tools`` extra that also lost the tools' code. The layout test checks the same statically;
this runs the program."""

from __future__ import annotations

import asyncio
import sys

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.support.in_process import start_app
from tests.support.serve import ServeProcess
from tests.support.sse import scripted
from tests.support.waits import wait_for

BLOCKER = """
import importlib.abc, sys

class NoTools(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "grafana_foundation_sdk" or name == "sidecar.tools" or name.startswith("sidecar.tools."):
            raise ModuleNotFoundError(f"no {name} in this install", name=name)
        return None

sys.meta_path.insert(0, NoTools())
import atexit
atexit.register(lambda: print("TOOLS_LOADED", sorted(m for m in sys.modules if m.startswith(("sidecar.tools", "grafana_foundation_sdk"))), flush=True))
from sidecar.cli import main
sys.exit(main(sys.argv[1:]))
"""

ROUTE = "/v1/chat/completions"
STREAM = [
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n',
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n',
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def test_serve_relays_and_measures_with_every_tool_import_failing():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", scripted([(0, event) for event in STREAM]))
    app.router.add_get("/health", _health)
    runner, up_port = await start_app(app)
    sc = ServeProcess(f"http://127.0.0.1:{up_port}", command=(sys.executable, "-c", BLOCKER))
    proc = sc.proc
    try:
        await sc.wait_started()
        port, admin = sc.port, sc.admin_port
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError("".join(sc.out + sc.err))
                try:
                    async with session.get(f"http://127.0.0.1:{admin}/healthz") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_for(ready, timeout=30)
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                assert await r.read() == b"".join(STREAM)

            async def counted() -> bool:
                async with session.get(f"http://127.0.0.1:{admin}/metrics") as r:
                    text = await r.text()
                return any(
                    s.name == "llm_requests_total"
                    and s.labels["outcome"] == "ok"
                    and s.labels["route"] == ROUTE
                    and s.value == 1
                    for family in text_string_to_metric_families(text)
                    for s in family.samples
                )

            await wait_for(counted, timeout=10)
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
        out, err = sc.stop()
        out += err
        await runner.cleanup()
    assert proc.returncode == 0, out
    assert "TOOLS_LOADED []" in out, out
