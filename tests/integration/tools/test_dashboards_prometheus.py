"""Every dashboard query returns data from a real Prometheus scraping real sidecars.

Two simulated inference servers (one per model: the spec's default scope and its per-model
override) each sit behind their own sidecar, the two "pods" of a deployment. Debian's
Prometheus scrapes both admin ports every second, with the static target labels `namespace`
and `pod` that kube-prometheus-stack would add (and `llm_release`, as the chart's PodMonitor does) (and `cluster`, as a Thanos setup would), and evaluates the SLO rules every
second. A load generator streams a mix through both sidecars: answers, reasoning (so time to
first answer token has data), Ollama /api/chat (engine timings), non-streamed answers, 500s,
in-stream errors, client cancellations, a few answers with a 2.5 s TTFT, parallel tool calls
(chat and Anthropic, `x-sim-tool-calls`) with usage that reports cached prompt tokens (none of
the prompt, and most of it: `x-sim-cached-tokens`), and a health probe through the proxy
port (non-API traffic). About 12% fail, so the availability SLO burns fast enough to fire its
page and ticket alerts.

Then every panel query of every committed dashboard, with the variables at All and
$__rate_interval = 1m, goes through /api/v1/query and must return at least one sample, and
every value must be a finite number; every variable's label_values() must list values.

What a 16-second test cannot have, and why every panel still has data: the rules' 30d, 3d,
1d and 6h windows hold only these seconds of history, but rate() over a long window reads
whatever samples it holds, so every `llm:*` record, burn rate and budget exists after two
scrapes (the values are those of the short history, not of 30 days). Objectives that are met
burn at 0, and "budget runs out in" shows the period (remaining x period / 0 is +Inf, clamped)
rather than Infinity. A counter that never moved (stream parse errors) is 0, not absent.

The slow answers also check a per-model override through the dashboard: Prometheus evaluates
the rules of the shipped spec with an override added for the second model (none is shipped;
the same rules as the committed file otherwise), and the SLO dashboard of that spec shows a
2.5 s TTFT bad for the default model (threshold 2 s) and good for the override (5 s).
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from sidecar.tools.dashboards.inspect import panel_queries, substitute, variable_queries
from sidecar.tools.dashboards.render import to_json_dict
from sidecar.tools.dashboards.slo import build as build_slo_dashboard
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from sidecar.tools.slo import generate, parse_spec, render_rules
from tests.support.in_process import start_app
from tests.support.paths import ROOT
from tests.support.ports import retry_on_port_clash
from tests.support.processes import stop_process
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))

# The shipped spec has no per-model override; the override check builds the SLO dashboard
# of the spec with one for this model (a looser TTFT: 90% within 5 s), as a user would.
DEFAULT_MODEL = "sim-llama-3-8b"
OVERRIDE_MODEL = "meta-llama/Llama-3.1-405B-Instruct"
NAMESPACE = "llm"
RELEASE = "llm/llm-sidecar"  # llm_release, the label the chart's PodMonitor adds (its release)
CLUSTER = "test-cluster"  # what an external label or a Thanos/Mimir setup adds
LOAD_SECONDS = 16.0
WORKERS_PER_POD = 4
FAST = {"x-sim-ttft": "0.03", "x-sim-tpot": "0.004", "x-sim-tokens": "12"}
# Series no simulator here has: vLLM's own phase histograms and the engine queue time that
# only real engines report. The "where the time goes" queries that read them run against a
# real Prometheus scraping a real vLLM and a sidecar in front of it (make test-real).
LIVE_ONLY = ("vllm:request_", "llm_upstream_queue_seconds", "llm:upstream_queue_seconds")


def spec_with_override():
    """The shipped spec with a TTFT override for OVERRIDE_MODEL (90% within 5 s)."""
    data = yaml.safe_load((ROOT / "deploy" / "slo" / "default.yaml").read_text(encoding="utf-8"))
    (ttft,) = [o for o in data["objectives"] if o["name"] == "ttft"]
    ttft["models"] = {OVERRIDE_MODEL: {"threshold_seconds": 5.0, "target": 90}}
    return parse_spec(data)


async def _request(
    session: aiohttp.ClientSession, url: str, body: dict, headers: dict, cancel: bool = False
) -> None:
    async with session.post(url, json=body, headers=headers) as r:
        if cancel:
            await r.content.readany()
            r.close()  # the client goes away mid-stream: outcome cancelled
            return
        await r.read()


def _script(base: str, model: str) -> list[tuple[str, dict, dict, bool]]:
    """One round of requests for one pod: 16, of which 2 fail on the server side."""
    chat = f"{base}/v1/chat/completions"
    ollama = f"{base}/api/chat"
    messages = f"{base}/v1/messages"
    msgs = [{"role": "user", "content": "How fast are my tokens?"}]  # 13 prompt tokens
    stream = {"model": model, "messages": msgs, "stream": True}
    anthropic = {"model": model, "messages": msgs, "max_tokens": 64, "stream": True}
    with_usage = {
        **stream,
        "stream_options": {"include_usage": True},
    }  # the usage carries the cached count
    whole = {"model": model, "messages": msgs}
    ollama_body = {"model": model, "messages": msgs}  # Ollama streams unless told not to
    return [
        (chat, stream, FAST, False),
        (chat, stream, FAST, False),
        (chat, stream, {**FAST, "x-sim-reasoning": "4"}, False),
        (chat, stream, {**FAST, "x-sim-reasoning": "4"}, False),
        (chat, whole, FAST, False),
        (ollama, ollama_body, FAST, False),
        (ollama, ollama_body, {**FAST, "x-sim-reasoning": "3"}, False),
        (chat, stream, {**FAST, "x-sim-fail": "500"}, False),
        (chat, stream, {**FAST, "x-sim-fail": "stream"}, False),
        (chat, stream, {**FAST, "x-sim-tpot": "0.2", "x-sim-tokens": "40"}, True),
        (chat, stream, FAST, False),
        (ollama, ollama_body, FAST, False),
        (chat, whole, FAST, False),
        (chat, stream, {**FAST, "x-sim-ttft": "2.5"}, False),
        # Agents: two parallel tool calls on a cache miss; one call on a mostly cached prompt.
        # ... and an objective header that is not a number (ignored and counted).
        (
            chat,
            with_usage,
            {**FAST, "x-sim-tool-calls": "2", "x-sim-cached-tokens": "0", "x-slo-ttft-ms": "2s"},
            False,
        ),
        (
            messages,
            anthropic,
            {**FAST, "x-sim-tool-calls": "1", "x-sim-cached-tokens": "12"},
            False,
        ),
    ]


async def _load(base: str, model: str, deadline: float) -> int:
    sent = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while time.monotonic() < deadline:
            for url, body, headers, cancel in _script(base, model):
                await _request(session, url, body, headers, cancel)
                sent += 1
            # Non-API traffic through the proxy port (a probe): counted apart from the requests.
            async with session.get(f"{base}/health") as r:
                await r.read()
    return sent


def _rules_with_override(tmp: Path) -> Path:
    """The committed rules' spec with OVERRIDE_MODEL's override (the committed file has none)."""
    path = tmp / "rules-with-override.yaml"
    path.write_text(render_rules(generate(spec_with_override())), encoding="utf-8")
    return path


def _prometheus_config(tmp: Path, targets: dict[str, int]) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(_rules_with_override(tmp))],
        "scrape_configs": [
            {
                # The job the spec's LLMSidecarDown alert watches.
                "job_name": "llm-sidecar",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port}"],
                        "labels": {
                            "cluster": CLUSTER,
                            "namespace": NAMESPACE,
                            "llm_release": RELEASE,
                            "pod": pod,
                        },
                    }
                    for pod, port in targets.items()
                ],
            },
            {
                # The chart's second scrape: the model server's own metrics, relayed by the
                # sidecar's admin port (the engine row of the overview dashboard).
                "job_name": "llm-engine",
                "metrics_path": "/metrics/engine",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port}"],
                        "labels": {"namespace": NAMESPACE, "llm_release": RELEASE, "pod": pod},
                    }
                    for pod, port in targets.items()
                ],
            },
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


async def _get(session: aiohttp.ClientSession, url: str, **params) -> dict:
    async with session.get(url, params=params) as r:
        doc = await r.json()
        assert r.status == 200 and doc["status"] == "success", f"{url} {params}: {r.status} {doc}"
        return doc["data"]


async def _wait_ready(
    session: aiohttp.ClientSession, base: str, proc: subprocess.Popen, timeout: float = 20
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, (
            f"prometheus exited: {proc.stderr.read() if proc.stderr else ''}"
        )
        try:
            async with session.get(f"{base}/-/ready") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("prometheus did not become ready")


@pytest.fixture
async def pods(sidecar_factory):
    """{pod name: (proxy URL, admin port, model)}: a simulator behind a sidecar, per model."""
    runners = []
    out = {}
    for pod, model in (("llm-0", DEFAULT_MODEL), ("llm-1", OVERRIDE_MODEL)):
        runner, port = await start_app(
            build_simulator_app(SimulatorConfig(model=model, jitter=0.0, seed=7)),
            handler_cancellation=True,
        )
        runners.append(runner)
        sc = await sidecar_factory(f"http://127.0.0.1:{port}")
        out[pod] = (sc.url, sc.admin_port, model)
    yield out
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def prometheus_server(tmp_path):
    """Start Prometheus for the given targets; stopped (by its pid) at teardown."""
    binary = require_tool("prometheus")
    procs: list[subprocess.Popen] = []

    def start(targets: dict[str, int]) -> tuple[str, subprocess.Popen]:
        config = _prometheus_config(tmp_path, targets)
        proc, port = retry_on_port_clash(
            lambda port: subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        procs.append(proc)
        return f"http://127.0.0.1:{port}", proc

    yield start
    for proc in procs:
        stop_process(proc)


def _finite(value: str) -> bool:
    return math.isfinite(float(value))


async def test_every_dashboard_query_returns_data(pods, prometheus_server):
    assert len(DASHBOARDS) == 2, DASHBOARDS
    base, proc = prometheus_server({pod: admin for pod, (_, admin, _) in pods.items()})
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        await _wait_ready(session, base, proc)
        deadline = time.monotonic() + LOAD_SECONDS
        sent = await asyncio.gather(
            *(
                _load(url, model, deadline)
                for url, _, model in pods.values()
                for _ in range(WORKERS_PER_POD)
            )
        )
        assert sum(sent) > 100, sent
        # Two more scrapes and rule evaluations after the last request.
        await asyncio.sleep(3)

        up = await _get(session, f"{base}/api/v1/query", query='up{job="llm-sidecar"}')
        assert {s["metric"]["pod"]: s["value"][1] for s in up["result"]} == {
            "llm-0": "1",
            "llm-1": "1",
        }

        problems = []
        checked = 0
        for path in DASHBOARDS:
            dashboard = json.loads(path.read_text(encoding="utf-8"))
            for q in panel_queries(dashboard):
                if any(name in q.expr for name in LIVE_ONLY):
                    continue  # checked against a real vLLM in tests/real/test_where_time_goes.py
                expr = substitute(q.expr)
                data = await _get(session, f"{base}/api/v1/query", query=expr)
                result = data["result"]
                values = (
                    [s["value"][1] for s in result]
                    if data["resultType"] == "vector"
                    else [result[1]]
                )
                checked += 1
                if not values:
                    problems.append(f"{q.where}: no data: {expr}")
                elif not all(_finite(v) for v in values):
                    problems.append(f"{q.where}: not finite {values}: {expr}")
            for v in variable_queries(dashboard):
                params = {"match[]": substitute(v.selector)} if v.selector else {}
                names = await _get(session, f"{base}/api/v1/label/{v.label}/values", **params)
                if not names:
                    problems.append(f"{v.where}: label_values lists nothing")
        assert checked > 100
        assert not problems, "\n".join(problems)

        # The agents row draws what the load sent: cache misses and hits (the streams whose
        # server reported no cached count are in TTFT only), and 1.5 calls per tool-calling
        # response (two on chat, one on Anthropic, as many of each).
        classes = await _get(
            session, f"{base}/api/v1/query",
            query="sum by (cache) (increase(llm_time_to_first_token_by_cache_seconds_count[1m]))",
        )  # fmt: skip
        assert {s["metric"]["cache"] for s in classes["result"]} >= {"none", "most"}
        calls = await _get(
            session, f"{base}/api/v1/query",
            query="sum(llm_tool_calls_per_response_sum) / sum(llm_tool_calls_per_response_count)",
        )  # fmt: skip
        assert 1.4 <= float(calls["result"][0]["value"][1]) <= 1.6
        assembled = await _get(
            session, f"{base}/api/v1/query",
            query="sum(llm_tool_call_assembly_seconds_count) / sum(llm_tool_calls_per_response_count)",
        )  # fmt: skip
        assert 1.4 <= float(assembled["result"][0]["value"][1]) <= 1.6  # one assembly per call

        # The burn the load creates is what the SLO dashboard's alert panels show.
        firing = await _get(
            session,
            f"{base}/api/v1/query",
            query='ALERTS{alertstate="firing", alertname="LLMAvailabilityBurnRate"}',
        )
        assert {s["metric"]["severity"] for s in firing["result"]} == {"page", "ticket"}

        # The TTFT objective's SLI panel honours the override: 2.5 s is bad only under 2 s.
        slo = to_json_dict(build_slo_dashboard(spec_with_override()))
        (sli,) = [
            q
            for q in panel_queries(slo)
            if q.panel_title == "ttft: SLI vs target" and q.ref_id == "A"
        ]
        data = await _get(session, f"{base}/api/v1/query", query=substitute(sli.expr))
        by_model = {s["metric"]["model"]: float(s["value"][1]) for s in data["result"]}
        assert by_model.keys() == {DEFAULT_MODEL, OVERRIDE_MODEL}
        assert 0.5 < by_model[DEFAULT_MODEL] < 1.0
        assert by_model[OVERRIDE_MODEL] == 1.0
