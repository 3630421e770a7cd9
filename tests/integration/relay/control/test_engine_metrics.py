"""The admin port's help for the model server: /metrics/engine and /upstreamz, over real sockets.

/metrics/engine relays the inference server's own /metrics (status, bytes, Content-Type,
Content-Encoding) so Prometheus can scrape a server on loopback without the scrape passing
the proxy port, where it would be counted as a request. A real Prometheus scrapes it here
with the target labels a PodMonitor adds, and the relayed vLLM series arrive with them while
llm_requests_total counts nothing. /upstreamz answers for the server's health (a probe of
the server's own container), and unlike /readyz stays 200 while the sidecar drains.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time

import aiohttp
import pytest
from aiohttp import web

from sidecar.tools.dashboards.engine import KV_CACHE, PREEMPTIONS, RUNNING, WAITING
from sidecar.tools.dashboards.inspect import panel_queries, substitute
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.support.in_process import start_app
from tests.support.paths import ROOT
from tests.support.processes import start_prometheus
from tests.support.scrape import pod_scrape_config
from tests.support.tools import require_tool
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


def answer(status: int = 200, body: bytes = b""):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, body=body)

    return handler


EXPOSITION = (
    b"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
)


async def test_relays_the_servers_metrics_byte_exact_with_their_encoding(upstream, sidecar_factory):
    seen = {}

    async def metrics(request):
        seen.update(
            accept=request.headers.get("Accept"), encoding=request.headers.get("Accept-Encoding")
        )
        body = gzip.compress(EXPOSITION, mtime=0)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8",
                                                "Content-Encoding": "gzip", "X-Other": "kept-out"})  # fmt: skip

    up = await upstream.start(lambda app: app.router.add_get("/metrics", metrics))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        headers = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "gzip"}
        async with s.get(f"{sc.admin_url}/metrics/engine", headers=headers) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert r.headers["Content-Encoding"] == "gzip"
            assert "X-Other" not in r.headers
            assert gzip.decompress(await r.read()) == EXPOSITION
    assert seen == {"accept": "text/plain;version=0.0.4", "encoding": "gzip"}
    # A scrape of the admin port is not a request through the proxy.
    assert sc.sample("llm_non_api_requests_total", method="GET", code="200", outcome="ok") is None


async def test_the_same_page_through_the_proxy_port_is_counted_as_a_request(
    upstream, sidecar_factory
):
    """Why the chart scrapes the admin port: through the proxy port, /metrics is relayed and
    counted as non-API traffic, as every request outside the route table is."""
    up = await upstream.start(lambda app: app.router.add_get("/metrics", answer(body=EXPOSITION)))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{sc.url}/metrics") as r:
            assert await r.read() == EXPOSITION
    assert sc.sample("llm_non_api_requests_total", method="GET", code="200", outcome="ok") == 1


async def test_servers_error_status_is_relayed(upstream, sidecar_factory):
    up = await upstream.start(lambda app: app.router.add_get("/metrics", answer(500, b"boom")))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{sc.admin_url}/metrics/engine") as r:
            assert (r.status, await r.text()) == (500, "boom")


async def test_concurrent_scrapes_share_one_upstream_fetch(upstream, sidecar_factory):
    """300 concurrent scrapes share one upstream fetch, not 300 upstream connections."""
    calls = 0
    release = asyncio.Event()

    async def metrics(request):
        nonlocal calls
        calls += 1
        await release.wait()
        return web.Response(body=EXPOSITION, headers={"Content-Type": "text/plain; version=0.0.4"})

    up = await upstream.start(lambda app: app.router.add_get("/metrics", metrics))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def scrape() -> tuple[int, bytes, str]:
            async with s.get(f"{sc.admin_url}/metrics/engine") as r:
                return r.status, await r.read(), r.headers.get("Content-Type", "")

        scrapes = [asyncio.create_task(scrape()) for _ in range(60)]
        await wait_for(lambda: calls >= 1)
        await asyncio.sleep(
            1.0
        )  # the other scrapes reach the sidecar while the first fetch is held
        held = calls
        release.set()
        results = await asyncio.gather(*scrapes)
    assert all(r == (200, EXPOSITION, "text/plain; version=0.0.4") for r in results)
    assert held == 1, f"{held} upstream fetches for 60 concurrent scrapes"
    assert calls < 10  # any scrape that arrived after the release starts one more fetch at most
    # Once the shared fetch is done, the next scrape fetches a fresh page.
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{sc.admin_url}/metrics/engine") as r:
            assert r.status == 200
    assert calls >= 2


async def test_unreachable_server_is_a_502_and_a_slow_one_a_504_within_the_scrape_timeout(
    upstream, sidecar_factory, refused_url
):
    sc = await sidecar_factory(refused_url)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{sc.admin_url}/metrics/engine") as r:
            assert r.status == 502
            assert (await r.json())["error"]["type"] == "upstream_unreachable"

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(body=EXPOSITION)

    up = await upstream.start(lambda app: app.router.add_get("/metrics", slow))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        started = time.monotonic()
        async with s.get(
            f"{sc.admin_url}/metrics/engine", headers={"X-Prometheus-Scrape-Timeout-Seconds": "1.5"}
        ) as r:
            assert r.status == 504
            assert (await r.json())["error"]["type"] == "upstream_timeout"
        assert time.monotonic() - started < 1.5, "answers before the scraper gives up"


async def test_engine_metrics_path_is_configurable_and_can_be_turned_off(upstream, sidecar_factory):
    up = await upstream.start(
        lambda app: app.router.add_get("/stats/prom", answer(body=EXPOSITION))
    )
    sc = await sidecar_factory(up.url, engine_metrics_path="/stats/prom")
    off = await sidecar_factory(up.url, engine_metrics_path="")
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{sc.admin_url}/metrics/engine") as r:
            assert await r.read() == EXPOSITION
        async with s.get(f"{off.admin_url}/metrics/engine") as r:
            assert r.status == 404


async def test_upstreamz_follows_the_server_and_ignores_draining(
    upstream, sidecar_factory, refused_url
):
    health = {"status": 200}

    async def health_check(request: web.Request) -> web.Response:
        return web.Response(status=health["status"])

    up = await upstream.start(lambda app: app.router.add_get("/health", health_check))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:

        async def statuses() -> tuple[int, int]:
            async with (
                s.get(f"{sc.admin_url}/upstreamz") as a,
                s.get(f"{sc.admin_url}/readyz") as b,
            ):
                return a.status, b.status

        assert await statuses() == (200, 200)
        sc.sidecar.drain.draining = True
        assert await statuses() == (200, 503), "a liveness probe must not restart a draining server"
        health["status"] = 500
        assert await statuses() == (503, 503)
    dead = await sidecar_factory(refused_url)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{dead.admin_url}/upstreamz") as r:
            assert r.status == 503 and (await r.json())["alive"] is False


RECORDED_VLLM = ROOT / "tests" / "fixtures" / "real" / "vllm-0.32.0" / "metrics.txt"
"""A real vLLM 0.32 (CPU) server's /metrics, recorded after six requests."""
OVERVIEW = ROOT / "dashboards" / "llm-sidecar-overview.json"


