"""Every dashboard query is valid PromQL once Grafana has substituted its variables.

The parser is Prometheus' own: each query (variables at All, `$__rate_interval` = 1m) and
each variable's label_values() selector becomes a recording rule in a temporary rules file,
and `promtool check rules` parses them all. A deliberately broken query shows the check would
catch one. Skipped without promtool locally; fails under CI=true (Debian's `prometheus`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from sidecar.tools.dashboards.inspect import ALL_VALUES, panel_queries, substitute, variable_queries
from tests.support.paths import ROOT
from tests.support.tools import require_tool

DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))


def all_queries() -> list[tuple[str, str]]:
    out = []
    for path in DASHBOARDS:
        d = json.loads(path.read_text(encoding="utf-8"))
        out += [(q.where, substitute(q.expr)) for q in panel_queries(d)]
        out += [(v.where, substitute(v.selector)) for v in variable_queries(d) if v.selector]
    return out


def promtool_check(tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess:
    rules = [{"record": f"dashboard_query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}), encoding="utf-8"
    )
    return subprocess.run(
        [require_tool("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_substitution_leaves_no_variable():
    queries = all_queries()
    assert len(queries) > 130
    for where, expr in queries:
        assert "$" not in expr, where
    assert ALL_VALUES["__rate_interval"] == "1m"


def test_every_query_parses_with_promtool(tmp_path):
    queries = all_queries()
    result = promtool_check(tmp_path, [e for _, e in queries])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


@pytest.mark.parametrize(
    "broken",
    [
        "sum by (le (rate(llm_requests_total[1m]))",  # unbalanced
        "rate(llm_requests_total[$__rate_interval])",  # a variable left in
        'histogram_quantile(0.9, rate(llm_x_bucket{model=~".*"}))',  # rate without a range
    ],
)
def test_the_check_rejects_broken_promql(tmp_path, broken):
    result = promtool_check(tmp_path, ["sum(up)", broken])
    assert result.returncode != 0, result.stdout
