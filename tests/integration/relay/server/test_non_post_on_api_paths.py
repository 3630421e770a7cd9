"""A request to an API path that is not a POST (a browser's CORS preflight ``OPTIONS``, a
load balancer's ``HEAD`` or ``GET`` check) is no LLM request: every API route is a POST
(sidecar/base/routes.py). Counted as one, each would form ``model="unknown"`` series of the
API route in ``llm_requests_total``; it is counted apart from the SLO's requests. Over real
sockets, read back from the page as Prometheus parses it."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.support.in_process import start_app

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


async def _samples(admin_url: str) -> list:
    async with aiohttp.ClientSession() as s:
        async with s.get(admin_url + "/metrics") as r:
            text = await r.text()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


async def test_preflight_head_and_get_on_api_paths_count_apart_and_are_relayed(sidecar_factory):
    runner, port = await start_app(
        build_simulator_app(SimulatorConfig(ttft=0.005, tpot=0.001, jitter=0, tokens=4, seed=1))
    )
    try:
        sc = await sidecar_factory(f"http://127.0.0.1:{port}")
        statuses = {}
        async with aiohttp.ClientSession() as s:
            for method, path in (
                ("OPTIONS", CHAT),
                ("HEAD", CHAT),
                ("GET", CHAT),
                ("GET", "/v1/messages/"),
            ):
                headers = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
                async with s.request(method, sc.url + path, headers=headers) as r:
                    await r.read()
                    statuses[method, path] = r.status
                # What the server answers, relayed unchanged: the same status straight from it.
                async with s.request(
                    method, f"http://127.0.0.1:{port}{path}", headers=headers
                ) as r:
                    await r.read()
                    assert r.status == statuses[method, path], (method, path)
            body = {
                "model": "sim-llama-3-8b",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
            }
            async with s.post(sc.url + CHAT + "?trace=1", json=body) as r:
                await r.read()
                assert r.status == 200
        samples = await _samples(sc.admin_url)
    finally:
        await runner.cleanup()

    requests = [s for s in samples if s.name == "llm_requests_total"]
    assert sum(s.value for s in requests) == 1, requests  # the one POST (its query string aside)
    assert {s.labels["route"] for s in requests} == {CHAT}
    assert not [s for s in samples if s.labels.get("model") == "unknown" and s.value], (
        "no unknown-model series"
    )
    methods: dict[str, float] = {}
    for s in samples:
        if s.name == "llm_non_api_requests_total":
            methods[s.labels["method"]] = methods.get(s.labels["method"], 0) + s.value
    assert methods == {"OPTIONS": 1, "HEAD": 1, "GET": 2}, methods
