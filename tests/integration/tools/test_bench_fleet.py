"""The fleet benchmark, tiny, end to end: the sidecar recorded under the mix, three fake pods
serving its page, a real Prometheus scraping them with the repo's rules, every dashboard's
queries run against it; then the same in VictoriaMetrics + vmalert where installed.

Asserts that every figure is there and sane (never a timing or memory threshold, so a busy
machine cannot fail it); skipped without Prometheus locally, failing under CI=true. The pure
parts (the replayed page's counters, Grafana's expansion of a dashboard's variables) are
checked on their own below.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from bench.fleet_dashboards import dashboard_queries
from bench.fleet_pods import Replay, parse_page
from tests.support.paths import ROOT
from tests.support.skips import IN_CI
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

UNEXPANDED = re.compile(r"\$\{?[a-zA-Z_]|\[\[\w+\]\]")


def test_quick_fleet_benchmark_reports_every_figure(tmp_path):
    require_tool("prometheus")
    out = tmp_path / "fleet.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.fleet", "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())

    page = report["page"]
    assert page["series"] > 100
    assert 0 < page["bucket_series"] < page["series"]
    assert page["bucket_share"] == pytest.approx(page["bucket_series"] / page["series"], abs=1e-3)
    assert 0 <= page["never_moved"] < page["series"]
    assert page["buckets_without_own_observation"] <= page["bucket_series"]
    assert sum(page["families"].values()) == page["series"]
    assert "llm_requests_total" in page["families"]
    assert sum(report["recording"]["requests"].values()) > 0
    # The sidecar ran with the chart's settings (its SLO thresholds among them).
    assert "LLM_SIDECAR_SLO_TTFT_SECONDS" in report["recording"]["config"]["sidecar_env"]

    (fleet,) = report["fleets"]
    assert fleet["pods"] == 3 and fleet["targets_up"] == 3
    # Three pods' pages are in the head, beside what the rules recorded.
    assert fleet["head_series"] >= 3 * page["series"]
    assert fleet["rss_mb"] > 0 and fleet["rss_empty_mb"] > 0
    assert fleet["rss_mb_per_pod"] == pytest.approx(
        (fleet["rss_mb"] - fleet["rss_empty_mb"]) / 3,
        abs=0.05,  # both rounded to 0.1 MB
    )

    rules = sorted((ROOT / "deploy" / "prometheus").glob("*.yaml"))
    groups = {g["name"] for r in rules for g in yaml.safe_load(r.read_text())["groups"]}
    assert set(fleet["rule_groups"]) == groups
    for name, g in fleet["rule_groups"].items():
        assert g["seen"] >= 1 and 0 < g["last"] <= g["max"], (name, g)
        assert 0 < g["median"] <= g["max"], (name, g)
        assert g["samples"] >= 0
    assert fleet["rule_groups_samples"] > 0  # the rules read the pods' series
    assert fleet["rule_groups_seconds_median"] == pytest.approx(
        sum(g["median"] for g in fleet["rule_groups"].values()), abs=1e-3
    )

    dashboards = {p.name for p in (ROOT / "dashboards").glob("*.json")}
    assert set(fleet["dashboards"]) == dashboards
    for name, d in fleet["dashboards"].items():
        assert d["queries"] == len(d["results"]) > 0
        assert d["samples"] == sum(r["samples"] for r in d["results"]) > 0, name
        for r in d["results"]:
            assert r["samples"] is not None, r  # Prometheus answered stats=all
            assert not UNEXPANDED.search(r["expr"]), r["expr"]

    # VictoriaMetrics + vmalert, fed the same pods, when installed (CI installs them).
    installed = shutil.which("victoria-metrics") and shutil.which("vmalert")
    if IN_CI:
        assert installed, "CI installs victoria-metrics (scripts/system-deps.sh)"
    if not installed:
        assert report["victoria_metrics"] == []
        return
    (vm,) = report["victoria_metrics"]
    assert vm["pods"] == 3 and vm["rss_mb"] > 0 and vm["rss_empty_mb"] > 0
    assert vm["series_created"] >= 3 * page["series"]
    assert set(vm["rule_groups"]) == groups
    for name, g in vm["rule_groups"].items():
        assert g["seen"] >= 1 and 0 < g["last"] <= g["max"], (name, g)
    assert set(vm["dashboards"]) == dashboards
    for name, d in vm["dashboards"].items():
        assert d["queries"] == fleet["dashboards"][name]["queries"]
        assert d["errors"] == 0, [r for r in d["results"] if r["error"]]


PAGES = [
    (0.0, "# TYPE c_total counter\nc_total 1.0\n# TYPE h histogram\n"
          'h_bucket{le="1"} 0.0\nh_bucket{le="+Inf"} 1.0\nh_count 1.0\nh_sum 2.0\n# TYPE g gauge\ng 5.0\n'),
    (5.0, "# TYPE c_total counter\nc_total 3.0\n# TYPE h histogram\n"
          'h_bucket{le="1"} 2.0\nh_bucket{le="+Inf"} 4.0\nh_count 4.0\nh_sum 6.0\n# TYPE g gauge\ng 7.0\n'
          "# TYPE late_total counter\nlate_total 2.0\n"),
    (10.0, "# TYPE c_total counter\nc_total 4.0\n# TYPE h histogram\n"
           'h_bucket{le="1"} 2.0\nh_bucket{le="+Inf"} 5.0\nh_count 5.0\nh_sum 9.0\n# TYPE g gauge\ng 6.0\n'
           "# TYPE late_total counter\nlate_total 3.0\n"),
]  # fmt: skip


def test_replayed_pages_keep_counting_and_stay_cumulative():
    """A pod serves the last page's series from the start; every counter only grows, across
    the recording's wrap too, at the recorded rate; buckets stay cumulative; gauges as read."""
    replay = Replay([{"t": t, "text": text} for t, text in PAGES])
    previous: dict[str, float] = {}
    for tenth in range(0, 400):
        k, cycle = replay.at(tenth / 10)
        _, samples = parse_page(replay.render(k, cycle).decode())
        values = {s.key: s.value for s in samples}
        assert set(values) == {"c_total", 'h_bucket{le="1"}', 'h_bucket{le="+Inf"}', "h_count",
                               "h_sum", "g", "late_total"}  # fmt: skip
        assert values['h_bucket{le="1"}'] <= values['h_bucket{le="+Inf"}'] == values["h_count"]
        assert values["g"] in (5.0, 7.0, 6.0)
        for key, value in values.items():
            if key != "g":
                assert value >= previous.get(key, 0.0), (tenth, key)
        previous = values
    # 40 s is four recordings' spans: c_total grew 3 a span.
    assert replay.render(*replay.at(40.0)).startswith(b"# TYPE c_total counter\nc_total 16.0\n")


