"""The "where the time goes" row against real parts: a real vLLM 0.32 on CPU started with
``--enable-per-request-metrics``, the sidecar in front of it (a subprocess, ``python -m
sidecar serve``), and Debian's Prometheus scraping both every second.

Prometheus evaluates the shipped rules every second (the panels read their recorded series) and
scrapes vLLM's own ``/metrics`` directly (until the deploy branch's relay at the
admin port's ``/metrics/engine`` is merged), and adds the ``namespace`` and ``pod`` target
labels to it by relabelling, as kube-prometheus-stack would, so the per-pod join between the
sidecar's series and vLLM's is the one a cluster runs. Twelve streamed requests at once
against ``--max-num-seqs 8`` make vLLM queue some of them for real.

Then every query of the row must return finite data for the pod, and the sidecar's
per-request figures must agree with what vLLM said in each stream's ``metrics`` object.

vLLM and the tiny model come from ``scripts/install-vllm.sh`` (``make test-real``) under
``.tools/`` (``TOOLS_DIR`` points elsewhere); missing, the test skips locally and fails in CI.
"""

from __future__ import annotations

import asyncio
import json
import math

import aiohttp
import pytest

from sidecar.tools.dashboards.inspect import panel_queries, substitute
from sidecar.tools.dashboards.where_time_goes import ROW_TITLE
from tests.real.servers import MODEL, ROOT, VLLM_REQUEST_METRICS, start
from tests.support.live_stack import query, sidecar_and_prometheus
from tests.support.skips import IN_CI

pytestmark = [pytest.mark.real, pytest.mark.integration]

NAMESPACE, POD = "llm", "llm-0"
CONCURRENT = 12  # more than --max-num-seqs: some wait in vLLM's queue


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(sidecar proxy URL, Prometheus URL, admin URL): real vLLM, sidecar, Prometheus, all
    running."""
    why = VLLM_REQUEST_METRICS.missing()
    if why is not None:
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("where")
    vllm = start(VLLM_REQUEST_METRICS, log_path=tmp / "vllm.log")
    # vLLM's own /metrics; the pod and namespace come from relabelling, as a PodMonitor's would.
    engine = {
        "job_name": "llm-engine",
        "static_configs": [{"targets": [f"127.0.0.1:{vllm.port}"]}],
        "relabel_configs": [
            {"target_label": "namespace", "replacement": NAMESPACE},
            {"target_label": "pod", "replacement": POD},
        ],
    }
    try:
        with sidecar_and_prometheus(
            vllm.url,
            tmp,
            labels={"namespace": NAMESPACE, "pod": POD},
            extra_scrape_configs=(engine,),
        ) as live:
            vllm.wait_ready()
            yield live.proxy_url, live.prometheus_url, live.admin_url
    finally:
        vllm.stop()


async def _chat(session: aiohttp.ClientSession, url: str, i: int) -> dict | None:
    """One streamed chat with usage asked; returns the usage chunk's vLLM ``metrics``."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Tell me about licence number {i}."}],
        "max_tokens": 24,
        "temperature": 0,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    metrics = None
    async with session.post(f"{url}/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {"):
                obj = json.loads(line[6:])
                if obj.get("metrics"):
                    metrics = obj["metrics"]
    return metrics


def _row_queries() -> list:
    overview = json.loads(
        (ROOT / "dashboards" / "llm-sidecar-overview.json").read_text(encoding="utf-8")
    )
    titles = [p["title"] for p in overview["panels"]]
    start = titles.index(ROW_TITLE)
    rows = [i for i, p in enumerate(overview["panels"]) if p["type"] == "row" and i > start]
    end = rows[0] if rows else len(titles)
    mine = set(titles[start + 1 : end])
    return [q for q in panel_queries(overview) if q.panel_title in mine]


async def test_where_time_goes_row_has_data_for_the_pod(stack):
    proxy, prom, admin = stack
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        reported = await asyncio.gather(*(_chat(session, proxy, i) for i in range(CONCURRENT)))
        # And a second wave, so the rate window holds two scrapes with traffic between them.
        await asyncio.sleep(2)
        reported += await asyncio.gather(*(_chat(session, proxy, i) for i in range(CONCURRENT)))
        assert all(m is not None for m in reported), "vLLM sent no per-request metrics"
        await asyncio.sleep(4)  # two more scrapes after the last request

        # The sidecar read every stream's queue time, and the sum is vLLM's own.
        queue_count = await query(session, prom, 'llm_upstream_queue_seconds_count{pod="llm-0"}')
        assert [float(s["value"][1]) for s in queue_count] == [len(reported)]
        queue_sum = await query(session, prom, 'llm_upstream_queue_seconds_sum{pod="llm-0"}')
        assert float(queue_sum[0]["value"][1]) == pytest.approx(
            sum(m["queue_time_ms"] for m in reported) / 1000, rel=1e-6
        )
        overhead = await query(session, prom, 'llm_sidecar_overhead_seconds_count{pod="llm-0"}')
        assert {s["metric"]["direction"]: float(s["value"][1]) for s in overhead} == {
            "request": len(reported),
            "response": len(reported),
        }

        queries = _row_queries()
        assert len(queries) >= 10, [q.where for q in queries]
        problems = []
        for q in queries:
            expr = substitute(q.expr)
            result = await query(session, prom, expr)
            if not result:
                problems.append(f"{q.where}: no data: {expr}")
                continue
            for s in result:
                value = float(s["value"][1])
                if not math.isfinite(value):
                    problems.append(f"{q.where}: not finite: {s}")
                if "pod" in s["metric"] and s["metric"]["pod"] != POD:
                    problems.append(f"{q.where}: unexpected pod {s['metric']}")
            if "vllm:" in q.expr and "llm_" in q.expr:
                # The join of the sidecar's series and vLLM's, per pod: exactly one answer.
                if [s["metric"] for s in result] != [{"namespace": NAMESPACE, "pod": POD}]:
                    problems.append(f"{q.where}: join gave {result}")
        assert not problems, "\n".join(problems)
        # For the record (pytest -s): the split the first panel draws.
        for q in queries:
            if q.panel_title.startswith("TTFT per pod") or q.panel_title.startswith(
                "What the sidecar adds"
            ):
                for s in await query(session, prom, substitute(q.expr)):
                    print(
                        f"{q.panel_title[:22]} {q.ref_id}: {float(s['value'][1]) * 1000:.3f} ms {s['metric']}"
                    )
