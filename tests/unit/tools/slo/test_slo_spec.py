"""The SLO spec: what it accepts, the one line it refuses with, and the burn-rate window table."""

from __future__ import annotations

from fractions import Fraction

import pytest
import yaml

from sidecar.base.buckets import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from sidecar.tools.slo.spec import SpecError, load_spec, parse_spec
from sidecar.tools.slo.windows import (
    WORKBOOK_WINDOWS,
    burn_rate_factor,
    detection_seconds,
    format_duration,
    parse_duration,
)
from tests.support.paths import ROOT

DEFAULT_SPEC = ROOT / "deploy" / "slo" / "default.yaml"
DAY = 86400


def spec(**objective) -> dict:
    base = {"name": "ttft", "sli": "ttft", "target": 95, "threshold_seconds": 2.0}
    base.update(objective)
    return {"version": 1, "objectives": [base]}


def refusal(data) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data, "s.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("s.yaml: ")
    return message


# --------------------------------------------------------------------- the default spec


def test_shipped_default_spec_is_valid_and_covers_every_objective_kind():
    s = load_spec(str(DEFAULT_SPEC))
    assert s.version == 1
    assert s.period == 30 * DAY
    assert {o.sli for o in s.objectives} == {"availability", "ttft", "tpot", "e2e"}
    ttft = next(o for o in s.objectives if o.name == "ttft")
    # No per-model override is shipped active (the spec keeps one as a commented example).
    (default,) = ttft.scopes()
    assert (default.model, default.threshold, default.excluded) == (None, 2.0, ())
    assert default.error_budget == Fraction(1, 20)
    assert all(not o.models for o in s.objectives)
    assert "#   meta-llama/Llama-3.1-405B-Instruct:" in DEFAULT_SPEC.read_text(encoding="utf-8")


def test_default_spec_latency_thresholds_match_the_sidecars_goodput_defaults():
    """The same numbers in both places, so goodput and the SLOs tell one story by default."""
    from sidecar.config import Settings

    s = load_spec(str(DEFAULT_SPEC))
    by_sli = {o.sli: o.threshold_seconds for o in s.objectives}
    defaults = Settings.model_fields
    assert by_sli["ttft"] == defaults["slo_ttft_seconds"].default
    assert by_sli["tpot"] == defaults["slo_tpot_seconds"].default
    assert by_sli["e2e"] == defaults["slo_e2e_seconds"].default


def test_minimal_spec_takes_defaults():
    s = parse_spec(
        {
            "version": 1,
            "objectives": [{"name": "availability", "sli": "availability", "target": 99.9}],
        }
    )
    assert s.period_name == "30d"
    assert s.alerts.target_down.job == "llm-sidecar"
    assert s.alerts.target_down.for_ == 300
    assert s.alerts.no_traffic.severity == "ticket"
    assert s.objectives[0].scopes()[0].error_budget == Fraction(1, 1000)


@pytest.mark.parametrize(
    "sli, buckets",
    [("ttft", TTFT_BUCKETS), ("tpot", ITL_BUCKETS), ("itl", ITL_BUCKETS), ("e2e", E2E_BUCKETS)],
)
def test_every_bucket_bound_is_an_acceptable_threshold(sli, buckets):
    for bound in buckets:
        parse_spec(spec(name=sli, sli=sli, threshold_seconds=bound))


def test_integer_threshold_in_yaml_is_the_same_bound():
    s = parse_spec(
        yaml.safe_load(
            "version: 1\nobjectives: [{name: e2e, sli: e2e, target: 99, threshold_seconds: 60}]"
        )
    )
    assert s.objectives[0].threshold_seconds == 60.0


def test_period_28d():
    data = spec()
    data["period"] = "28d"
    assert parse_spec(data).period == 28 * DAY


