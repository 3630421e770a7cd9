"""The dashboards read recorded series, which the rules produce, and no panel draws one line
per pod of a fleet.

- Every query of every committed dashboard reads only ``llm:`` records (and Prometheus'
  own ``ALERTS``), except the named drill-downs to pods below, each bounded by ``topk`` (the
  engine's and the process's own series, the sidecar's per pod: nothing records a pod's
  series), and the detail views, which read their raw families when drawn, summed by
  release and model (``aggregates.READ_WHEN_DRAWN``).
- Every ``llm:`` series a dashboard reads is recorded by a rule of the committed rules file
  and of the chart's, and every label a panel filters a dashboard record by is one the
  record keeps (a filter on a label summed away would match nothing).
- A query that keeps ``pod`` is bounded by ``topk``.
- The query helpers refuse what no rule records, so a new panel cannot read raw series by
  accident.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from sidecar.tools.dashboards import queries
from sidecar.tools.dashboards.inspect import panel_queries
from sidecar.tools.slo import aggregates
from tests.support.paths import ROOT

DASHBOARDS = {
    path.name: json.loads(path.read_text(encoding="utf-8"))
    for path in sorted((ROOT / "dashboards").glob("*.json"))
}
RULES = ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml"
CHART_RULES = ROOT / "deploy" / "kubernetes" / "monitoring.yaml"  # rendered from the chart

DRILL_DOWNS = {
    # The engine's own series (vllm:*), per pod.
    "Engine queue: waiting and running requests",
    "KV-cache usage",
    "Preemptions per second",
    "TTFT per pod: engine queue + engine prefill + the rest (mean)",
    "E2E per pod: engine queue + prefill + decode + the rest (mean)",
    # The sidecar process's own series (process_*), per pod.
    "Sidecar CPU (cores)",
    "Sidecar memory (resident)",
    "Sidecar open file descriptors (share of limit)",
    # The sidecar's own series per pod: no rule records a pod's series (an evaluation would
    # write and read them all again); the panel reads them when drawn.
    "TTFT p90 by pod",
    "TPOT p90 by pod",
    "Request rate by pod",
    "Error ratio by pod",
    "In-flight requests by pod",
    "Output tokens per second by pod",
    "Streams stalled",
    "Engine-reported per request: queue, prefill, decode (mean)",
    # The SLI's bad events by pod and route, one per objective.
    "availability: bad-event share by pod and route",
    "ttft: bad-event share by pod and route",
    "tpot: bad-event share by pod and route",
    "e2e: bad-event share by pod and route",
}
"""Panels that may read raw series: each one a drill-down to pods, each query bounded by topk."""

PROMETHEUS_OWN = {"ALERTS"}
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
_BY_POD = re.compile(r"\bby \([^)]*\bpod\b[^)]*\)")


def every_query():
    for name, dashboard in DASHBOARDS.items():
        for q in panel_queries(dashboard):
            yield name, q


def recorded_names(path) -> set[str]:
    return set(re.findall(r"^\s*- record: (\S+)$", path.read_text(encoding="utf-8"), re.M))


def test_every_query_reads_records_but_the_bounded_drill_downs_and_the_detail_views():
    raw_panels, detail_panels = set(), set()
    checked = 0
    for name, q in every_query():
        raw = {m for m, _ in _SELECTOR.findall(q.expr) if not m.startswith("llm:")}
        raw -= PROMETHEUS_OWN
        checked += 1
        if not raw:
            continue
        if q.panel_title in DRILL_DOWNS:
            assert q.expr.startswith("topk(") or " topk(" in q.expr, f"{q.where}: unbounded"
            raw_panels.add(q.panel_title)
            continue
        # A detail view: only families read when drawn, every one summed (by release and
        # model at most, never by pod: that is a drill-down's).
        drawn = {m for m in raw if aggregates.read_when_drawn(m)}
        assert drawn == raw, f"{name} {q.where}: reads raw {sorted(raw - drawn)}"
        for metric in raw:
            # A counter's or histogram's rates summed, or a gauge summed (its largest value).
            assert re.search(rf"sum(?: by \([^)]*\))? \(rate\({metric}\{{", q.expr) or re.search(
                rf"(?:sum|max)(?: by \([^)]*\))? \({metric}\{{", q.expr
            ), f"{q.where}: {metric} not summed"
        assert not _BY_POD.search(q.expr), f"{q.where}: a detail view per pod"
        detail_panels.add(q.panel_title)
    assert checked > 150
    # No stale entry: each one names a panel that reads raw series.
    assert raw_panels == DRILL_DOWNS
    assert len(detail_panels) >= 8, sorted(detail_panels)


def test_every_record_a_dashboard_reads_is_produced_by_the_rules_and_the_chart():
    plain, chart = recorded_names(RULES), recorded_names(CHART_RULES)
    read = {
        m for _, q in every_query() for m, _ in _SELECTOR.findall(q.expr) if m.startswith("llm:")
    }
    assert len(read) > 30
    assert read <= plain, sorted(read - plain)
    assert read <= chart, sorted(read - chart)
    # ... and each dashboard record exactly once, in the dashboards' group.
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    (group,) = [g for g in groups if g["name"] == aggregates.GROUP]
    assert [r["record"] for r in group["rules"]] == [a.record for a in aggregates.AGGREGATES]


def test_every_label_a_panel_selects_a_record_by_is_one_it_keeps():
    by_record = {a.record: a for a in aggregates.AGGREGATES}
    checked = 0
    for _, q in every_query():
        for metric, body in _SELECTOR.findall(q.expr):
            record = by_record.get(metric)
            if record is None:
                continue
            labels = {m.group(1) for m in re.finditer(r'(\w+)\s*(?:=~|!~|!=|=)\s*"', body)}
            assert labels <= set(record.kept), (
                f"{q.where}: {metric} has no {labels - set(record.kept)}"
            )
            checked += 1
    assert checked > 50


def test_no_query_draws_one_line_per_pod_unbounded():
    per_pod = 0
    for name, q in every_query():
        if _BY_POD.search(q.expr):
            per_pod += 1
            assert "topk(" in q.expr, f"{name} {q.where}: one line per pod, unbounded"
    assert per_pod >= 15


def test_the_helpers_refuse_what_no_rule_records():
    with pytest.raises(KeyError, match="no record of llm_nothing_total"):
        queries.sum_rate("llm_nothing_total")
    with pytest.raises(KeyError, match="no family declares"):
        queries.sum_rate("llm_nothing_total", ("namespace", "pod"))
    # A label the record sums away: a split by it, or a filter on it.
    with pytest.raises(ValueError, match="does not keep"):
        queries.sum_rate("llm_requests_total", ("finish_reason",))
    with pytest.raises(ValueError, match="does not keep"):
        queries.quantile(
            0.9, "llm_time_to_first_token_seconds", extra=(("prompt_class", "=", "long"),)
        )
    # What they read: the record, with the filters it keeps (not pod, summed away).
    expr = queries.sum_rate("llm_requests_total", ("outcome",))
    assert expr.startswith("sum by (outcome) (llm:requests:rate5m{")
    assert 'pod=~"$pod"' not in expr and 'route=~"$route"' in expr
    # Per pod, or a detail view: the raw series over the rate window, when drawn.
    per_pod = queries.sum_rate("llm_requests_total", ("namespace", "pod"))
    assert per_pod.startswith("sum by (namespace, pod) (rate(llm_requests_total{")
    assert 'pod=~"$pod"' in per_pod and "[$__rate_interval]" in per_pod
    detail = queries.quantile(0.9, "llm_time_to_first_byte_seconds", ("model",))
    assert "sum by (model, le) (rate(llm_time_to_first_byte_seconds_bucket{" in detail
    with pytest.raises(ValueError, match="has no"):
        queries.sum_rate("llm_finish_reasons_total", ("outcome",))
