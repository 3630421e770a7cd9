"""The overview's own-health row shows the sidecar's process alone, on a real Prometheus
scraping the pod as the chart does.

The chart scrapes one port twice: the sidecar's admin ``/metrics`` (job ``llm-sidecar``) and
the engine's page relayed at ``/metrics/engine`` (job ``llm-engine``), so both have the same
``namespace``, ``pod`` and ``instance``, and both have ``process_*``: vLLM's page is a
prometheus_client page too. The row's ``and on (job, instance) llm_sidecar_build_info`` must
keep the sidecar's series and drop the engine's. The engine here is a page with vLLM's
process families at values no sidecar has (a 9 TB resident set, 5000 CPU seconds, 900 of
1000 fds), so a query that let them through is caught, and the test first checks that those
series were scraped (the join, not their absence, is what leaves them out).
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import aiohttp
import pytest
import yaml
from aiohttp import web

from sidecar.tools.dashboards.inspect import panel_queries, substitute
from sidecar.tools.dashboards.own_health import ROW_TITLE
from tests.support.in_process import start_app
from tests.support.paths import ROOT
from tests.support.ports import retry_on_port_clash
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

OVERVIEW = ROOT / "dashboards" / "llm-sidecar-overview.json"
ENGINE_RSS = 9e12
ENGINE_PAGE = f"""# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 5000.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes {ENGINE_RSS}
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 900.0
# HELP process_max_fds Maximum number of open file descriptors.
# TYPE process_max_fds gauge
process_max_fds 1000.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 0.0
"""


def _row_queries() -> dict[str, str]:
    """{panel title: its query} of the own-health row, as committed, variables at All."""
    board = json.loads(OVERVIEW.read_text(encoding="utf-8"))
    row = next(p for p in board["panels"] if p.get("type") == "row" and p["title"] == ROW_TITLE)
    titles = {p["title"] for p in board["panels"] if p["gridPos"]["y"] == row["gridPos"]["y"] + 1}
    return {
        q.panel_title: substitute(q.expr) for q in panel_queries(board) if q.panel_title in titles
    }


async def _query(session: aiohttp.ClientSession, base: str, expr: str) -> list[dict]:
    async with session.get(f"{base}/api/v1/query", params={"query": expr}) as r:
        doc = await r.json()
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


async def test_the_own_health_row_shows_the_sidecar_not_the_engine(sidecar_factory, tmp_path):
    binary = require_tool("prometheus")

    async def engine_metrics(_: web.Request) -> web.Response:
        return web.Response(text=ENGINE_PAGE, content_type="text/plain")

    engine = web.Application()
    engine.router.add_get("/metrics", engine_metrics)
    runner, engine_port = await start_app(engine)
    proc = None
    try:
        sc = await sidecar_factory(f"http://127.0.0.1:{engine_port}")
        target = {
            "targets": [f"127.0.0.1:{sc.admin_port}"],
            "labels": {"namespace": "llm", "pod": "llm-0", "llm_release": "llm/llm-sidecar"},
        }
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            # The builds panel reads the rules' record of the build info, as a fleet's does.
            "rule_files": [str(ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml")],
            "scrape_configs": [
                {"job_name": "llm-sidecar", "static_configs": [target]},
                {
                    "job_name": "llm-engine",
                    "metrics_path": "/metrics/engine",
                    "static_configs": [target],
                },
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        proc, port = retry_on_port_clash(
            lambda p: subprocess.Popen(
                [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{p}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        queries = _row_queries()
        assert len(queries) == 4, queries
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            # Both pages scraped (three samples each, so a rate over them has two points).
            for _ in range(150):
                jobs = await _query(
                    session,
                    base,
                    "count by (job) (count_over_time(process_cpu_seconds_total[1m]) >= 3)",
                )
                if {s["metric"]["job"] for s in jobs} == {"llm-sidecar", "llm-engine"}:
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"both pages not scraped: {jobs}")
            both = await _query(
                session, base, "sum by (namespace, pod) (process_resident_memory_bytes)"
            )
            assert float(both[0]["value"][1]) > ENGINE_RSS  # the engine's series are there to leak

            own = await _query(session, base, 'process_resident_memory_bytes{job="llm-sidecar"}')
            (memory,) = await _query(session, base, queries["Sidecar memory (resident)"])
            assert memory["metric"] == {"namespace": "llm", "pod": "llm-0"}
            assert 1e6 < float(memory["value"][1]) < 4e9
            assert abs(float(memory["value"][1]) - float(own[0]["value"][1])) < 0.2 * float(
                own[0]["value"][1]
            )
            (fds,) = await _query(
                session, base, queries["Sidecar open file descriptors (share of limit)"]
            )
            assert (
                0 < float(fds["value"][1]) < 0.5
            )  # the engine's 900/1000 would be 0.9 (or 0.45 summed)
            (cpu,) = await _query(session, base, queries["Sidecar CPU (cores)"])
            assert (
                0 <= float(cpu["value"][1]) < 2
            )  # the engine's counter does not move; summed, still the sidecar's
            for _ in range(50):  # recorded at the rules' next evaluation
                builds_seen = await _query(session, base, queries["Sidecar builds"])
                if builds_seen:
                    break
                await asyncio.sleep(0.2)
            (builds,) = builds_seen
            assert builds["metric"].keys() == {"version", "speedups"} and builds["value"][1] == "1"
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        await runner.cleanup()
