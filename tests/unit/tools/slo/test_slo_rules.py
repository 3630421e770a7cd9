"""Rule generation, rendering and the `slo render` command, without Prometheus."""

from __future__ import annotations

import re

import pytest
import yaml
from prometheus_client.utils import floatToGoString

from sidecar.cli import main
from sidecar.tools.slo import (
    conventions as c,
    generate as slo_generate,  # the SLO rules and the capacity group
)
from sidecar.tools.slo.cli import render_command
from sidecar.tools.slo.promql import promql_string
from sidecar.tools.slo.render import HEADER, render_rules
from sidecar.tools.slo.rules import (
    ERROR_CAUSES,
    REQUESTS_BY_OUTCOME,
    generate,
    sli_error_expr,
)
from sidecar.tools.slo.spec import load_spec, parse_spec
from tests.support.paths import ROOT

DEFAULT_SPEC = ROOT / "deploy" / "slo" / "default.yaml"
RECORD_NAME = re.compile(r"^llm:[a-z_]+:[a-z0-9_]+$")


def ruleset(**top):
    data = {
        "version": 1,
        "objectives": [
            {"name": "availability", "sli": "availability", "target": 99.5},
            {
                "name": "ttft",
                "sli": "ttft",
                "target": 95,
                "threshold_seconds": 2.0,
                "models": {"big": {"threshold_seconds": 5.0}},
            },
            {"name": "itl", "sli": "itl", "target": 99, "threshold_seconds": 0.05},
        ],
        **top,
    }
    return generate(parse_spec(data))


def alerts(rs, name=None):
    return [r for r in rs.rules() if r.alert and (name is None or r.alert == name)]


def test_groups_aggregates_then_one_per_objective_then_requests_and_health():
    rs = generate(load_spec(str(DEFAULT_SPEC)))
    assert [g.name for g in rs.groups] == [
        "llm-sidecar-aggregates",
        "llm-sidecar-slo-availability",
        "llm-sidecar-slo-ttft",
        "llm-sidecar-slo-tpot",
        "llm-sidecar-slo-e2e",
        "llm-sidecar-requests",
        "llm-sidecar-health",
    ]
    for group in rs.groups[1:5]:
        kinds = ["alert" if r.alert else "record" for r in group.rules]
        # An availability group reads the requests once first (its scopes' events sum it).
        if group.rules[0].record == REQUESTS_BY_OUTCOME:
            kinds = kinds[1:]
        # Per scope, records come before the alerts that read them: 2 event rates, 8 error
        # ratios (7 windows and the period), 7 burn rates, the remaining budget; 4 alerts.
        assert kinds[:18] == ["record"] * 18 and kinds[18:22] == ["alert"] * 4


def test_record_names_follow_the_convention_and_carry_slo_label():
    rs = ruleset()
    records = {r.record for r in rs.rules() if r.record}
    assert all(RECORD_NAME.match(name) for name in records), records
    windows = ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]
    assert {f"llm:sli_error:ratio_rate{w}" for w in [*windows, "30d"]} <= records
    assert {f"llm:burn_rate:ratio_rate{w}" for w in windows} <= records
    assert {
        "llm:error_budget_remaining:ratio",
        "llm:goodput:rate5m",
        "llm:goodput:ratio_rate5m",
    } <= records
    for g in rs.groups:
        for r in g.rules:
            if r.record and g.name.startswith("llm-sidecar-slo-"):
                assert r.labels["slo"] in {"availability", "ttft", "itl"}


def test_each_scope_gets_the_four_workbook_arms_with_factors_for_30d():
    rs = ruleset()
    ttft = alerts(rs, "LLMTTFTBurnRate")
    assert len(ttft) == 8  # default scope and the "big" override, four arms each
    arms = [
        (a.labels["severity"], a.labels["long_window"], a.labels["short_window"]) for a in ttft[:4]
    ]
    assert arms == [
        ("page", "1h", "5m"),
        ("page", "6h", "30m"),
        ("ticket", "1d", "2h"),
        ("ticket", "3d", "6h"),
    ]
    exprs = [a.expr for a in ttft[:4]]
    assert exprs[0] == (
        'llm:burn_rate:ratio_rate1h{slo="ttft",model!="big"} > 14.4 and llm:burn_rate:ratio_rate5m{slo="ttft",model!="big"} > 14.4'
    )
    assert [re.search(r"> ([\d.]+)$", e).group(1) for e in exprs] == ["14.4", "6", "3", "1"]
    override = ttft[4]
    assert override.labels["model"] == "big"
    assert 'model="big"' in override.expr and "model!=" not in override.expr