def test_dashboard_queries_expand_variables_as_grafana_does(tmp_path):
    doc = {
        "templating": {"list": [
            {"name": "datasource", "type": "datasource"},
            {"name": "namespace", "type": "query", "includeAll": True, "multi": True, "allValue": ".*",
             "query": {"query": "label_values(up, namespace)"}},
            {"name": "model", "type": "query", "includeAll": True, "multi": True,
             "query": "label_values(llm_requests_total{namespace=~\"$namespace\"}, model)"},
        ]},
        "panels": [
            {"type": "row", "panels": [{"title": "inner", "targets": [
                {"refId": "A", "expr": 'sum(rate(x{namespace=~"$namespace", model=~"${model}"}[$__rate_interval]))',
                 "range": True},
                {"refId": "B", "expr": "hidden", "hide": True},
            ]}]},
            {"title": "now", "targets": [{"refId": "A", "expr": "count(up)", "instant": True}]},
        ],
    }  # fmt: skip
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    asked = []

    def fetch(selector: str, label: str) -> list[str]:
        asked.append((selector, label))
        return ["a.b", "c"]

    queries = dashboard_queries(path, 300, 15, fetch)
    assert asked == [('llm_requests_total{namespace=~".*"}', "model")]
    assert [(q.panel, q.instant, q.step) for q in queries] == [
        ("inner", False, 15),
        ("now", True, 15),
    ]
    assert queries[0].expr == 'sum(rate(x{namespace=~".*", model=~"(a\\.b|c)"}[60s]))'
    # A 30 s scrape interval: $__rate_interval is 4 of them (Grafana writes seconds).
    assert "[120s]" in dashboard_queries(path, 300, 30, fetch)[0].expr
