"""The same alerts fire on VictoriaMetrics + vmalert as on Prometheus, for the same fleet.

A scripted fleet serves /metrics pages from one local app: six deployments (namespace, model,
with and without a `cluster` target label, one of them two pods), each a page of
`llm_requests_total` and the TTFT histogram whose counters grow at scripted rates from the
test's start. An error series appears at the deployment's first error, as the sidecar's do.
Debian's Prometheus and Debian's VictoriaMetrics single-node scrape the same pages every
second with the same scrape configuration; Prometheus evaluates the rules itself, vmalert
evaluates the same rule file against VictoriaMetrics and writes its records back there.

The rules are the generator's for the shipped spec (deploy/slo/default.yaml) with a 12h
period, so every window shrinks by 12h/30d (1h/5m -> 1m/5s, ..., 3d/6h -> 72m/6m) and the
factors stay 14.4, 6, 3, 1. With seconds of data every window holds all there is, so each
deployment's burn rate is its scripted error share over the budget, chosen well between the
factors: which arms fire is known in advance (expected_burn_alerts) and must be what both
engines fire.

Asserts: Prometheus fires the expected burn-rate alerts; vmalert fires the same set (alert name, slo, cluster,
namespace, model, severity, windows), with and without `cluster`; every burn-rate alert's
description found the remaining budget (its templated query, `cluster=""` where the label is
absent, parsed and matched on both engines); vmalert logged no template or alert-creation
error and no rule has an error; vmalert delivered alerts to a notifier. Prints what each
engine counts over a window where error series were born, and the burn rates each recorded
(docs/slo.md, "Engines").

Timing only, never which alerts fire: VictoriaMetrics runs with -search.latencyOffset=1s
(default 30s: each level of chained recording rules would show up 30 s later, three levels
before an alert) and vmalert with -remoteWrite.flushInterval=1s (default 5s). VictoriaMetrics
1.79 makes a new series searchable 8-10 s after its first sample, once per level of new
recorded series (vmalert fired the expected set 41 s after start, Prometheus 7.6 s); the test
calls its /internal/force_flush, made for tests, between polls, so vmalert settles in about
11 s. Takes about 25 s. Skips without `prometheus` or `victoria-metrics`/`vmalert` locally;
fails under CI=true.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import aiohttp
import pytest
import yaml
from aiohttp import web

from sidecar.base.buckets import TTFT_BUCKETS
from sidecar.tools.slo import conventions as c, generate, parse_spec, render_rules
from tests.support.in_process import start_app
from tests.support.ports import retry_on_port_clash
from tests.support.processes import Processes, wait_ready
from tests.support.rules import SPEC
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration


@pytest.fixture
def processes():
    p = Processes()
    yield p
    p.stop()


PERIOD = "12h"
ROUTE = "/v1/chat/completions"
FAST_TTFT = 0.3
SLOW_TTFT = 5.0  # both sides of the shipped 2 s TTFT threshold
REQUESTS_PER_SECOND = 40.0
TIMEOUT = 60.0  # vmalert settles in about 11 s
SETTLE = 3.0  # both engines must hold the expected set this long


@dataclass(frozen=True)
class Deployment:
    """One SLO group and its scripted traffic: `error_share` of its requests fail (503 from an
    unreachable upstream), `slow_share` of the streamed ones miss the TTFT threshold."""

    namespace: str
    model: str
    cluster: str | None
    error_share: float
    slow_share: float
    pods: int = 1

    def group(self) -> tuple[str, str, str]:
        return (self.cluster or "", self.namespace, self.model)


# Burn rate = share / budget (availability 0.5 %, TTFT 5 %). Arms: 14.4 (1m/5s), 6 (6m/30s),
# 3 (24m/2m), 1 (72m/6m); every burn sits at least 1.4x away from the factors around it.
FLEET = (
    Deployment("team-a", "llama", "eu", error_share=0.20, slow_share=0.0),  # availability 40
    Deployment("team-a", "llama", None, error_share=0.20, slow_share=0.0),  # availability 40
    Deployment("team-b", "mistral", None, error_share=0.021, slow_share=0.5, pods=2),  # 4.2, 10
    Deployment("team-b", "mistral", "eu", error_share=0.0, slow_share=0.1),  # ttft 2
    Deployment("team-c", "qwen", None, error_share=0.002, slow_share=0.01),  # 0.4, 0.2: none
    Deployment("team-c", "qwen", "us", error_share=0.045, slow_share=0.0),  # availability 9
)
ARMS = ((14.4, "page", "1m", "5s"), (6.0, "page", "6m", "30s"), (3.0, "ticket", "24m", "2m"),
        (1.0, "ticket", "72m", "6m"))  # fmt: skip
BUDGETS = {"availability": 0.005, "ttft": 0.05}


def expected_burn_alerts() -> set[tuple]:
    out = set()
    for d in FLEET:
        for slo, share in (("availability", d.error_share), ("ttft", d.slow_share)):
            burn = share / BUDGETS[slo]
            for factor, severity, long_w, short_w in ARMS:
                if burn > factor:
                    assert burn > factor * 1.4, (d, slo, factor)
                    out.add((c.alert_name(slo), slo, *d.group(), severity, long_w, short_w))
                else:
                    assert burn < factor / 1.4, (d, slo, factor)
    return out


# -------------------------------------------------------------------- the fleet's pages


class FleetPages:
    """/metrics/{pod}: each pod's counters at this moment, growing at the scripted rates since
    the fleet started (integers, as counted requests are)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.pods = {
            f"{d.namespace}-{d.model}-{d.cluster or 'none'}-{i}": d
            for d in FLEET
            for i in range(d.pods)
        }

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics/{pod}", self._page)
        return app

    async def _page(self, request: web.Request) -> web.Response:
        d = self.pods[request.match_info["pod"]]
        return web.Response(text=self.page(d, time.monotonic() - self.started))

    @staticmethod
    def page(d: Deployment, elapsed: float) -> str:
        total = REQUESTS_PER_SECOND * elapsed
        errors = math.floor(total * d.error_share)
        ok = math.floor(total) - errors
        base = f'model="{d.model}",route="{ROUTE}"'
        lines = [
            f"# TYPE {c.REQUESTS_TOTAL} counter",
            f'{c.REQUESTS_TOTAL}{{{base},code="200",outcome="ok",error_type="none"}} {ok}',
        ]
        if errors:  # born at the first error
            lines.append(
                f'{c.REQUESTS_TOTAL}{{{base},code="502",outcome="error",'
                f'error_type="upstream_unreachable"}} {errors}'
            )
        slow = math.floor(ok * d.slow_share)
        hist = c.LATENCY_SLIS["ttft"].histogram
        lines.append(f"# TYPE {hist} histogram")
        for le in TTFT_BUCKETS:
            n = (ok - slow if le >= FAST_TTFT else 0) + (slow if le >= SLOW_TTFT else 0)
            lines.append(f'{hist}_bucket{{{base},prompt_class="all",le="{le}"}} {n}')
        lines.append(f'{hist}_bucket{{{base},prompt_class="all",le="+Inf"}} {ok}')
        lines.append(f'{hist}_count{{{base},prompt_class="all"}} {ok}')
        seconds = (ok - slow) * FAST_TTFT + slow * SLOW_TTFT
        lines.append(f'{hist}_sum{{{base},prompt_class="all"}} {seconds}')
        return "\n".join(lines) + "\n"


