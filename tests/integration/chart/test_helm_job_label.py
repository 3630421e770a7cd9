"""prometheus.monitor.jobLabel: the job the monitor writes is the job LLMSidecarDown watches.

The monitor sets ``job`` to the value; the chart's rules come from the spec, whose
``alerts.target_down.job`` is ``llm-sidecar``. Another job name must move both, or every
release pages ``LLMSidecarDown`` (critical) for ever through ``absent(up{job="llm-sidecar"})``
while its sidecars are scraped fine: promtool shows the alert quiet with healthy targets.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.support.chart import require_helm, sync
from tests.support.tools import require_tool

JOB = "inference-sidecar"


def render(kind: str) -> dict[str, dict]:
    require_helm()
    args = [
        "-n",
        "team-a",
        "--set",
        f"prometheus.monitor.jobLabel={JOB}",
        "--set",
        f"prometheus.monitor.kind={kind}",
    ]
    return {
        o["kind"]: o
        for o in sync.objects(sync.template(args))
        if o["kind"] in sync.MONITORING_KINDS
    }


def down_rule(rule: dict) -> dict:
    (down,) = [
        r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "LLMSidecarDown"
    ]
    return down


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_the_down_alert_watches_the_monitors_job(kind):
    objs = render(kind)
    monitor = objs[kind]
    endpoints = monitor["spec"].get("podMetricsEndpoints") or monitor["spec"]["endpoints"]
    (sidecar,) = [e for e in endpoints if e["path"] == "/metrics"]
    written = [r["replacement"] for r in sidecar["relabelings"] if r.get("targetLabel") == "job"]
    assert written == [JOB]
    expr = down_rule(objs["PrometheusRule"])["expr"]
    assert set(re.findall(r'job="([^"]*)"', expr)) == {JOB}, expr


def test_healthy_targets_of_another_job_do_not_page(tmp_path):
    rule = render("PodMonitor")["PrometheusRule"]
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8"
    )
    up = f'up{{job="{JOB}",namespace="team-a",pod="p-0",llm_release="team-a/llm-sidecar"}}'
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [{"series": up, "values": "1x30"}],
                   "alert_rule_test": [{"eval_time": "20m", "alertname": "LLMSidecarDown", "exp_alerts": []}]}],
    }  # fmt: skip
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(test), encoding="utf-8")
    done = subprocess.run(
        [require_tool("promtool"), "test", "rules", "t.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
