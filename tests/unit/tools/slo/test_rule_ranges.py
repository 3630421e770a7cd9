"""No rule reads a raw series over more than a short window.

Every window above the SLO's base window (30m, 1h, 2h, 6h, as 1d, 3d and the period) is
summed from the recorded base-window event rates, the capacity group's hour from its
recorded 5m band rates, and the dashboards' records read 2m: a rule that read raw buckets
over hours would read every pod's every bucket for that long at every evaluation. Checked on
the committed rules, the spec with every alert, and the chart's per-release rules; and the
check sees the raw form (``long_windows="raw"``) that it forbids.
"""

from __future__ import annotations

import re

import pytest

from sidecar.tools.slo import aggregates, capacity, generate, load_spec
from sidecar.tools.slo.helm import release_rules
from sidecar.tools.slo.windows import parse_duration
from tests.support.rules import SPEC, every_alert_spec

SHORT = 5 * 60
"""The longest raw range any rule may read: the SLO's base window, the band rates' window."""
_RANGE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\[(\w+)\]")


def raw_ranges(ruleset) -> list[tuple[str, str, str, int]]:
    """(group, rule, metric, seconds) for every range over a raw (not ``llm:``) series."""
    out = []
    for group in ruleset.groups:
        for rule in group.rules:
            for metric, span in _RANGE.findall(rule.expr):
                if not metric.startswith("llm:"):
                    out.append(
                        (group.name, rule.record or rule.alert, metric, parse_duration(span))
                    )
    return out


def ruleset(which: str):
    if which == "every-alert":
        return generate(every_alert_spec())
    spec = load_spec(str(SPEC))
    return generate(spec) if which == "default" else release_rules(spec, "team-b", "b-llm-sidecar")


@pytest.mark.parametrize("which", ["default", "every-alert", "release"])
def test_no_rule_reads_a_raw_range_longer_than_the_short_window(which):
    rules = ruleset(which)
    ranges = raw_ranges(rules)
    assert ranges  # the base windows and the band rates do read raw series
    too_long = [r for r in ranges if r[3] > SHORT]
    assert not too_long, too_long
    groups = {g.name for g in rules.groups}
    assert {capacity.CAPACITY_GROUP, aggregates.GROUP} <= groups
    # The dashboards' records read their own short window.
    dashboards = {r[3] for r in ranges if r[0] == aggregates.GROUP}
    assert dashboards == {aggregates.WINDOW}


def test_every_slo_window_above_the_base_reads_the_recorded_rates():
    ruleset = generate(load_spec(str(SPEC)))
    ratios = [
        r
        for g in ruleset.groups
        for r in g.rules
        if r.record and r.record.startswith("llm:sli_error:ratio_rate")
    ]
    windows = {r.record.removeprefix("llm:sli_error:ratio_rate") for r in ratios}
    assert {"5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d"} <= windows
    for r in ratios:
        if r.record.endswith("rate5m"):
            assert r.expr.startswith("llm:sli_bad_events:rate5m{"), r.expr
        else:
            assert r.expr.startswith("sum_over_time(llm:sli_bad_events:rate5m{"), r.expr


def test_the_check_sees_raw_long_windows():
    raw = generate(load_spec(str(SPEC)), long_windows="raw")
    long = {(m, s) for _, _, m, s in raw_ranges(raw) if s > SHORT}
    assert ("llm_requests_total", 3600) in long
    assert any(m.endswith("_bucket") and s == 6 * 3600 for m, s in long)