def scrape_configs(fleet: FleetPages, port: int) -> list[dict]:
    targets = []
    for pod, d in fleet.pods.items():
        labels = {"__metrics_path__": f"/metrics/{pod}", "namespace": d.namespace, "pod": pod}
        if d.cluster:
            labels["cluster"] = d.cluster
        targets.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
    return [{"job_name": "llm-sidecar", "static_configs": targets}]


# -------------------------------------------------------------------- the engines


async def _get(session: aiohttp.ClientSession, url: str, **params: str) -> dict:
    async with session.get(url, params=params) as r:
        doc = await r.json(content_type=None)
        assert r.status == 200 and doc["status"] == "success", f"{url} {params}: {doc}"
        return doc["data"]


def _identity(alert: dict) -> tuple:
    labels = alert["labels"]
    return (
        labels["alertname"],
        labels.get("slo", ""),
        labels.get("cluster", ""),
        labels.get("namespace", ""),
        labels.get("model", ""),
        labels.get("severity", ""),
        labels.get("long_window", ""),
        labels.get("short_window", ""),
    )


async def _firing(session: aiohttp.ClientSession, base: str) -> dict[tuple, dict]:
    data = await _get(session, f"{base}/api/v1/alerts")
    return {_identity(a): a for a in data["alerts"] or () if a["state"] == "firing"}


