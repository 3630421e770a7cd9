"""Three releases' rules in one real Prometheus, scraping real sidecars.

The chart renders the rules of three releases (tests/support/chart.py RELEASES: two in team-a, one
in team-b with a stricter TTFT objective). Debian's Prometheus loads all three files and
scrapes three sidecars, each in front of a simulated server, with the labels the chart's
PodMonitor gives them (namespace and llm_release, job=llm-sidecar; tests/integration/
chart/test_install_paths_prometheus.py makes them as the operator does). After some streamed
traffic through each sidecar, every rule of every group has been evaluated with health
"ok" (/api/v1/rules), and each deployment has its own recorded SLI series, one per
deployment and objective.
Skipped without helm or prometheus locally; fails under CI=true.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import yaml

from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.support.chart import RELEASES, by_kind, render_release, rid, sync
from tests.support.in_process import start_app
from tests.support.processes import start_prometheus
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

FAST = {"x-sim-ttft": "0.02", "x-sim-tpot": "0.002", "x-sim-tokens": "6"}


@pytest.fixture
async def fleet(sidecar_factory):
    """{release: (proxy URL, admin port, namespace, model)}: a simulator behind a sidecar each."""
    runners, out = [], {}
    for release, namespace, _, model, _ in RELEASES:
        runner, port = await start_app(
            build_simulator_app(SimulatorConfig(model=model, jitter=0.0, seed=3))
        )
        runners.append(runner)
        sc = await sidecar_factory(f"http://127.0.0.1:{port}")
        out[release] = (sc.url, sc.admin_port, namespace, model)
    yield out
    for runner in runners:
        await runner.cleanup()


async def _get(session: aiohttp.ClientSession, url: str, **params) -> dict:
    async with session.get(url, params=params) as r:
        doc = await r.json()
        assert r.status == 200 and doc["status"] == "success", f"{url} {params}: {r.status} {doc}"
        return doc["data"]


async def _ready(session: aiohttp.ClientSession, base: str) -> bool:
    try:
        async with session.get(f"{base}/-/ready") as r:
            return r.status == 200
    except aiohttp.ClientConnectionError:
        return False


async def _stream(session: aiohttp.ClientSession, base: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with session.post(f"{base}/v1/chat/completions", json=body, headers=FAST) as r:
        await r.read()


async def test_three_releases_rules_evaluate_cleanly_in_one_prometheus(fleet, tmp_path):
    if not sync.HELM.exists():
        require_tool(str(sync.HELM))
    binary = require_tool("prometheus")
    files = []
    for release, namespace, sets, _, _ in RELEASES:
        (rule,) = by_kind(render_release(release, namespace, sets), "PrometheusRule")
        path = tmp_path / f"rules-{release}.yaml"
        path.write_text(
            yaml.safe_dump(rule["spec"], sort_keys=False, width=10**9), encoding="utf-8"
        )
        files.append(str(path))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": files,
        "scrape_configs": [
            {
                "job_name": "llm-sidecar",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{admin}"],
                        "labels": {"namespace": ns, "llm_release": rid(r)},
                    }
                    for r, (_, admin, ns, _) in fleet.items()
                ],
            }
        ],
    }
    proc, port = start_prometheus(binary, tmp_path, config)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            deadline = time.monotonic() + 60
            while not await _ready(session, base):
                assert proc.poll() is None and time.monotonic() < deadline, (
                    "prometheus did not become ready"
                )
                await asyncio.sleep(0.2)
            want = {(ns, rid(r)) for r, (_, _, ns, _) in fleet.items()}
            got: set = set()
            while time.monotonic() < deadline and got != want:
                assert proc.poll() is None, "prometheus exited"
                await asyncio.gather(
                    *(_stream(session, url, model) for url, _, _, model in fleet.values())
                )
                data = await _get(
                    session, f"{base}/api/v1/query", query='llm:sli_events:rate5m{slo="ttft"} > 0'
                )
                got = {
                    (s["metric"]["namespace"], s["metric"].get("llm_release"))
                    for s in data["result"]
                }
                await asyncio.sleep(0.5)
            assert got == want
            counts = await _get(
                session,
                f"{base}/api/v1/query",
                query="count by (namespace, llm_release, slo) (llm:sli_events:rate5m)",
            )
            assert {s["value"][1] for s in counts["result"]} == {"1"}, (
                counts
            )  # one series per deployment and SLO
            await asyncio.sleep(2)  # every group evaluated at least once more
            rules = await _get(session, f"{base}/api/v1/rules")
            groups = rules["groups"]
            assert {g["file"] for g in groups} == set(files)
            bad = [
                (g["file"], r.get("name"), r.get("health"), r.get("lastError"))
                for g in groups
                for r in g["rules"]
                if r.get("health") != "ok"
            ]
            assert not bad, bad
            assert sum(len(g["rules"]) for g in groups) > 100
    finally:
        proc.terminate()
        proc.wait(timeout=10)
