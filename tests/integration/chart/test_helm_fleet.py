"""A fleet in one Prometheus: the rules of three releases loaded at once.

Releases ``a`` and ``c`` share the namespace team-a, ``b`` lives in team-b with a stricter
TTFT objective (99 %). Each serves its own model(s) with its own traffic, scraped with the
``llm_release`` label the chart's PodMonitor adds (``<namespace>/<fullname>``). promtool evaluates the three rendered
PrometheusRules together:

- every deployment's TTFT burn rate is its own traffic over its own budget (one series per
  deployment: two rule groups never write one series);
- a TTFT regression in ``c`` fires its burn-rate alerts with c's namespace and release
  only, at the chart's default severities (critical/warning); ``a`` (3 % slow, fine under
  95 %) and ``b`` stay quiet although b's 99 % objective would page on a's traffic;
- absence is per deployment: ``b`` losing its target and its traffic fires LLMSidecarDown and
  LLMNoTrafficData for b alone.

With unscoped rules the same test fails: every release's rules read the
whole fleet, so b's objective judges a's traffic and the alerts carry no release.
Skipped without helm (make tools) or promtool locally; fails under CI=true.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from sidecar.tools.slo.helm import LABEL_RELEASE, release_id
from tests.support.chart import CHART, RELEASES, by_kind, deployment, render_release, rid, sync
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration


def series(
    release: str, namespace: str, model: str, slow: int, *, gone_after: int | None = None
) -> list[dict]:
    """One deployment's scraped series: 1000 streamed requests a minute, ``slow`` of them
    with a first token over 2 s; ``gone_after`` minutes, its target and traffic vanish."""
    labels = f'namespace="{namespace}",{LABEL_RELEASE}="{release_id(namespace, deployment(release))}",model="{model}",route="/v1/chat/completions"'

    def values(step: int, ups: str = "") -> str:
        if gone_after is None:
            return f"0+{step}x90"
        return (
            f"0+{step}x{gone_after} _x{90 - gone_after}"
            if not ups
            else f"1x{gone_after} _x{90 - gone_after}"
        )

    ttft = "llm_time_to_first_token_seconds"
    return [
        {
            "series": f'up{{job="llm-sidecar",{labels.rsplit(",model=", 1)[0]},instance="{release}:9091"}}',
            "values": values(0, "up") if gone_after is not None else "1x90",
        },
        {"series": f'llm_requests_total{{{labels},outcome="ok"}}', "values": values(1000)},
        {"series": f"{ttft}_count{{{labels}}}", "values": values(1000)},
        {"series": f'{ttft}_bucket{{{labels},le="2.0"}}', "values": values(1000 - slow)},
        {"series": f'{ttft}_bucket{{{labels},le="+Inf"}}', "values": values(1000)},
    ]


def fleet_test(tmp_path: Path, chart: Path = CHART) -> subprocess.CompletedProcess:
    """Render the three releases from ``chart``, write a promtool test, run it."""
    promtool = require_tool("promtool")
    files = []
    for release, namespace, sets, _, _ in RELEASES:
        (rule,) = by_kind(render_release(release, namespace, sets, chart), "PrometheusRule")
        path = tmp_path / f"{release}.yaml"
        path.write_text(
            yaml.safe_dump(rule["spec"], sort_keys=False, width=10**9), encoding="utf-8"
        )
        files.append(path.name)
    healthy = [s for r, ns, _, model, slow in RELEASES for s in series(r, ns, model, slow)]
    b_gone = [
        s
        for r, ns, _, model, slow in RELEASES
        for s in series(r, ns, model, slow, gone_after=5 if r == "b" else None)
    ]
    a, b, c = (rid(r) for r, *_ in RELEASES)
    burn = "llm:burn_rate:ratio_rate1h"
    watched = 'alertname=~"LLMTTFTBurnRate|LLMAvailabilityBurnRate|LLMSidecarDown|LLMNoTrafficData",alertstate="firing"'
    test = {
        "rule_files": files,
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": healthy,
                "promql_expr_test": [
                    {
                        # Each deployment's own traffic over its own budget, one series each.
                        "expr": f'round({burn}{{slo="ttft"}}, 0.001)',  # drops the float noise
                        "eval_time": "65m",
                        "exp_samples": [
                            {
                                "labels": f'{{slo="ttft",namespace="team-a",{LABEL_RELEASE}="{a}",model="llama"}}',
                                "value": 0.6,
                            },
                            {
                                "labels": f'{{slo="ttft",namespace="team-b",{LABEL_RELEASE}="{b}",model="llama"}}',
                                "value": 0.5,
                            },
                            {
                                "labels": f'{{slo="ttft",namespace="team-a",{LABEL_RELEASE}="{c}",model="qwen"}}',
                                "value": 16,
                            },
                        ],
                    },
                    {
                        # The regression in c fires its alerts, and only c's: two page
                        # windows (critical) and two ticket windows (warning).
                        "expr": f"count by (alertname, namespace, {LABEL_RELEASE}, model, severity) (ALERTS{{{watched}}})",
                        "eval_time": "65m",
                        "exp_samples": [
                            {
                                "labels": f'{{alertname="LLMTTFTBurnRate",namespace="team-a",{LABEL_RELEASE}="{c}",model="qwen",severity="critical"}}',
                                "value": 2,
                            },
                            {
                                "labels": f'{{alertname="LLMTTFTBurnRate",namespace="team-a",{LABEL_RELEASE}="{c}",model="qwen",severity="warning"}}',
                                "value": 2,
                            },
                        ],
                    },
                ],
            },
            {
                "interval": "1m",
                "input_series": b_gone,
                "promql_expr_test": [
                    {
                        # b lost its target and its traffic: down and no-data for b alone.
                        "expr": f'count by (alertname, namespace, {LABEL_RELEASE}, severity) (ALERTS{{{watched},alertname=~"LLMSidecarDown|LLMNoTrafficData"}})',
                        "eval_time": "60m",
                        "exp_samples": [
                            # No target left: absent() keeps the release, which says whose it is (not the pods' namespace).
                            {
                                "labels": f'{{alertname="LLMSidecarDown",{LABEL_RELEASE}="{b}",severity="critical"}}',
                                "value": 1,
                            },
                            {
                                "labels": f'{{alertname="LLMNoTrafficData",{LABEL_RELEASE}="{b}",severity="warning"}}',
                                "value": 1,
                            },
                        ],
                    },
                ],
            },
        ],
    }
    (tmp_path / "fleet-test.yaml").write_text(
        yaml.safe_dump(test, sort_keys=False, width=10**9), encoding="utf-8"
    )
    return subprocess.run(
        [promtool, "test", "rules", "fleet-test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def helm_ok():
    if not sync.HELM.exists():
        require_tool(str(sync.HELM))  # skips locally, fails under CI=true


def test_monitors_label_the_release_the_rules_select(helm_ok):
    for kind in ("PodMonitor", "ServiceMonitor"):
        objs = render_release("a", "team-a", (f"prometheus.monitor.kind={kind}",))
        (monitor,) = by_kind(objs, kind)
        key = "podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"
        for endpoint in monitor["spec"][key]:
            relabel = [r for r in endpoint["relabelings"] if r.get("targetLabel") == LABEL_RELEASE]
            # The operator's job for a PodMonitor target is "<its namespace>/<its name>" when these
            # run; a ServiceMonitor watches its own namespace (tests/integration/chart/test_install_paths_prometheus.py).
            source = (
                {"sourceLabels": ["job"]}
                if kind == "PodMonitor"
                else {"sourceLabels": ["namespace"], "replacement": "${1}/" + deployment("a")}
            )
            assert relabel == [{"action": "replace", "targetLabel": LABEL_RELEASE, **source}]
    (rule,) = by_kind(render_release("a", "team-a", ()), "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all(f'{LABEL_RELEASE}="team-a/{deployment("a")}"' in e for e in exprs), (
        "an unscoped rule"
    )


def test_three_releases_in_one_prometheus_judge_only_themselves(helm_ok, tmp_path):
    result = fleet_test(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