async def _recorded_vllm(request: web.Request) -> web.Response:
    return web.Response(body=RECORDED_VLLM.read_bytes(), content_type="text/plain", charset="utf-8")


@pytest.mark.parametrize("engine", ["simulator", "recorded-vllm-0.32"])
async def test_prometheus_scrapes_the_engines_series_with_target_labels_and_counts_no_request(
    engine, sidecar_factory, tmp_path
):
    """Real Prometheus, configured like the chart's two scrape jobs (PodMonitor endpoints),
    in front of the simulator or of a real vLLM's recorded /metrics: the engine's series
    arrive under job llm-engine with the pod's labels, every query of the dashboard's engine
    row returns data, and llm_requests_total has not moved."""
    binary = require_tool("prometheus")
    if engine == "simulator":
        app = build_simulator_app(SimulatorConfig(model="m", seed=1))
        model_name = "m"
    else:
        app = web.Application()
        app.router.add_get("/metrics", _recorded_vllm)
        model_name = "tiny"
    runner, sim_port = await start_app(app, handler_cancellation=True)
    sc = await sidecar_factory(f"http://127.0.0.1:{sim_port}")
    labels = {"namespace": "llm", "pod": "llm-sidecar-0"}
    proc, port = start_prometheus(
        binary, tmp_path, pod_scrape_config(f"127.0.0.1:{sc.admin_port}", labels)
    )
    try:
        async with aiohttp.ClientSession() as s:

            async def query(expr: str) -> list[dict]:
                async with s.get(
                    f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr}
                ) as r:
                    return (await r.json())["data"]["result"] if r.status == 200 else []

            deadline = time.monotonic() + 30
            found: list[dict] = []
            while time.monotonic() < deadline:
                try:
                    found = await query('vllm:num_requests_running{job="llm-engine"}')
                    scrapes = await query('count_over_time(up{job="llm-engine"}[1m]) >= 4')
                    if found and scrapes:
                        break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5)
            assert found, "the engine's series never reached Prometheus"
            series = found[0]["metric"]
            assert {k: series[k] for k in ("namespace", "pod", "model_name")} == {
                **labels,
                "model_name": model_name,
            }
            engine_row = (WAITING, RUNNING, KV_CACHE, PREEMPTIONS)
            queries = panel_queries(json.loads(OVERVIEW.read_text(encoding="utf-8")))
            row = [q for q in queries if any(metric in q.expr for metric in engine_row)]
            assert len(row) == 4, "waiting, running, KV cache, preemptions"
            for q in row:
                result = await query(substitute(q.expr))
                assert result, f"{q.panel_title}: no data"
                assert {r["metric"]["pod"] for r in result} == {"llm-sidecar-0"}, q.expr
            assert await query('up{job="llm-engine"} == 1')
            assert not await query("llm_requests_total"), "no scrape was counted as an LLM request"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        await runner.cleanup()


async def test_the_simulated_vllm_series_are_named_and_labelled_as_the_real_ones():
    """The simulator's vllm:* series exist in a real vLLM's /metrics, and the engine row's
    four carry the same labels there (model_name, engine), so the dashboard tests that run
    on the simulator hold for vLLM."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    def samples(text: str) -> dict[str, set[str]]:
        return {
            s.name: set(s.labels) for f in text_string_to_metric_families(text) for s in f.samples
        }

    runner, port = await start_app(build_simulator_app(SimulatorConfig(model="m", seed=1)))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                simulated = samples(await r.text())
    finally:
        await runner.cleanup()
    real = samples(RECORDED_VLLM.read_text(encoding="utf-8"))
    assert set(simulated) <= set(real), set(simulated) - set(real)
    for name in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
    ):
        assert simulated[name] == real[name] == {"model_name", "engine"}, name
