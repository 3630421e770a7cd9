"""An SLO page leaves Prometheus and reaches a receiver, end to end, with real parts.

The simulator serves a model behind a real sidecar (real sockets). Debian's Prometheus
scrapes the sidecar's admin port every second with the target labels a PodMonitor (and a
Thanos external label) would add, `cluster` and `namespace`, and evaluates rules rendered by
`llm-sidecar slo render` from a drill spec: period 12h, so every window shrinks by 12h/30d
(the 1h/5m page arm becomes 1m/5s, the factors stay 14.4, 6, 3, 1). Debian's Alertmanager
routes what Prometheus sends to a webhook receiver run by this test: severity info to
/info, everything else to /slo.

1. Healthy traffic (TTFT 0.1 s, objective 95% within 0.5 s) for HEALTHY_SECONDS: the burn
   rates are recorded and 0, and no SLO alert reaches /slo. The history alert (the 12h
   window holds seconds of history) does reach /info, with the deployment's labels: the
   retention warning is delivered too.
2. A latency regression (TTFT 0.75 s for every request, burn rate 20): a page arm fires
   once its long window holds mostly slow requests (on this young Prometheus the 6m/30s
   arm, whose window holds all the seconds there are, fires in about 12 s; the 1m/5s arm
   needs the healthy requests to leave its minute), and LLMTTFTBurnRate with severity page
   arrives at /slo with cluster, namespace and model, the long/short window labels and the
   runbook link, within REGRESSION_TIMEOUT.

Takes about 30 s. Skips without
`prometheus` or `prometheus-alertmanager` locally; fails under CI=true.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from sidecar.tools.slo import generate, parse_spec, render_rules
from tests.support.in_process import start_app
from tests.support.ports import retry_on_port_clash
from tests.support.processes import Processes, wait_ready
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration


@pytest.fixture
def processes():
    p = Processes()
    yield p
    p.stop()


MODEL = "sim-llama-3-8b"
CLUSTER = "drill-cluster"
NAMESPACE = "team-a-prod"
THRESHOLD = 0.5
# Healthy is 0.4 s inside the threshold: a loaded machine delays some first tokens by a few
# hundred ms (at TTFT 0.3 s, 5 % of the healthy requests crossed 0.5 s beside a CPU hog).
HEALTHY = {"x-sim-ttft": "0.1", "x-sim-tpot": "0.005", "x-sim-tokens": "4"}
REGRESSED = {**HEALTHY, "x-sim-ttft": "0.75"}
WORKERS = 4
HEALTHY_SECONDS = 15.0
REGRESSION_TIMEOUT = 120.0
RUNBOOK = "https://runbooks.example/llm.md"

DRILL_SPEC = {
    "version": 1,
    "period": "12h",
    "objectives": [
        {"name": "availability", "sli": "availability", "target": 99.5},
        {"name": "ttft", "sli": "ttft", "target": 95, "threshold_seconds": THRESHOLD},
    ],
    "alerts": {"runbook_url": RUNBOOK},
}


class Receiver:
    """Webhook receiver: every alert Alertmanager posts, by path."""

    def __init__(self) -> None:
        self.alerts: dict[str, list[dict]] = {"slo": [], "info": []}
        self.arrived = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{path}", self._post)
        return app

    async def _post(self, request: web.Request) -> web.Response:
        doc = await request.json()
        self.alerts.setdefault(request.match_info["path"], []).extend(doc["alerts"])
        self.arrived.set()
        return web.Response(text="ok")

    def firing(self, path: str) -> list[dict]:
        return [a for a in self.alerts.get(path, []) if a["status"] == "firing"]


def _write_yaml(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


async def _query(session: aiohttp.ClientSession, base: str, expr: str) -> list[dict]:
    async with session.get(f"{base}/api/v1/query", params={"query": expr}) as r:
        doc = await r.json()
        assert doc["status"] == "success", doc
        return doc["data"]["result"]


async def _load(url: str, headers: dict, stop: asyncio.Event) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    sent = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        while not stop.is_set():
            async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                await r.read()
            sent += 1
    return sent


async def test_page_reaches_the_receiver_with_routing_labels_and_healthy_load_stays_silent(
    tmp_path, sidecar_factory, processes
):
    prometheus = require_tool("prometheus")
    alertmanager = require_tool("prometheus-alertmanager")

    sim_runner, sim_port = await start_app(
        build_simulator_app(SimulatorConfig(model=MODEL, jitter=0.0, seed=3)),
        handler_cancellation=True,
    )
    receiver = Receiver()
    recv_runner, recv_port = await start_app(receiver.app())
    try:
        sc = await sidecar_factory(f"http://127.0.0.1:{sim_port}")
        rules = tmp_path / "rules.yaml"
        rules.write_text(render_rules(generate(parse_spec(DRILL_SPEC))), encoding="utf-8")

        hook = f"http://127.0.0.1:{recv_port}"
        am_config = _write_yaml(
            tmp_path / "alertmanager.yml",
            {
                "route": {
                    "receiver": "slo",
                    "group_by": ["alertname", "slo", "cluster", "namespace", "model"],
                    "group_wait": "1s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                    "routes": [{"receiver": "info", "matchers": ['severity="info"']}],
                },
                "receivers": [
                    {"name": "slo", "webhook_configs": [{"url": f"{hook}/slo"}]},
                    {"name": "info", "webhook_configs": [{"url": f"{hook}/info"}]},
                ],
            },
        )
        am_log = tmp_path / "alertmanager.log"
        # Neither can bind port 0 and say which it got: a free port, retried if taken meanwhile.
        am, am_port = retry_on_port_clash(
            lambda port: processes.start(
                [
                    alertmanager,
                    f"--config.file={am_config}",
                    f"--storage.path={tmp_path / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--cluster.listen-address=",
                ],
                am_log,
            )
        )
        prom_config = _write_yaml(
            tmp_path / "prometheus.yml",
            {
                "global": {
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "evaluation_interval": "1s",
                },
                "rule_files": [str(rules)],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
                },
                "scrape_configs": [
                    {
                        "job_name": "llm-sidecar",
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{sc.admin_port}"],
                                "labels": {
                                    "cluster": CLUSTER,
                                    "namespace": NAMESPACE,
                                    "pod": "llm-0",
                                },
                            }
                        ],
                    }
                ],
            },
        )
        prom_log = tmp_path / "prometheus.log"
        prom, prom_port = retry_on_port_clash(
            lambda port: processes.start(
                [
                    prometheus,
                    f"--config.file={prom_config}",
                    f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                prom_log,
            )
        )
        base = f"http://127.0.0.1:{prom_port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await wait_ready(session, f"http://127.0.0.1:{am_port}/-/ready", am, am_log)
            await wait_ready(session, f"{base}/-/ready", prom, prom_log)

            # 1. Healthy load.
            stop = asyncio.Event()
            workers = [asyncio.create_task(_load(sc.url, HEALTHY, stop)) for _ in range(WORKERS)]
            await asyncio.sleep(HEALTHY_SECONDS)
            burn = await _query(session, base, 'llm:burn_rate:ratio_rate1m{slo="ttft"}')
            assert [
                (s["metric"]["namespace"], s["metric"]["cluster"], float(s["value"][1]))
                for s in burn
            ] == [(NAMESPACE, CLUSTER, 0.0)], (
                "the ttft burn rate must be recorded (silence is not blindness) and 0"
            )
            assert await _query(session, base, 'ALERTS{alertname=~"LLM.*BurnRate"}') == []
            assert receiver.firing("slo") == [], receiver.alerts["slo"]
            info = receiver.firing("info")
            assert info, (
                "the history alert (12h window, seconds of data) should have been delivered"
            )
            assert {a["labels"]["alertname"] for a in info} == {"LLMSLOHistoryShort"}
            assert {
                (a["labels"]["cluster"], a["labels"]["namespace"], a["labels"]["model"])
                for a in info
            } == {(CLUSTER, NAMESPACE, MODEL)}
            stop.set()
            healthy_sent = sum(await asyncio.gather(*workers))
            assert healthy_sent > 50

            # 2. Regression.
            started = time.monotonic()
            stop = asyncio.Event()
            workers = [asyncio.create_task(_load(sc.url, REGRESSED, stop)) for _ in range(WORKERS)]
            try:
                while not any(
                    a["labels"].get("severity") == "page" for a in receiver.firing("slo")
                ):
                    assert time.monotonic() - started < REGRESSION_TIMEOUT, (
                        f"no page within {REGRESSION_TIMEOUT}s; received {receiver.alerts['slo']}; "
                        f"burn rates {await _query(session, base, 'llm:burn_rate:ratio_rate1m')}"
                    )
                    receiver.arrived.clear()
                    try:
                        await asyncio.wait_for(receiver.arrived.wait(), timeout=2)
                    except TimeoutError:
                        pass
            finally:
                stop.set()
                await asyncio.gather(*workers)

        pages = [a for a in receiver.firing("slo") if a["labels"]["severity"] == "page"]
        page = pages[0]
        labels = page["labels"]
        assert labels["alertname"] == "LLMTTFTBurnRate"
        assert (labels["slo"], labels["cluster"], labels["namespace"], labels["model"]) == (
            "ttft",
            CLUSTER,
            NAMESPACE,
            MODEL,
        )
        assert (labels["long_window"], labels["short_window"]) in {("1m", "5s"), ("6m", "30s")}
        assert page["annotations"]["runbook_url"] == f"{RUNBOOK}#runbook-llmttftburnrate"
        assert page["annotations"]["summary"].startswith(
            f"{CLUSTER}/{NAMESPACE}/{MODEL}: ttft error budget burning"
        )
        # Only the regressed objective pages: availability stayed clean.
        assert {a["labels"]["slo"] for a in receiver.firing("slo")} == {"ttft"}
    finally:
        await recv_runner.cleanup()
        await sim_runner.cleanup()
