"""The kube-prometheus-stack Alertmanager example routes what the chart's rules carry: every
severity the chart maps the spec's alerts to (prometheus.rules.severities defaults), and the
release's llm_release (its namespace and name), checked with the real `amtool config routes test`.
Skipped without amtool locally (Debian's prometheus-alertmanager); fails under CI=true."""

from __future__ import annotations

import subprocess

import yaml

from sidecar.tools.slo import load_spec
from sidecar.tools.slo.helm import LABEL_RELEASE, SEVERITIES, release_rules
from tests.support.paths import ROOT
from tests.support.tools import require_tool

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
    assert (
        values["prometheus"]["rules"]["severities"]
        == SEVERITIES
        == {"page": "critical", "ticket": "warning", "info": "info"}
    )


def test_every_alert_of_a_release_routes_by_its_severity_and_team():
    rules = release_rules(
        load_spec(str(ROOT / "deploy" / "slo" / "default.yaml")), "team-b", "b-llm-sidecar"
    )
    alerts = [r for r in rules.rules() if r.alert]
    severities = {a.labels["severity"] for a in alerts}
    assert severities == {"critical", "warning", "info"}
    want = {"critical": "pager", "warning": "tickets", "info": "tickets"}
    for severity in severities:
        assert (
            route(
                f"severity={severity}", "namespace=team-b", f"{LABEL_RELEASE}=team-b/b-llm-sidecar"
            )
            == want[severity]
        )
    assert (
        route("severity=critical", "namespace=team-a", f"{LABEL_RELEASE}=team-a/a-llm-sidecar")
        == "team-a-pager"
    )
    # An absent() alert (LLMSidecarDown with no target left) has no namespace: the release says whose it is.
    assert (
        route(
            "severity=critical", "alertname=LLMSidecarDown", f"{LABEL_RELEASE}=team-a/a-llm-sidecar"
        )
        == "team-a-pager"
    )
    # team-a's release watching pods in another namespace (monitoring-only) still pages team-a.
    assert (
        route("severity=critical", "namespace=inference", f"{LABEL_RELEASE}=team-a/a-llm-sidecar")
        == "team-a-pager"
    )
    am = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert {"namespace", LABEL_RELEASE, "slo", "model"} <= set(am["route"]["group_by"])


def test_every_error_cause_alert_of_a_release_routes_by_error_type():
    """The error-cause alerts carry error_type: each cause goes to the team that can fix
    it, whichever team's release it is, and with the same routes as the plain example
    (deploy/alertmanager/alertmanager.yaml); the burn-rate pages keep their routes."""
    from sidecar.tools.slo.rules import ERROR_CAUSES

    rules = release_rules(
        load_spec(str(ROOT / "deploy" / "slo" / "default.yaml")), "team-b", "b-llm-sidecar"
    )
    causes = {r.alert: r for r in rules.rules() if r.alert in {c.alert for c in ERROR_CAUSES}}
    expected = {
        "LLMUpstreamUnreachable": "platform-tickets",
        "LLMStreamsBroken": "model-serving-tickets",
    }
    assert set(causes) == set(expected)
    for cause in ERROR_CAUSES:
        severity = causes[cause.alert].labels["severity"]
        for error_type in cause.error_types:
            for release in ("team-a/a-llm-sidecar", "team-b/b-llm-sidecar"):
                got = route(f"alertname={cause.alert}", f"error_type={error_type}", f"severity={severity}",
                            f"{LABEL_RELEASE}={release}", "model=m")  # fmt: skip
                assert got == expected[cause.alert], (cause.alert, error_type, release, got)
    assert (
        route(
            "alertname=LLMAvailabilityBurnRate",
            "severity=critical",
            f"{LABEL_RELEASE}=team-b/b-llm-sidecar",
        )
        == "pager"
    )
    plain = yaml.safe_load(
        (ROOT / "deploy" / "alertmanager" / "alertmanager.yaml").read_text(encoding="utf-8")
    )
    stack = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))

    def by_error_type(am: dict) -> dict:
        return {
            m: r["receiver"]
            for r in am["route"]["routes"]
            for m in r["matchers"]
            if m.startswith("error_type")
        }

    assert by_error_type(stack) == by_error_type(plain) != {}
    assert set(by_error_type(stack).values()) <= {r["name"] for r in stack["receivers"]}
