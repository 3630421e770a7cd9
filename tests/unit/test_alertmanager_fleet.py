"""The kube-prometheus-stack Alertmanager example routes what the chart's rules carry: every
severity the chart maps the spec's alerts to (prometheus.rules.severities defaults), and the
release's llm_release (its namespace and name), checked with the real `amtool config routes test`.
Skipped without amtool locally (Debian's prometheus-alertmanager); fails under CI=true."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from sidecar.tools.slo import load_spec
from sidecar.tools.slo.helm import LABEL_RELEASE, SEVERITIES, release_rules
from tests.conftest import require_tool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "alertmanager" / "kube-prometheus-stack.yaml"
VALUES = ROOT / "helm" / "llm-sidecar" / "values.yaml"


def route(*labels: str) -> str:
    amtool = require_tool("amtool")
    out = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={EXAMPLE}", *labels],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def test_chart_default_severities_are_kube_prometheus_stacks():
    values = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    assert values["prometheus"]["rules"]["severities"] == SEVERITIES == {"page": "critical", "ticket": "warning", "info": "info"}


def test_every_alert_of_a_release_routes_by_its_severity_and_team():
    rules = release_rules(load_spec(str(ROOT / "deploy" / "slo" / "default.yaml")), "team-b", "b-llm-sidecar")
    alerts = [r for r in rules.rules() if r.alert]
    severities = {a.labels["severity"] for a in alerts}
    assert severities == {"critical", "warning", "info"}
    want = {"critical": "pager", "warning": "tickets", "info": "tickets"}
    for severity in severities:
        assert route(f"severity={severity}", "namespace=team-b", f"{LABEL_RELEASE}=team-b/b-llm-sidecar") == want[severity]
    assert route("severity=critical", "namespace=team-a", f"{LABEL_RELEASE}=team-a/a-llm-sidecar") == "team-a-pager"
    # An absent() alert (LLMSidecarDown with no target left) has no namespace: the release says whose it is.
    assert route("severity=critical", "alertname=LLMSidecarDown", f"{LABEL_RELEASE}=team-a/a-llm-sidecar") == "team-a-pager"
    # team-a's release watching pods in another namespace (monitoring-only) still pages team-a.
    assert route("severity=critical", "namespace=inference", f"{LABEL_RELEASE}=team-a/a-llm-sidecar") == "team-a-pager"
    am = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert {"namespace", LABEL_RELEASE, "slo", "model"} <= set(am["route"]["group_by"])
