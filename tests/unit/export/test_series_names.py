"""Every series a shipped dashboard panel or rule reads is one the sidecar exports.

A family renamed in the code (or a label dropped) would leave a panel empty and an alert
silent, with nothing failing: a PromQL selector of a series nobody exports is valid and
matches nothing. So every ``llm_…`` series name in the expressions of the dashboards, the
plain rules and the chart's rules (as a release gets them) must be a sample name of a family a sidecar built with
every option on registers (``_bucket``/``_sum``/``_count`` of a histogram, ``_total`` of a
counter), and every label such an expression selects on or groups by must be one of that
family's labels, or one the scrape adds (the pod's and the release's).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import yaml
from prometheus_client import CollectorRegistry

from sidecar.app import build_sidecar
from sidecar.config import Settings
from sidecar.export.prometheus_internals import MetricWrapperBase
from sidecar.tools.slo import render_rules
from sidecar.tools.slo.helm import release_rules
from tests.support.paths import ROOT
from tests.support.rules import every_alert_spec

DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
RULES = [ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml"]
CHART_RULES = "the chart's rules, every alert"
SCRAPE_LABELS = {"cluster", "namespace", "pod", "job", "instance", "service", "container"}
RELEASE = "llm_release"  # the chart's monitors add it (docs/design.md, generated artefacts)
SERIES = re.compile(r"\b(llm_[a-z_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)")


@pytest.fixture(scope="module")
def samples() -> dict[str, frozenset[str]]:
    """{sample name: label names} of a sidecar with every option on (a labelled family has
    no samples before its first update, so its labels are read from the instrument)."""
    settings = Settings(
        upstream="http://127.0.0.1:9", tenant_header="X-Tenant", ttft_prompt_classes=[1024]
    )
    registry = CollectorRegistry()
    build_sidecar(settings, registry, access_log=False)
    families: dict[str, tuple[str, frozenset[str]]] = {}
    for collector in list(registry._collector_to_names):
        if isinstance(collector, MetricWrapperBase):
            families[collector._name] = (collector._type, frozenset(collector._labelnames))
        else:  # custom collectors (process_*): labels from their samples
            for family in collector.collect():
                labels = frozenset(label for sample in family.samples for label in sample.labels)
                labels = labels or frozenset(getattr(family, "_labelnames", ()))  # read live
                families[family.name] = (family.type, labels)
    out: dict[str, frozenset[str]] = {}
    for name, (kind, labels) in families.items():
        if kind == "counter":
            out[name + "_total"] = labels
        elif kind == "histogram":
            out[name + "_bucket"] = labels | {"le"}
            out[name + "_sum"] = out[name + "_count"] = labels
        else:
            out[name] = labels
    return out


def expressions(node: object) -> Iterator[str]:
    """Every PromQL expression in a dashboard's JSON or a rules file's YAML."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def shipped() -> Iterator[tuple[str, str]]:
    for path in DASHBOARDS:
        for expr in expressions(json.loads(path.read_text())):
            yield path.name, expr
    for path in RULES:
        for expr in expressions(yaml.safe_load(path.read_text())):
            yield path.name, expr
    # What one release of the chart gets (its template renders these: test_helm.py), from a
    # spec that makes every kind of alert.
    chart = render_rules(release_rules(every_alert_spec(), "ns", "release"))
    for expr in expressions(yaml.safe_load(chart)):
        yield CHART_RULES, expr


def test_there_are_expressions_to_check():
    seen = {name for name, _ in shipped()}
    assert seen == {p.name for p in DASHBOARDS} | {p.name for p in RULES} | {CHART_RULES}
    assert sum(1 for _ in shipped()) > 100


def test_every_series_an_expression_reads_is_exported_with_the_labels_it_selects(samples):
    unknown: set[tuple[str, str]] = set()
    bad_labels: set[tuple[str, str, str]] = set()
    for where, expr in shipped():
        for match in SERIES.finditer(expr):
            name, selector = match.group(1), match.group(2) or ""
            if name == RELEASE:
                continue  # a label, not a series
            if name not in samples:
                unknown.add((where, name))
                continue
            allowed = samples[name] | SCRAPE_LABELS | {RELEASE}
            for label, _ in MATCHER.findall(selector):
                if label not in allowed:
                    bad_labels.add((where, name, label))
    assert not unknown, f"series no family exports: {sorted(unknown)}"
    assert not bad_labels, f"labels the series does not carry: {sorted(bad_labels)}"


def test_the_check_would_catch_a_renamed_family(samples):
    """The pattern finds a selector's series and its labels (so the checks above are not
    vacuous): a made-up family is unknown, a made-up label is not the family's."""
    expr = 'sum(rate(llm_requests_totl{model="m", cluster=~"$c"}[5m])) by (model)'
    (match,) = SERIES.finditer(expr)
    assert match.group(1) == "llm_requests_totl" and match.group(1) not in samples
    assert [label for label, _ in MATCHER.findall(match.group(2))] == ["model", "cluster"]
    assert "nope" not in samples["llm_requests_total"]