def _burn_alerts(firing: dict[tuple, dict]) -> set[tuple]:
    return {k for k in firing if k[0].endswith("BurnRate")}


def _budget_found(firing: dict[tuple, dict]) -> bool:
    """Every burn-rate alert's description read its group's remaining budget."""
    return all(
        "of the budget for the last 12h is left" in a["annotations"]["description"]
        for k, a in firing.items()
        if k[0].endswith("BurnRate")
    )


async def _by_group(session: aiohttp.ClientSession, base: str, expr: str) -> dict:
    data = await _get(session, f"{base}/api/v1/query", query=expr)
    return {
        (s["metric"].get("cluster", ""), s["metric"]["namespace"], s["metric"]["model"]): float(
            s["value"][1]
        )
        for s in data["result"]
    }


async def _engine_differences(
    session: aiohttp.ClientSession, prom_base: str, vm_base: str, fleet: FleetPages
) -> list[str]:
    """Measured, not asserted: the errors each engine counts over a window that holds the
    error series' birth (VictoriaMetrics counts a new series from 0, Prometheus extrapolates
    from its first sample), and the availability burn rates each recorded."""
    window = f"{math.ceil(time.monotonic() - fleet.started) + 5}s"
    errors = f'{c.REQUESTS_TOTAL}{{outcome="error"}}'
    queries = {
        f"errors counted over {window}": (
            f"sum by (cluster, namespace, model) (increase({errors}[{window}]))"
        ),
        "availability burn rate, 1m": 'llm:burn_rate:ratio_rate1m{slo="availability"}',
        "availability burn rate, 5s": 'llm:burn_rate:ratio_rate5s{slo="availability"}',
    }
    lines = []
    for what, expr in queries.items():
        prom = await _by_group(session, prom_base, expr)
        vm = await _by_group(session, vm_base, expr)
        for group in sorted(prom):
            p, v = prom[group], vm.get(group, math.nan)
            change = f"{(v / p - 1) * 100:+.0f} %" if p else "-"
            lines.append(f"{what} {group}: prometheus {p:.2f}, victoriametrics {v:.2f} ({change})")
    return lines


