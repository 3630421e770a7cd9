"""The committed dashboards import anywhere and say what they show; the SLO dashboard agrees
with the committed alert rules.

Import anywhere: a `datasource` variable of type datasource (Prometheus) that every panel and
every query reads, no `__inputs` (nothing to map at import), stable uids, the namespace, pod,
model and route variables, `$__rate_interval` as every range (only drill-downs to pods read
raw series over a range: tests/unit/tools/dashboards/test_dashboards_recorded.py), a unit and a
description on every panel, a layout inside Grafana's 24 columns without overlaps.

Agreement: every burn-rate panel's threshold line is the factor in the committed alert
expression for that objective and window pair; target lines and stat thresholds are the
spec's targets (overrides included); the alert panels name exactly the rules' alerts.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
import yaml

from sidecar.tools.dashboards import overview, slo
from sidecar.tools.dashboards.inspect import panel_queries, variable_queries
from sidecar.tools.slo import aggregates, conventions as c, load_spec, parse_spec
from sidecar.tools.slo.windows import WORKBOOK_WINDOWS, burn_rate_factor, format_number
from tests.support.paths import ROOT

SPEC = load_spec(str(ROOT / "deploy" / "slo" / "default.yaml"))
RULES = yaml.safe_load(
    (ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml").read_text(encoding="utf-8")
)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FILTERS = ("cluster", "namespace", "llm_release", "pod", "model", "route")
# Recorded series are filtered by the spec's grouping labels (all variables by default), and
# by llm_release, which the chart's rules carry.
GROUP_FILTERS = (
    'cluster=~"$cluster", namespace=~"$namespace", model=~"$model", llm_release=~"$llm_release"'
)
UIDS = {"llm-sidecar-overview.json": overview.UID, "llm-sidecar-slo.json": slo.UID}


def load(name: str) -> dict:
    return json.loads((ROOT / "dashboards" / name).read_text(encoding="utf-8"))


DASHBOARDS = {name: load(name) for name in sorted(UIDS)}
OVERVIEW = DASHBOARDS["llm-sidecar-overview.json"]
SLO = DASHBOARDS["llm-sidecar-slo.json"]


def panels(d: dict) -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    return [q for p in d["panels"] for q in (p.get("panels", []) if p["type"] == "row" else [p])]


def by_title(d: dict, title: str) -> dict:
    (panel,) = [p for p in d["panels"] if p["title"] == title]
    return panel


all_dashboards = pytest.mark.parametrize("name", sorted(DASHBOARDS))


# ------------------------------------------------------------------ importable anywhere


def test_uids_are_stable_and_files_are_named_after_them():
    assert {name: d["uid"] for name, d in DASHBOARDS.items()} == UIDS
    assert {name.removesuffix(".json") for name in UIDS} == set(UIDS.values())
    assert all(len(uid) <= 40 for uid in UIDS.values())  # Grafana's limit
    assert {p.name for p in (ROOT / "dashboards").glob("*.json")} == set(UIDS)


@all_dashboards
def test_no_inputs_and_no_hardcoded_datasource(name):
    d = DASHBOARDS[name]
    text = json.dumps(d)
    assert "__inputs" not in d and "__requires" not in d
    assert "${DS_" not in text and "DS_PROMETHEUS" not in text
    assert "id" not in d  # import creates the dashboard; uid identifies it
    assert 36 <= d["schemaVersion"] <= 41  # Grafana 10.0 .. 11.6 schema
    assert d["annotations"]["list"][0]["builtIn"] == 1  # Grafana 10 expects annotations.list


@all_dashboards
def test_datasource_variable_then_the_four_filter_variables(name):
    variables = DASHBOARDS[name]["templating"]["list"]
    ds = variables[0]
    assert (ds["name"], ds["type"], ds["query"]) == ("datasource", "datasource", "prometheus")
    assert [v["name"] for v in variables[1:]] == list(FILTERS)
    for v in variables[1:]:
        assert v["type"] == "query"
        assert v["datasource"] == DATASOURCE
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*", v["name"]
        assert v["refresh"] == 2  # on time range change: new pods and models appear
    queries = {q.name: q for q in variable_queries(DASHBOARDS[name])}
    assert {n: q.label for n, q in queries.items()} == {n: n for n in FILTERS}
    # Each narrows by the ones before it.
    assert queries["cluster"].selector == "llm_requests_total"
    assert queries["route"].selector == (
        'llm_requests_total{cluster=~"$cluster", namespace=~"$namespace", llm_release=~"$llm_release", pod=~"$pod", model=~"$model"}'
    )


@all_dashboards
def test_every_panel_and_query_reads_the_datasource_variable(name):
    for p in panels(DASHBOARDS[name]):
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE, p["title"]


@all_dashboards
def test_every_panel_has_a_unit_a_description_and_a_unique_title(name):
    titles = [p["title"] for p in panels(DASHBOARDS[name])]
    assert len(titles) == len(set(titles))
    for p in panels(DASHBOARDS[name]):
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
        assert len(p.get("description", "")) >= 60, (
            f"{p['title']}: say what it means and how it is measured"
        )
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


@all_dashboards
def test_every_range_is_rate_interval_and_every_variable_is_defined(name):
    d = DASHBOARDS[name]
    defined = {v["name"] for v in d["templating"]["list"]} | {"__rate_interval"}
    ranges = 0
    for q in panel_queries(d):
        for r in re.findall(r"\[([^\]]*)\]", q.expr):
            assert r == "$__rate_interval", f"{q.where}: [{r}]"
            ranges += 1
        for m in re.finditer(r"\b(rate|irate|increase|[a-z]+_over_time)\(", q.expr):
            assert "[$__rate_interval]" in q.expr[m.end() :], q.where
        used = set(re.findall(r"\$\{?(\w+)", q.expr))
        assert used <= defined, f"{q.where}: {used - defined}"
    if d is OVERVIEW:
        assert ranges >= 5  # the engine's and the process's own series, per pod


def test_raw_metric_selectors_carry_every_filter_variable():
    """Raw sidecar series (the drill-downs to pods, the detail views, the live gauges) take
    every filter variable the series has, and none it lacks (a route filter on a per-model
    histogram would match nothing once a route is picked)."""
    checked = set()
    for q in panel_queries(OVERVIEW):
        for metric, body in re.findall(r"(llm_[a-z_]+)\{([^}]*)\}", q.expr):
            own = aggregates.own_labels(metric)
            for label in FILTERS:
                has = label in own or label not in ("model", "route")
                assert (f'{label}=~"${label}"' in body) == has, (
                    f"{q.where}: {metric} {'lacks' if has else 'has'} the {label} filter"
                )
            checked.add(metric)
    # What the exporter declares, spelled out for a few: per model, per route, neither.
    assert aggregates.own_labels("llm_time_to_first_token_seconds_bucket") >= {"model", "le"}
    assert "route" not in aggregates.own_labels("llm_time_to_first_byte_seconds_bucket")
    assert "model" not in aggregates.own_labels("llm_stream_parse_errors_total")
    assert not {"model", "route"} & aggregates.own_labels("llm_sidecar_overhead_seconds_bucket")
    # The detail views are among them: read raw, when drawn.
    assert {
        "llm_time_to_first_byte_seconds_bucket",
        "llm_request_tokens_bucket",
        "llm_sidecar_overhead_seconds_bucket",
    } <= checked


def test_slo_dashboard_raw_series_are_per_release():
    """Two releases of one model in one namespace (the chart's per-release SLO dashboard
    too): every raw series is filtered by the release, and a sum that drops the pod keeps the
    release apart, as the records do (the capacity row once summed them into one curve)."""
    checked = 0
    for q in panel_queries(SLO):
        for metric, body in re.findall(r"(llm_[a-z_]+)\{([^}]*)\}", q.expr):
            assert 'llm_release=~"$llm_release"' in body, (
                f"{q.where}: {metric} lacks the llm_release filter"
            )
            checked += 1
        for by in re.findall(r"by \(([^)]*)\)", q.expr):
            labels = {label.strip() for label in by.split(",")}
            assert "pod" in labels or "llm_release" in labels, (
                f"{q.where}: sum by ({by}) mixes releases"
            )
    assert checked > 10


@all_dashboards
def test_layout_fits_24_columns_without_overlap_and_ids_are_unique(name):
    ps = DASHBOARDS[name]["panels"]
    ids = [p["id"] for p in ps]
    assert ids == list(range(1, len(ps) + 1))
    cells: dict[tuple[int, int], str] = {}
    for p in ps:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_heatmaps_read_bucket_rates_by_le():
    heatmaps = [p for p in panels(OVERVIEW) if p["type"] == "heatmap"]
    assert len(heatmaps) == 7
    for p in heatmaps:
        (t,) = p["targets"]
        assert t["format"] == "heatmap" and t["legendFormat"] == "{{le}}", p["title"]
        # The recorded bucket rates, or a detail view's raw buckets when drawn.
        assert re.match(
            r"sum by \(le\) \((llm:\w+_bucket:rate5m\{|rate\((llm_\w+_bucket)\{)", t["expr"]
        ), p["title"]
        assert p["options"]["calculate"] is False
        assert p["options"]["yAxis"]["unit"] == p["fieldConfig"]["defaults"]["unit"]


def test_vllm_row_open_before_the_collapsed_ollama_row_and_ttft_quantiles_by_model():
    from sidecar.tools.dashboards.engine import ROW_TITLE

    rows = [p for p in OVERVIEW["panels"] if p["type"] == "row"]
    titles = [r["title"] for r in rows]
    vllm, ollama = (
        rows[titles.index(ROW_TITLE)],
        rows[titles.index("Engine timings (Ollama, llama.cpp)")],
    )
    assert not vllm["collapsed"] and ollama["collapsed"] and ollama["panels"]
    assert titles.index(ROW_TITLE) < titles.index("Engine timings (Ollama, llama.cpp)")
    assert titles.index(ROW_TITLE) <= 6, titles  # high on the board, not at the bottom
    (ttft,) = [
        p
        for p in panels(OVERVIEW)
        if p["title"].startswith("TTFT") and p["title"].endswith("by model")
    ]
    assert [t["expr"].split(",")[0] for t in ttft["targets"]] == [
        "histogram_quantile(0.5",
        "histogram_quantile(0.95",
        "histogram_quantile(0.99",
    ]


def test_overview_covers_what_the_issue_lists():
    titles = " | ".join(p["title"] for p in panels(OVERVIEW))
    for needle in (
        "Requests by outcome and code", "Error and cancellation ratios", "In-flight requests",
        "Time to first token (TTFT): p50 / p90 / p99", "Time to first token (TTFT): distribution",
        "Time to first answer token: p50", "Inter-token latency (ITL): p50", "Time per output token (TPOT): p50",
        "End-to-end duration of successful requests: p50", "Decode speed per request", "Token throughput by type",
        "Prompt length distribution", "Output length distribution", "by model", "by pod",
        "Engine-reported phases", "Goodput",
    ):  # fmt: skip
        assert needle in titles, needle
    for metric in ("llm_time_to_first_token_seconds", "llm_time_to_first_answer_token_seconds",
                   "llm_inter_token_latency_seconds", "llm_time_per_output_token_seconds",
                   "llm_request_duration_seconds"):  # fmt: skip
        quantiles = [
            q
            for q in panel_queries(OVERVIEW)
            if q.expr.startswith("histogram_quantile(")
            and f"(llm:{metric.removeprefix('llm_')}_bucket:rate5m{{" in q.expr
        ]
        assert {q.expr.split(",")[0] for q in quantiles} >= {
            "histogram_quantile(0.5", "histogram_quantile(0.9", "histogram_quantile(0.99",
        }, metric  # fmt: skip


# ------------------------------------------------------------------ SLO agreement


def alert_rules() -> list[dict]:
    return [r for g in RULES["groups"] for r in g["rules"] if "alert" in r]


def test_every_objective_has_its_row_and_panels():
    rows = [p["title"] for p in SLO["panels"] if p["type"] == "row"]
    names = [o.name for o in SPEC.objectives]
    assert names == ["availability", "ttft", "tpot", "e2e"]
    assert [r.split(":")[0] for r in rows[1:]] == [f"SLO {n}" for n in names] + [
        "Capacity"
    ]  # capacity last
    for n in names:
        for suffix in ("SLI over 30d", "error budget remaining", "budget runs out in", "SLI vs target",
                       "bad-event share by pod and route"):  # fmt: skip
            by_title(SLO, f"{n}: {suffix}")
    slos_in_rules = {r["labels"]["slo"] for r in alert_rules() if "slo" in r["labels"]}
    assert slos_in_rules == set(names)


def test_burn_rate_thresholds_are_the_alert_rules_factors():
    """Parsed from the committed rules file, not recomputed: the dashboard draws what fires."""
    fires_above: dict[tuple[str, str, str], float] = {}
    for r in alert_rules():
        labels = r["labels"]
        if "long_window" not in labels:
            continue
        m = re.fullmatch(
            r"llm:burn_rate:ratio_rate(\w+)\{[^}]*\} > ([\d.]+) and llm:burn_rate:ratio_rate(\w+)\{[^}]*\} > ([\d.]+)",
            r["expr"],
        )
        assert (
            m and m[1] == labels["long_window"] and m[3] == labels["short_window"] and m[2] == m[4]
        ), r["expr"]
        fires_above[(labels["slo"], m[1], m[3])] = float(m[2])
    checked = 0
    for o in SPEC.objectives:
        for arm in WORKBOOK_WINDOWS:
            factor = fires_above[(o.name, arm.long_name, arm.short_name)]
            assert factor == float(format_number(burn_rate_factor(arm, SPEC.period)))
            windows = f"{arm.long_name} / {arm.short_name}"
            p = by_title(
                SLO,
                f"{o.name}: burn rate {windows} ({arm.severity} above {format_number(factor)}×)",
            )
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert [s["value"] for s in steps] == [None, factor]
            assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "dashed"
            exprs = [t["expr"] for t in p["targets"]]
            assert exprs == [
                f'llm:burn_rate:ratio_rate{arm.long_name}{{{GROUP_FILTERS}, slo="{o.name}"}}',
                f'llm:burn_rate:ratio_rate{arm.short_name}{{{GROUP_FILTERS}, slo="{o.name}"}}',
            ]
            checked += 1
    assert checked == len(fires_above) == len(WORKBOOK_WINDOWS) * len(SPEC.objectives)


slo_module = slo


def spec_with_override():
    """The shipped spec with the example override its comments show (none is shipped active)."""
    data = yaml.safe_load((ROOT / "deploy" / "slo" / "default.yaml").read_text(encoding="utf-8"))
    (ttft,) = [o for o in data["objectives"] if o["name"] == "ttft"]
    ttft["models"] = {
        "meta-llama/Llama-3.1-405B-Instruct": {"threshold_seconds": 5.0, "target": 90}
    }
    return parse_spec(data)


@pytest.mark.parametrize("which", ["shipped", "with-override"])
def test_targets_drawn_are_the_specs_targets_per_scope(which):
    from sidecar.tools.dashboards.render import to_json_dict

    spec, slo = (SPEC, SLO) if which == "shipped" else (spec_with_override(), None)
    if slo is None:
        slo = to_json_dict(slo_module.build(spec))
    for o in spec.objectives:
        scopes = o.scopes()
        p = by_title(slo, f"{o.name}: SLI vs target")
        targets = [t["expr"] for t in p["targets"] if t["expr"].startswith("0 * ")]
        assert len(targets) == len(scopes)
        for expr, scope in zip(targets, scopes, strict=True):
            assert expr.endswith(f" + {scope.target / 100:g}"), expr
            if scope.model is not None:
                assert f'model="{scope.model}"' in expr
            for excluded in scope.excluded:
                assert f'model!="{excluded}"' in expr
        stat = by_title(slo, f"{o.name}: SLI over 30d")
        assert stat["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == o.target / 100
        # The legend names the deployment, model last; an override matches the name's end.
        overrides = {
            ov["matcher"]["options"]: ov["properties"][0]["value"]["steps"][1]["value"]
            for ov in stat["fieldConfig"]["overrides"]
        }
        assert all(ov["matcher"]["id"] == "byRegexp" for ov in stat["fieldConfig"]["overrides"])
        assert overrides == {
            f"^(.* )?{re.escape(s.model)}$": s.target / 100
            for s in scopes[1:]
            if s.target != o.target
        }
        for pattern in overrides:
            assert re.match(pattern, f"eu-1 prod {scopes[1].model}") and not re.match(
                pattern, "eu-1 prod other"
            )
    assert any(o.models for o in spec.objectives) == (which == "with-override")


def test_budget_panels_use_the_period_and_the_rules_records():
    period = SPEC.period
    records = {r["record"] for g in RULES["groups"] for r in g["rules"] if "record" in r}
    for o in SPEC.objectives:
        exhaustion = by_title(SLO, f"{o.name}: budget runs out in")
        for t in exhaustion["targets"]:
            assert f"* {period} / " in t["expr"] and t["expr"].endswith(f", {period})")
        mapped = {
            m["options"]["result"]["text"]
            for m in exhaustion["fieldConfig"]["defaults"]["mappings"]
        }
        assert mapped == {"no events", "spent", f"not within {SPEC.period_name}"}
    used = set()
    for q in panel_queries(SLO):
        used |= set(re.findall(r"llm:[a-z0-9_:]+", q.expr))
    assert used <= records
    assert {
        c.ERROR_BUDGET_REMAINING,
        c.GOODPUT_RATIO,
        c.GOODPUT_RATE,
        c.sli_error_record(SPEC.period),
    } <= used


def test_alert_panels_name_exactly_the_rules_alerts():
    in_rules = {r["alert"] for r in alert_rules()}
    assert set(slo.alert_names(SPEC)) == in_rules
    alerts_exprs = [q.expr for q in panel_queries(SLO) if "ALERTS{" in q.expr]
    assert len(alerts_exprs) == len(slo.SEVERITIES) + 1  # a count per severity, and the table
    for expr in alerts_exprs:
        (names,) = re.findall(r'alertname=~"([^"]+)"', expr)
        assert set(names.split("|")) == in_rules
    severities = defaultdict(set)
    for r in alert_rules():
        severities[r["labels"]["severity"]].add(r["alert"])
    assert set(severities) == set(slo.SEVERITIES)


# ------------------------------------------------------------------ provisioning example


def test_provisioning_examples_are_well_formed():
    base = ROOT / "deploy" / "grafana" / "provisioning"
    ds = yaml.safe_load((base / "datasources" / "prometheus.yaml").read_text(encoding="utf-8"))
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert (
        source["type"] == "prometheus"
        and source["access"] == "proxy"
        and source["url"].startswith("http")
    )
    assert source["jsonData"]["timeInterval"]  # what $__rate_interval is computed from
    dash = yaml.safe_load((base / "dashboards" / "llm-sidecar.yaml").read_text(encoding="utf-8"))
    assert dash["apiVersion"] == 1
    (provider,) = dash["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert sorted(
        p.relative_to(ROOT / "deploy" / "grafana").as_posix()
        for p in (ROOT / "deploy" / "grafana").rglob("*.yaml")
    ) == [
        "provisioning/dashboards/llm-sidecar.yaml",
        "provisioning/datasources/prometheus.yaml",
    ]