def test_28d_period_changes_factors_and_period_window():
    rs = ruleset(period="28d")
    factors = [
        re.search(r"> ([\d.]+)$", a.expr).group(1) for a in alerts(rs, "LLMAvailabilityBurnRate")
    ]
    assert factors == ["13.44", "5.6", "2.8", "0.933333"]
    records = {r.record for r in rs.rules() if r.record}
    assert "llm:sli_error:ratio_rate28d" in records and "llm:sli_error:ratio_rate30d" not in records
    remaining = next(r for r in rs.rules() if r.record == c.ERROR_BUDGET_REMAINING)
    assert "llm:sli_error:ratio_rate28d" in remaining.expr
    assert "over 28d" in alerts(rs)[0].annotations["description"]
    assert 'printf "2419200 / %g" $value' in alerts(rs)[0].annotations["description"]


def test_availability_counts_server_errors_over_non_cancelled_requests():
    scope = (
        parse_spec(
            {"version": 1, "objectives": [{"name": "a", "sli": "availability", "target": 99}]}
        )
        .objectives[0]
        .scopes()[0]
    )
    expr = sli_error_expr(scope, 3600, ("model",))
    assert expr == (
        '(sum by (model) (rate(llm_requests_total{outcome="error"}[1h])) '
        'or 0 * sum by (model) (rate(llm_requests_total{outcome!="cancelled"}[1h]))) '
        '/ sum by (model) (rate(llm_requests_total{outcome!="cancelled"}[1h]))'
    )
    # The default grouping: one SLO per deployment.
    assert sli_error_expr(scope, 3600).startswith(
        '(sum by (cluster, namespace, model) (rate(llm_requests_total{outcome="error"}[1h]))'
    )


@pytest.mark.parametrize(
    "sli, threshold, metric, extra",
    [
        ("ttft", 2.0, "llm_time_to_first_token_seconds", ""),
        ("tpot", 0.1, "llm_time_per_output_token_seconds", ""),
        ("itl", 0.025, "llm_inter_token_latency_seconds", ""),
        ("e2e", 60.0, "llm_request_duration_seconds", 'outcome="ok",'),
    ],
)
def test_latency_sli_reads_the_bucket_at_the_threshold(sli, threshold, metric, extra):
    scope = (
        parse_spec(
            {
                "version": 1,
                "objectives": [
                    {"name": sli, "sli": sli, "target": 99, "threshold_seconds": threshold}
                ],
            }
        )
        .objectives[0]
        .scopes()[0]
    )
    expr = sli_error_expr(scope, 300, ("model",))
    le = floatToGoString(threshold)  # what prometheus_client writes: "2.0", "0.1", "0.025"
    count = (
        f"sum by (model) (rate({metric}_count{{{extra.rstrip(',')}}}[5m]))"
        if extra
        else f"sum by (model) (rate({metric}_count[5m]))"
    )
    good = f'sum by (model) (rate({metric}_bucket{{{extra}le="{le}"}}[5m]))'
    assert expr == f"({count} - {good}) / {count}"


def test_override_scope_reads_its_own_threshold_and_budget():
    rs = ruleset()
    ttft = next(g for g in rs.groups if g.name == "llm-sidecar-slo-ttft")
    events_5m = [r for r in ttft.rules if r.record == "llm:sli_bad_events:rate5m"]
    assert 'model!="big",le="2.0"' in events_5m[0].expr
    assert 'model="big",le="5.0"' in events_5m[1].expr
    burn_1h = [r for r in ttft.rules if r.record == "llm:burn_rate:ratio_rate1h"]
    assert [r.expr for r in burn_1h] == [
        'llm:sli_error:ratio_rate1h{slo="ttft",model!="big"} / 0.05',
        'llm:sli_error:ratio_rate1h{slo="ttft",model="big"} / 0.05',
    ]


def test_health_alerts_use_the_configured_job_and_durations():
    rs = ruleset(
        alerts={
            "target_down": {"job": "llm-prod", "for": "10m"},
            "no_traffic": {"for": "1h", "severity": "page"},
        }
    )
    down = alerts(rs, c.ALERT_TARGET_DOWN)[0]
    assert down.expr == 'up{job="llm-prod"} == 0 or absent(up{job="llm-prod"})'
    assert down.for_ == 600
    quiet = alerts(rs, c.ALERT_NO_TRAFFIC)[0]
    # The dashboards group's record of the requests' rate, which the same rules write.
    assert quiet.expr == "absent(llm:requests:rate5m) or sum(llm:requests:rate5m) == 0"
    from sidecar.tools.slo import aggregates

    assert aggregates.find("llm_requests_total").record == "llm:requests:rate5m"
    assert aggregates.find("llm_requests_total").how == "rate"
    assert (quiet.for_, quiet.labels["severity"]) == (3600, "page")