# --------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "data, expected",
    [
        (
            spec(threshold_seconds=1.7),
            "objectives[0] (ttft): threshold_seconds 1.7 is not a bucket bound of llm_time_to_first_token_seconds",
        ),
        (
            spec(sli="tpot", name="tpot", threshold_seconds=0.09),
            "threshold_seconds 0.09 is not a bucket bound of llm_time_per_output_token_seconds",
        ),
        (
            spec(models={"big": {"threshold_seconds": 4.0}}),
            "models.big: threshold_seconds 4 is not a bucket bound of llm_time_to_first_token_seconds",
        ),
        (spec(threshold_seconds=None), "a ttft objective needs threshold_seconds"),
        (
            {
                "version": 1,
                "objectives": [
                    {"name": "a", "sli": "availability", "target": 99, "threshold_seconds": 1.0}
                ],
            },
            "availability has no threshold_seconds",
        ),
        ({"objectives": []}, "version is required (write `version: 1` at the top)"),
        ({**spec(), "version": 2}, "unsupported spec version 2; this llm-sidecar reads version 1"),
        (
            {"version": 1, "objectives": []},
            "objectives: no objectives: there would be nothing to render",
        ),
        ({"version": 1}, "objectives: is required"),
        (spec(target=0.995), "target is a percentage of good events"),
        (spec(target=100), "target is a percentage of good events"),
        (spec(treshold_seconds=2.0), "objectives[0] (ttft).treshold_seconds: unknown key"),
        (spec(sli="ttfb"), "unknown SLI 'ttfb'; choose one of availability, ttft, tpot, itl, e2e"),
        (spec(name="TTFT"), "'TTFT' must be lower case letters, digits, - or _"),
        (spec(models={"big": {}}), "an override sets target, threshold_seconds or both"),
        (spec(models={"": {"target": 90}}), "models: a model name is empty"),
        (
            {**spec(), "period": "2d"},
            "period must be whole days and longer than the 3d alert window",
        ),
        ({**spec(), "period": 30}, "period: write a duration such as 5m, 6h or 30d"),
        ({**spec(), "period": "a month"}, "is not a duration"),
        ({**spec(), "alerts": {"target_down": {"job": ""}}}, "alerts.target_down.job"),
        ({**spec(), "alerts": {"no_traffic": {"severity": "sms"}}}, "alerts.no_traffic.severity"),
        ({**spec(), "period": "1h"}, "a drill period must be a multiple of 2h24m"),
        ({**spec(), "grouping": ["namespace"]}, "grouping must include model"),
        ({**spec(), "grouping": ["model", "severity"]}, "'severity' cannot be a grouping label"),
        (
            {**spec(), "grouping": ["model", "my-label"]},
            "'my-label' is not a Prometheus label name",
        ),
        ({**spec(), "grouping": ["model", "model"]}, "a grouping label is repeated"),
        ({**spec(), "selector": {"pod": "p-1"}}, "selector: 'pod' must be a grouping label too"),
        (spec(prompt_class="long"), "prompt_class"),
        (
            spec(sli="tpot", name="tpot", threshold_seconds=0.1, prompt_class="le1024"),
            "prompt_class applies to ttft objectives only",
        ),
        (
            {**spec(), "alerts": {"history_short": {"severity": "sms"}}},
            "alerts.history_short.severity",
        ),
        (
            {**spec(), "windows": {"page-medium": {"long": "3h"}}},
            "windows: unknown alert arm 'page-medium'",
        ),
        (
            {**spec(), "windows": {"page-fast": {}}},
            "a window setting sets long, short, budget_percent",
        ),
        (
            {**spec(), "windows": {"page-fast": {"short": "1h"}}},
            "windows.page-fast: the short window (1h) must be shorter",
        ),
        (
            {**spec(), "windows": {"ticket-slow": {"long": "30d"}}},
            "windows.ticket-slow: the long window (30d) must be shorter than the period",
        ),
        (
            {**spec(), "windows": {"ticket-slow": {"budget_percent": 0}}},
            "windows.ticket-slow.budget_percent",
        ),
        (None, "the spec is empty; there would be nothing to render"),
        (["version: 1"], "expected a mapping with version and objectives"),
    ],
)
def test_invalid_spec_is_refused_with_one_line_naming_the_problem(data, expected):
    assert expected in refusal(data)


def test_duplicate_objective_names_are_refused():
    data = spec()
    data["objectives"].append(dict(data["objectives"][0]))
    assert "objective names must be unique; repeated: ttft" in refusal(data)