async def test_vmalert_fires_what_prometheus_fires_with_and_without_cluster(tmp_path, processes):
    prometheus = require_tool("prometheus")
    victoria = require_tool("victoria-metrics")
    vmalert = require_tool("vmalert")

    data = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    data["period"] = PERIOD
    spec = parse_spec(data)
    rules = tmp_path / "rules.yaml"
    rules.write_text(render_rules(generate(spec)), encoding="utf-8")
    expected = expected_burn_alerts()

    fleet = FleetPages()
    fleet_runner, fleet_port = await start_app(fleet.app())
    receiver_app = web.Application()
    received: list[dict] = []

    async def _alerts(request: web.Request) -> web.Response:
        received.extend(await request.json())
        return web.Response(text="ok")

    receiver_app.router.add_post("/api/v2/alerts", _alerts)
    receiver_runner, receiver_port = await start_app(receiver_app)
    try:
        global_cfg = {"scrape_interval": "1s", "scrape_timeout": "1s"}
        scrapes = scrape_configs(fleet, fleet_port)
        prom_cfg = tmp_path / "prometheus.yml"
        prom_cfg.write_text(
            yaml.safe_dump(
                {
                    "global": {**global_cfg, "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "scrape_configs": scrapes,
                }
            ),
            encoding="utf-8",
        )
        vm_cfg = tmp_path / "scrape.yml"
        vm_cfg.write_text(
            yaml.safe_dump({"global": global_cfg, "scrape_configs": scrapes}), encoding="utf-8"
        )
        prom_log, vm_log, vmalert_log = (
            tmp_path / "prometheus.log",
            tmp_path / "victoria-metrics.log",
            tmp_path / "vmalert.log",
        )
        # None of them can bind port 0 and say which it got: a free port, retried if taken.
        prom, prom_port = retry_on_port_clash(
            lambda port: processes.start(
                [
                    prometheus,
                    f"--config.file={prom_cfg}",
                    f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                prom_log,
            )
        )
        vm, vm_port = retry_on_port_clash(
            lambda port: processes.start(
                [
                    victoria,
                    f"-storageDataPath={tmp_path / 'vm-data'}",
                    f"-httpListenAddr=127.0.0.1:{port}",
                    f"-promscrape.config={vm_cfg}",
                    "-search.latencyOffset=1s",
                    "-loggerLevel=WARN",
                ],
                vm_log,
            )
        )
        vm_base = f"http://127.0.0.1:{vm_port}"
        vma, vma_port = retry_on_port_clash(
            lambda port: processes.start(
                [
                    vmalert,
                    f"-rule={rules}",
                    f"-datasource.url={vm_base}",
                    f"-remoteWrite.url={vm_base}",
                    "-remoteWrite.flushInterval=1s",
                    f"-notifier.url=http://127.0.0.1:{receiver_port}",
                    "-evaluationInterval=1s",
                    f"-httpListenAddr=127.0.0.1:{port}",
                ],
                vmalert_log,
            )
        )
        prom_base = f"http://127.0.0.1:{prom_port}"
        vma_base = f"http://127.0.0.1:{vma_port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await wait_ready(session, f"{prom_base}/-/ready", prom, prom_log)
            await wait_ready(session, f"{vm_base}/health", vm, vm_log)
            await wait_ready(session, f"{vma_base}/health", vma, vmalert_log)
            started = time.monotonic()
            settled: dict[str, float] = {}
            held_since: float | None = None
            while True:
                now = time.monotonic()
                prom_firing = await _firing(session, prom_base)
                vm_firing = await _firing(session, vma_base)
                for name, firing in (("prometheus", prom_firing), ("vmalert", vm_firing)):
                    if _burn_alerts(firing) == expected and name not in settled:
                        settled[name] = now - started
                done = (
                    _burn_alerts(prom_firing) == expected
                    and set(vm_firing) == set(prom_firing)
                    and _budget_found(prom_firing)
                    and _budget_found(vm_firing)
                )
                held_since = (held_since or now) if done else None
                if held_since is not None and now - held_since >= SETTLE:
                    break
                if now - started > TIMEOUT:
                    break
                await asyncio.sleep(0.5)
                async with session.get(f"{vm_base}/internal/force_flush") as r:
                    assert r.status == 200  # new recorded series searchable now, not in 10 s
            differences = await _engine_differences(session, prom_base, vm_base, fleet)
            rules_state = await _get(session, f"{vma_base}/api/v1/rules")

        print(f"\nexpected burn-rate alerts fired on both after (s): {settled}")
        print("\n".join(differences))

        missing = expected - _burn_alerts(prom_firing)
        extra = _burn_alerts(prom_firing) - expected
        assert not missing and not extra, f"prometheus: missing {missing}, unexpected {extra}"
        assert set(vm_firing) == set(prom_firing), (
            f"only on prometheus: {set(prom_firing) - set(vm_firing)}; "
            f"only on vmalert: {set(vm_firing) - set(prom_firing)}"
        )
        # Both with and without cluster are among them (a test of the fleet, not the engines).
        assert {k[2] for k in _burn_alerts(vm_firing)} >= {"", "eu", "us"}
        assert _budget_found(prom_firing), "a burn-rate description lost its remaining budget"
        assert _budget_found(vm_firing), "a burn-rate description lost its remaining budget"
        log = vmalert_log.read_text()
        for bad in ("failed to create alert", "error evaluating template", "template:"):
            assert bad not in log, f"vmalert logged {bad!r}:\n{log[-3000:]}"
        rule_errors = [
            (g["name"], r["name"], r["lastError"])
            for g in rules_state["groups"]
            for r in g["rules"]
            if r.get("lastError")
        ]
        assert not rule_errors, rule_errors
        assert received, "vmalert delivered no alert to the notifier"
    finally:
        await receiver_runner.cleanup()
        await fleet_runner.cleanup()