def test_every_alert_has_severity_summary_description_and_a_runbook():
    runbooks = (ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8")
    anchors = {c.runbook_anchor(h) for h in re.findall(r"^## Runbook: (\S+)$", runbooks, re.M)}
    rs = generate(load_spec(str(DEFAULT_SPEC)))
    rs_itl = ruleset()
    for a in [*alerts(rs), *alerts(rs_itl)]:
        assert a.labels["severity"] in ("page", "ticket", "info")
        assert a.annotations["summary"] and a.annotations["description"]
        url, _, anchor = a.annotations["runbook_url"].partition("#")
        assert url == "docs/runbooks.md"  # the file in the repository (test_runbooks.py)
        assert anchor in anchors, (a.alert, anchor)
        if a.alert in {
            cause.alert for cause in ERROR_CAUSES
        }:  # by cause, not burn rate: routed on error_type
            assert "{{ $labels.error_type }}" in a.annotations["summary"] and "error_type" in a.expr
        elif a.alert not in (c.ALERT_TARGET_DOWN, c.ALERT_NO_TRAFFIC, c.ALERT_HISTORY_SHORT):
            d = a.annotations["description"]
            assert {"slo", "long_window", "short_window"} <= a.labels.keys()
            assert '{{ printf "%.1f" $value }}x' in d  # the burn rate
            assert "humanizeDuration" in d and "error_budget_remaining" in d  # time to exhaustion


def test_alert_names_from_objective_names():
    assert c.alert_name("ttft") == "LLMTTFTBurnRate"
    assert c.alert_name("availability") == "LLMAvailabilityBurnRate"
    assert c.alert_name("ttft-long_context") == "LLMTTFTLongContextBurnRate"
    assert c.runbook_anchor("LLMTTFTBurnRate") == "runbook-llmttftburnrate"
    # A custom objective links to the runbook of its SLI kind.
    rs = generate(
        parse_spec(
            {
                "version": 1,
                "objectives": [
                    {"name": "ttft-tail", "sli": "ttft", "target": 99, "threshold_seconds": 10.0}
                ],
            }
        )
    )
    a = alerts(rs, "LLMTTFTTailBurnRate")[0]
    assert a.annotations["runbook_url"].endswith("#runbook-llmttftburnrate")


def test_model_names_are_escaped_in_promql():
    assert promql_string('a"b\\c') == '"a\\"b\\\\c"'
    rs = generate(
        parse_spec(
            {
                "version": 1,
                "objectives": [
                    {
                        "name": "a",
                        "sli": "availability",
                        "target": 99,
                        "models": {'we"ird': {"target": 90}},
                    }
                ],
            }
        )
    )
    events = next(r for r in rs.rules() if r.record == "llm:sli_events:rate5m")
    assert 'model!="we\\"ird"' in events.expr


# --------------------------------------------------------------------- rendering


def test_render_has_header_and_plain_groups_yaml():
    text = render_rules(generate(load_spec(str(DEFAULT_SPEC))))
    assert text.startswith(HEADER + "\n")
    assert HEADER == "# Code generated by llm-sidecar slo render; DO NOT EDIT."
    doc = yaml.safe_load(text)
    assert list(doc) == ["groups"]
    assert doc["groups"][0]["name"] == "llm-sidecar-aggregates"
    rule = doc["groups"][1]["rules"][0]
    assert list(rule) == ["record", "expr", "labels"]
    alert = next(r for r in doc["groups"][1]["rules"] if "alert" in r)
    assert list(alert) == ["alert", "expr", "labels", "annotations"]
    assert (
        "# Burn-rate alerts (SRE workbook): page 14.4x over 1h and 5m, page 6x over 6h and 30m,"
        in text
    )


def test_render_is_deterministic():
    spec = load_spec(str(DEFAULT_SPEC))
    assert render_rules(generate(spec)) == render_rules(generate(load_spec(str(DEFAULT_SPEC))))


# --------------------------------------------------------------------- the command


def test_render_command_writes_the_file(tmp_path):
    out = tmp_path / "rules.yaml"
    assert render_command(str(DEFAULT_SPEC), str(out)) == 0
    assert out.read_text() == render_rules(slo_generate(load_spec(str(DEFAULT_SPEC))))
    assert out.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["rules.yaml"]


def test_render_command_to_stdout(capsys):
    assert main(["slo", "render", str(DEFAULT_SPEC)]) == 0
    assert capsys.readouterr().out.startswith(HEADER)


def test_invalid_spec_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nobjectives:\n  - {name: ttft, sli: ttft, target: 95, threshold_seconds: 1.7}\n"
    )
    out = tmp_path / "rules.yaml"
    assert main(["slo", "render", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"llm-sidecar: SLO spec {bad}: objectives[0] (ttft): threshold_seconds 1.7 is not a bucket bound"
    )
    assert not out.exists()


def test_empty_spec_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("version: 1\nobjectives: []\n")
    assert render_command(str(empty), None) == 2
    assert "nothing to render" in capsys.readouterr().err


def test_unwritable_output_exits_2(tmp_path, capsys):
    assert render_command(str(DEFAULT_SPEC), str(tmp_path / "no-such-dir" / "rules.yaml")) == 2
    assert "cannot write" in capsys.readouterr().err


# --------------------------------------------------------------------- Alertmanager example


def test_alertmanager_example_routes_every_severity_the_rules_use():
    am = yaml.safe_load(
        (ROOT / "deploy" / "alertmanager" / "alertmanager.yaml").read_text(encoding="utf-8")
    )
    receivers = {r["name"] for r in am["receivers"]}
    routes = {m: r["receiver"] for r in am["route"]["routes"] for m in r["matchers"]}
    # Each error cause's types to its own receiver, before the severity routes.
    by_cause = {f'error_type=~"{"|".join(cause.error_types)}"': cause for cause in ERROR_CAUSES}
    assert [m for r in am["route"]["routes"][: len(by_cause)] for m in r["matchers"]] == list(
        by_cause
    )
    assert {routes.pop(m) for m in by_cause} == {"platform-tickets", "model-serving-tickets"}
    assert routes == {
        'severity="page"': "pager",
        'severity="ticket"': "tickets",
        'severity="info"': "tickets",
    }
    assert {r["receiver"] for r in am["route"]["routes"]} | {am["route"]["receiver"]} <= receivers
    rs = generate(load_spec(str(DEFAULT_SPEC)))
    assert {"slo", *rs.spec.grouping} <= set(am["route"]["group_by"])
    assert set(am["inhibit_rules"][0]["equal"]) == {"alertname", "slo", *rs.spec.grouping}
    assert {a.labels["severity"] for a in alerts(rs)} == {"page", "ticket", "info"}
    names = {a.alert for a in alerts(rs)}
    for rule in am["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            label, _, value = matcher.partition("=")
            if label == "alertname":
                assert value.strip('"') in names


def test_prompt_class_objective_reads_only_its_class():
    rs = generate(parse_spec({"version": 1, "objectives": [
        {"name": "ttft-long", "sli": "ttft", "target": 90, "threshold_seconds": 10.0, "prompt_class": "gt8192"},
    ]}))  # fmt: skip
    bad = next(r for r in rs.rules() if r.record == "llm:sli_bad_events:rate5m")
    events = next(r for r in rs.rules() if r.record == "llm:sli_events:rate5m")
    assert 'llm_time_to_first_token_seconds_bucket{prompt_class="gt8192",le="10.0"}' in bad.expr
    assert 'llm_time_to_first_token_seconds_count{prompt_class="gt8192"}' in events.expr
    a = alerts(rs)[0]
    assert (
        "time to first token (prompt class gt8192) <= 10s for 90%" in a.annotations["description"]
    )


def test_alerts_carry_the_grouping_labels_through_their_expression():
    """The burn-rate alert compares records that are summed by the grouping, so each firing
    series (and so each alert) has the grouping labels; its text names the deployment."""
    rs = generate(parse_spec({"version": 1, "grouping": ["cluster", "namespace", "model"], "objectives": [
        {"name": "availability", "sli": "availability", "target": 99.5},
    ]}))  # fmt: skip
    events = next(r for r in rs.rules() if r.record == "llm:sli_events:rate5m")
    assert events.expr.startswith(f"sum by (cluster, namespace, model) ({REQUESTS_BY_OUTCOME}{{")
    page = alerts(rs)[0]
    assert page.annotations["summary"].startswith(
        "{{ with $labels.cluster }}{{ . }}/{{ end }}{{ with $labels.namespace }}{{ . }}/{{ end }}{{ $labels.model }}: "
    )
    assert (
        'slo=%q,cluster=%q,namespace=%q,model=%q}" "availability" (index $labels "cluster") '
        '(index $labels "namespace") (index $labels "model")' in (page.annotations["description"])
    )