def test_load_spec_file_errors(tmp_path):
    with pytest.raises(SpecError, match="No such file"):
        load_spec(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [1\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(str(bad))
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(SpecError, match="empty"):
        load_spec(str(empty))


# --------------------------------------------------------------------- windows


def factors(period: int) -> list[Fraction]:
    return [burn_rate_factor(w, period) for w in WORKBOOK_WINDOWS]


def test_window_table_is_the_workbooks():
    rows = [(w.severity, w.long_name, w.short_name, w.budget_consumed) for w in WORKBOOK_WINDOWS]
    assert rows == [
        ("page", "1h", "5m", Fraction(2, 100)),
        ("page", "6h", "30m", Fraction(5, 100)),
        ("ticket", "1d", "2h", Fraction(10, 100)),
        ("ticket", "3d", "6h", Fraction(10, 100)),
    ]
    for w in WORKBOOK_WINDOWS:
        assert w.short * 12 == w.long  # the workbook's short window is 1/12 of the long one


def test_windows_change_an_arm_and_its_factor_follows():
    """What the chart's prometheus.rules.windows mirror: an arm's windows and budget share."""
    s = parse_spec(
        {
            **spec(),
            "windows": {
                "page-fast": {"long": "2h"},
                "ticket-slow": {"long": "7d", "budget_percent": 2.5},
            },
        }
    )
    rows = [
        (w.name, w.severity, w.long_name, w.short_name, w.budget_consumed) for w in s.alert_windows
    ]
    assert rows == [
        ("page-fast", "page", "2h", "5m", Fraction(2, 100)),
        ("page-slow", "page", "6h", "30m", Fraction(5, 100)),
        ("ticket-fast", "ticket", "1d", "2h", Fraction(10, 100)),
        ("ticket-slow", "ticket", "7d", "6h", Fraction(25, 1000)),
    ]
    assert [burn_rate_factor(w, s.period) for w in s.alert_windows] == [
        Fraction(36, 5),
        6,
        3,
        Fraction(3, 28),
    ]
    assert [w.name for w in WORKBOOK_WINDOWS] == [
        "page-fast",
        "page-slow",
        "ticket-fast",
        "ticket-slow",
    ]


def test_factors_for_30d_are_the_workbooks_14_4_6_3_1():
    assert factors(30 * DAY) == [Fraction(72, 5), 6, 3, 1]


def test_factors_follow_the_period_28d():
    # budget consumed * period / long window: 0.02 * 672h / 1h, 0.05 * 672h / 6h, ...
    assert factors(28 * DAY) == [
        Fraction(1344, 100),
        Fraction(56, 10),
        Fraction(28, 10),
        Fraction(28, 30),
    ]
    assert [round(float(f), 4) for f in factors(28 * DAY)] == [13.44, 5.6, 2.8, 0.9333]


def test_detection_time_is_budget_consumed_times_period_over_burn_rate():
    page_1h, page_6h, ticket_1d, ticket_3d = WORKBOOK_WINDOWS
    period = 30 * DAY
    # A full outage against a 99.9% SLO: burn rate 1000, detected by the 1h arm in 0.864 min.
    assert detection_seconds(page_1h, period, 1000) == pytest.approx(0.864 * 60)
    assert detection_seconds(page_1h, period, 28.8) == 30 * 60
    assert detection_seconds(page_6h, period, 10) == pytest.approx(3.6 * 3600)
    assert detection_seconds(ticket_1d, period, 4) == 18 * 3600
    assert detection_seconds(ticket_3d, period, 2) == 36 * 3600
    assert detection_seconds(page_1h, period, 14.4) is None  # never above its factor
    assert detection_seconds(ticket_3d, period, 0.5) is None


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("5m", 300),
        ("30m", 1800),
        ("1h", 3600),
        ("6h", 21600),
        ("1d", DAY),
        ("3d", 3 * DAY),
        ("1h30m", 5400),
        ("2w", 14 * DAY),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds
    if text not in ("1h30m", "2w"):
        assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["", "5", "m", "5M", "1.5h", "-5m", "5m1h"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


# --------------------------------------------------------------------- grouping, drills, classes


def test_default_grouping_is_the_deployment_with_cluster_kept():
    assert parse_spec(spec()).grouping == ("cluster", "namespace", "model")
    assert parse_spec({**spec(), "grouping": ["namespace", "service", "model"]}).grouping == (
        "namespace",
        "service",
        "model",
    )


def test_drill_period_scales_every_window_and_keeps_the_30d_factors():
    drill = parse_spec({**spec(), "period": "12h"})
    rows = [(w.severity, w.long_name, w.short_name) for w in drill.alert_windows]
    assert rows == [
        ("page", "1m", "5s"),
        ("page", "6m", "30s"),
        ("ticket", "24m", "2m"),
        ("ticket", "72m", "6m"),
    ]
    assert [burn_rate_factor(w, drill.period) for w in drill.alert_windows] == [
        burn_rate_factor(w, 30 * DAY) for w in WORKBOOK_WINDOWS
    ]
    assert parse_spec(spec()).alert_windows == WORKBOOK_WINDOWS


def test_prompt_class_targets_one_class():
    o = parse_spec(spec(prompt_class="gt8192", threshold_seconds=10.0)).objectives[0]
    assert o.prompt_class == "gt8192"
