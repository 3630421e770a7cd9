"""The committed Prometheus rules are exactly what the committed SLO spec renders to.

Refresh after changing the spec or the generator:
    llm-sidecar slo render deploy/slo/default.yaml -o deploy/prometheus/llm-sidecar-rules.yaml
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from sidecar.tools.slo import generate, load_spec, render_rules
from sidecar.tools.slo.render import HEADER

ROOT = Path(__file__).resolve().parents[2]

# spec (deploy/slo/) -> the rules file rendered from it (deploy/prometheus/)
RENDERED = {
    "deploy/slo/default.yaml": "deploy/prometheus/llm-sidecar-rules.yaml",
}


@pytest.mark.parametrize("spec, rules", sorted(RENDERED.items()))
def test_committed_rules_match_the_spec(spec, rules):
    expected = render_rules(generate(load_spec(str(ROOT / spec))))
    committed = (ROOT / rules).read_text(encoding="utf-8")
    if committed != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(True), expected.splitlines(True), rules, "rendered"
                )
            )[:60]
        )
        pytest.fail(
            f"{rules} is stale; refresh it:\n  llm-sidecar slo render {spec} -o {rules}\n{diff}"
        )


def test_every_spec_and_rules_file_is_accounted_for():
    specs = {str(p.relative_to(ROOT)) for p in (ROOT / "deploy" / "slo").glob("*.yaml")}
    rules = {str(p.relative_to(ROOT)) for p in (ROOT / "deploy" / "prometheus").glob("*.yaml")}
    assert specs == set(RENDERED)
    assert rules == set(RENDERED.values())
    for path in rules:
        assert (ROOT / path).read_text(encoding="utf-8").startswith(HEADER + "\n")
