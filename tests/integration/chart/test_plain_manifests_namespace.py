"""Plain manifests (deploy/kubernetes/) in more than one namespace of one Prometheus.

Their rules select ``llm_release=~".+/llm-sidecar"`` so that ``kubectl apply -n ANY`` works
for one install. Two such installs (no ``enforcedNamespaceLabel``) judge each other: the
``absent()`` arm of ``LLMSidecarDown`` in one is satisfied by the other's targets, so an
install whose pods are all gone never pages. docs/kubernetes.md ("Which pods a release
judges") says so and gives three lines that pin the rules to the namespace, said once; this
runs those lines word for word (``kubectl`` stubbed to keep what it is given) and checks the
pinned objects are the chart's own for that namespace, and that with them each install's
absence pages for that install.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.chart import require_helm, sync
from tests.support.paths import ROOT
from tests.support.tools import require_tool

DOC = ROOT / "docs" / "kubernetes.md"

# What `kubectl apply -n NS -f FILE|-` would create, kept as files instead.
KUBECTL_STUB = """
kubectl() {
  [ "$1 $2 $4" = "apply -n -f" ] || { echo "unexpected kubectl $*" >&2; return 2; }
  if [ "$5" = - ]; then cat > "$OUT/$3.monitoring.yaml"; else cp "$5" "$OUT/$3.core.yaml"; fi
}
"""


def doc_block() -> str:
    """The docs' shell block that pins the plain rules to a namespace (the one with `sed`)."""
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    (block,) = [b for b in blocks if "sed " in b and "deploy/kubernetes/monitoring.yaml" in b]
    assert block.startswith("NS=prod\n"), "the namespace is said once, on the first line"
    return block


def apply_as_documented(namespace: str, out: Path) -> list[dict]:
    script = KUBECTL_STUB + doc_block().replace("NS=prod\n", f"NS={namespace}\n", 1)
    subprocess.run(
        ["bash", "-euc", script],
        cwd=ROOT,
        env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return [
        d
        for d in yaml.safe_load_all(
            (out / f"{namespace}.monitoring.yaml").read_text(encoding="utf-8")
        )
        if d
    ]


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


def test_pinned_plain_objects_are_the_charts_for_that_namespace(tmp_path):
    require_helm()
    pinned = by_kind(apply_as_documented("prod", tmp_path))
    chart = by_kind(
        [
            o
            for o in sync.objects(sync.template(["-n", "prod", *sync.Case("pinned").args()]))
            if o["kind"] in sync.MONITORING_KINDS
        ]
    )
    assert set(pinned) == set(chart) == {"PodMonitor", "PrometheusRule"}
    for kind in pinned:
        assert pinned[kind]["spec"] == chart[kind]["spec"], (
            f"{kind}: the pinned plain manifest is not the chart's for prod"
        )
    assert '".+/llm-sidecar"' not in yaml.safe_dump(pinned["PrometheusRule"])
    assert (tmp_path / "prod.core.yaml").read_text() == (
        ROOT / "deploy" / "kubernetes" / "llm-sidecar.yaml"
    ).read_text()


def rule_file(objects: list[dict], path: Path) -> str:
    """The PrometheusRule as the operator writes it for Prometheus: its spec's groups."""
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    return path.name


def sidecar_down(rule_files: list[str], tmp_path: Path, second_install: bool = True) -> str:
    """promtool: install a's only target goes away at 10m while b's (if any) stays up; at 35m
    (well past LLMSidecarDown's 5m `for`) which LLMSidecarDown alerts fire? ('' when none)."""
    series = [
        {
            "series": 'up{job="llm-sidecar",namespace="a",pod="a-1",llm_release="a/llm-sidecar"}',
            "values": "1x10 _x30",
        },
        {
            "series": 'up{job="llm-sidecar",namespace="b",pod="b-1",llm_release="b/llm-sidecar"}',
            "values": "1x40",
        },
    ][: 2 if second_install else 1]
    test = {
        "rule_files": rule_files,
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "35m", "alertname": "LLMSidecarDown", "exp_alerts": []}
                ],
            }
        ],
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(test), encoding="utf-8")
    done = subprocess.run(
        [require_tool("promtool"), "test", "rules", "t.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_unpinned_plain_installs_hide_each_others_absence(tmp_path):
    """The fault the docs warn of: as shipped, two installs, and a's absence pages nobody."""
    shipped = [
        d
        for d in yaml.safe_load_all(
            (ROOT / "deploy" / "kubernetes" / "monitoring.yaml").read_text(encoding="utf-8")
        )
        if d
    ]
    files = [rule_file(shipped, tmp_path / "a.yaml"), rule_file(shipped, tmp_path / "b.yaml")]
    assert sidecar_down(files, tmp_path) == ""
    # One install alone does page (absent() of a regex keeps only job: no release named).
    alone = sidecar_down(files[:1], tmp_path, second_install=False)
    assert 'Labels:{alertname="LLMSidecarDown", job="llm-sidecar", severity="critical"}' in alone, (
        alone
    )


def test_pinned_plain_installs_page_for_their_own_absence(tmp_path):
    require_helm()
    files = [
        rule_file(apply_as_documented(ns, tmp_path), tmp_path / f"{ns}.rules.yaml")
        for ns in ("a", "b")
    ]
    got = sidecar_down(files, tmp_path)
    # Exactly one alert, a's, named by its release (routable: llm_release=~"a/.+").
    assert got.count('alertname="LLMSidecarDown"') == 1, got
    assert 'llm_release="a/llm-sidecar"' in got and "b/llm-sidecar" not in got, got


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
