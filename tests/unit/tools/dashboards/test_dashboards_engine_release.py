"""The engine's own series (vLLM) on a release's dashboard, wherever they were scraped.

In monitoring-only mode the chart's engine scrape is off by default (the team's Prometheus
scrapes its vLLM already), so ``vllm:*`` series carry ``namespace`` and ``pod`` but no
``llm_release``; the chart's per-release dashboard opens with ``llm_release`` set to the
release. Every query over vLLM's series must then show the release's pods (known by the
sidecar's own series) and no other release's: promtool evaluates each such panel query with
the release selected. Skipped without promtool locally; fails under CI=true.
"""

from __future__ import annotations

import json
import subprocess

import yaml

from sidecar.tools.dashboards.inspect import ALL_VALUES, panel_queries, substitute
from tests.support.paths import ROOT
from tests.support.tools import require_tool

OVERVIEW = json.loads(
    (ROOT / "dashboards" / "llm-sidecar-overview.json").read_text(encoding="utf-8")
)
RULES = ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml"
MINE, OTHER = "team-a/chat-llm-sidecar", "team-a/code-llm-sidecar"


def engine_queries() -> list[tuple[str, str]]:
    """(where, expr) of every panel query reading vLLM's series, with the release selected."""
    values = {**ALL_VALUES, "llm_release": MINE}
    return [
        (q.where, substitute(q.expr, values)) for q in panel_queries(OVERVIEW) if "vllm:" in q.expr
    ]


def input_series() -> list[dict]:
    """Two pods of two releases in one namespace: the sidecars' series carry llm_release (the
    chart's monitor), the engines' do not (the team's own scrape)."""
    out = []
    for pod, release in (("chat-0", MINE), ("code-0", OTHER)):
        target = f'namespace="team-a",pod="{pod}"'
        out.append(
            {
                "series": f'llm_sidecar_build_info{{{target},llm_release="{release}",version="0.1.0"}}',
                "values": "1x20",
            }
        )
        for gauge in (
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
        ):
            out.append(
                {"series": f'{gauge}{{{target},job="vllm",model_name="m"}}', "values": "1x20"}
            )
        out.append(
            {
                "series": f'vllm:num_preemptions_total{{{target},job="vllm",model_name="m"}}',
                "values": "0+1x20",
            }
        )
        for phase in ("queue", "prefill", "decode"):
            out.append(
                {
                    "series": f'vllm:request_{phase}_time_seconds_sum{{{target},job="vllm",model_name="m"}}',
                    "values": "0+6x20",
                }
            )
            out.append(
                {
                    "series": f'vllm:request_{phase}_time_seconds_count{{{target},job="vllm",model_name="m"}}',
                    "values": "0+60x20",
                }
            )
        for family in ("llm_time_to_first_token_seconds", "llm_request_duration_seconds"):
            labels = f'{target},llm_release="{release}",model="m",route="chat",outcome="ok"'
            out.append({"series": f"{family}_sum{{{labels}}}", "values": "0+60x20"})
            out.append({"series": f"{family}_count{{{labels}}}", "values": "0+60x20"})
    return out


def test_engine_panels_show_the_selected_release_pods_only(tmp_path):
    queries = engine_queries()
    assert len(queries) >= 8, [w for w, _ in queries]
    # promtool checks each expression's result exactly: its labels must be the release's pod
    # (value unchecked: any number). An expected-result miss names the query.
    tests = []
    for _where, expr in queries:
        tests.append(
            {
                "expr": f"count by (namespace, pod) ({expr})",
                "eval_time": "10m",
                "exp_samples": [{"labels": '{namespace="team-a",pod="chat-0"}', "value": 1}],
            }
        )
    # The committed rules: the sidecar's side of each split reads their per-pod records.
    (tmp_path / "t.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "1m",
                "tests": [
                    {"interval": "1m", "input_series": input_series(), "promql_expr_test": tests}
                ],
            }
        ),
        encoding="utf-8",
    )
    done = subprocess.run(
        [require_tool("promtool"), "test", "rules", "t.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
