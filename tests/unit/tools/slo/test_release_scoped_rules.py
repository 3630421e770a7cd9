"""Every rule of a release reads and keeps its own release: each selector
of a sidecar series or ``llm:`` record carries the release's ``llm_release`` matcher, and
each aggregation keeps ``llm_release`` and ``namespace`` (LLMNoTrafficData: the release as a
whole), in every group the generator makes
(the SLO groups, goodput and the requests' own objectives, the error causes, health,
capacity), so a group added later cannot judge another release's traffic unnoticed."""

from __future__ import annotations

import re

import pytest

from sidecar.tools.slo import generate, load_spec
from sidecar.tools.slo.helm import release_rules
from tests.support.rules import SPEC, every_alert_spec

RELEASE = ("team-b", "b-llm-sidecar")
MATCHER = 'llm_release="team-b/b-llm-sidecar"'
_CLAUSE = re.compile(r"\b(by|on|ignoring|group_left|group_right|without) \([^)]*\)")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?")


def unscoped(ruleset) -> list[tuple]:
    """(group, rule, what) of every selector or aggregation that does not keep to the release."""
    out = []
    for group in ruleset.groups:
        for rule in group.rules:
            name = rule.record or rule.alert
            expr = _CLAUSE.sub("", rule.expr)
            expr = re.sub(
                r'"[^"]*"', lambda m: m.group(0).replace(" ", "\x00"), expr
            )  # a value is no selector
            for metric, labels in _SELECTOR.findall(expr):
                if metric.startswith(("llm_", "llm:", "up", "process_")) and MATCHER not in labels:
                    out.append((group.name, name, metric + labels))
            for by in re.findall(r"\bby \(([^)]*)\)", rule.expr):
                kept = {label.strip() for label in by.split(",")}
                # LLMNoTrafficData is the release's as a whole (its pods' namespaces apart: no).
                need = (
                    {"llm_release"}
                    if rule.alert == "LLMNoTrafficData"
                    else {"llm_release", "namespace"}
                )
                if not need <= kept:
                    out.append((group.name, name, f"by ({by})"))
    return out


@pytest.mark.parametrize("which", ["default", "every-alert"])
def test_every_selector_and_aggregation_keeps_to_the_release(which):
    spec = load_spec(str(SPEC)) if which == "default" else every_alert_spec()
    ruleset = release_rules(spec, *RELEASE)
    assert {"llm-sidecar-aggregates", "llm-sidecar-requests", "llm-sidecar-health"} <= {
        g.name for g in ruleset.groups
    }
    assert not unscoped(ruleset)
    # The check sees an unscoped rule: the plain rules (no release) fail it in every group.
    plain = {group for group, _, _ in unscoped(generate(spec))}
    assert {"llm-sidecar-aggregates", "llm-sidecar-requests"} <= plain
