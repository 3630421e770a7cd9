"""Prometheus' own tool checks the rules and runs their unit tests.

`promtool check rules --lint=all --lint-fatal` on every rules file (the committed ones and
renderings that cover every SLI kind and a 28d period); `promtool test rules` on every file
under tests/promtool/ (hand-written, with the arithmetic in their comments); and a generated
test showing that a 28d period moves the factors, so a burn that pages under 28d does not
under 30d. Skipped without promtool locally; fails under CI=true (Debian's `prometheus`).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from sidecar.tools.slo import generate, load_spec, parse_spec, render_rules
from tests.support.paths import ROOT
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

DEFAULT_SPEC = ROOT / "deploy" / "slo" / "default.yaml"
RULE_FILES = sorted((ROOT / "deploy" / "prometheus").glob("*.yaml"))
PROMTOOL_TESTS = sorted((ROOT / "tests" / "promtool").glob("*.yaml"))


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )  # the timeout only bounds a hung promtool: a loaded machine takes minutes


def default_spec_data() -> dict:
    return yaml.safe_load(DEFAULT_SPEC.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def promtool_runs(tmp_path_factory) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Every promtool test this module runs, at once in one pool, the largest files first (the
    longest take several seconds): each hand-written file as written (``("full", name)``), and
    each reduced to its verdicts against the raw long-window form (``("raw", name)``, see
    :func:`verdict_results`)."""
    require_tool("promtool")
    jobs = {("full", p.name): (p.name, p.parent) for p in PROMTOOL_TESTS}
    tmp = tmp_path_factory.mktemp("verdicts")
    rules = tmp / "raw.rules.yaml"
    rules.write_text(
        render_rules(generate(load_spec(str(DEFAULT_SPEC)), long_windows="raw")), encoding="utf-8"
    )
    for name in VERDICT_FILES:
        doc = yaml.safe_load((ROOT / "tests" / "promtool" / name).read_text(encoding="utf-8"))
        reduced = verdicts_only(doc, rules, frozenset(LAG_CHECKS.get(name, ())))
        assert sum(len(g["promql_expr_test"]) for g in reduced["tests"]), (
            f"{name} has no verdicts to compare"
        )
        (tmp / f"raw.{name}").write_text(yaml.safe_dump(reduced, sort_keys=False), encoding="utf-8")
        jobs[("raw", name)] = (f"raw.{name}", tmp)
    order = sorted(jobs, key=lambda key: -(jobs[key][1] / jobs[key][0]).stat().st_size)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        futures = {
            key: pool.submit(promtool, "test", "rules", jobs[key][0], cwd=jobs[key][1])
            for key in order
        }
        return {key: f.result() for key, f in futures.items()}


@pytest.fixture(scope="module")
def unit_test_results(promtool_runs) -> dict[str, subprocess.CompletedProcess]:
    """Every promtool unit-test file under tests/promtool/, as written."""
    return {name: result for (kind, name), result in promtool_runs.items() if kind == "full"}


# --------------------------------------------------------------------- check rules


def rendered_variants(tmp_path: Path) -> list[Path]:
    """The default spec with a 28d period, a 12h drill period and five grouping labels, and a
    spec with every SLI kind and overrides."""
    out = []
    d28 = default_spec_data()
    d28["period"] = "28d"
    every = {
        "version": 1,
        "period": "30d",
        "objectives": [
            {
                "name": "availability",
                "sli": "availability",
                "target": 99.9,
                "models": {"a": {"target": 99}, "b": {"target": 98}},
            },
            {
                "name": "ttft",
                "sli": "ttft",
                "target": 95,
                "threshold_seconds": 0.5,
                "models": {"a": {"threshold_seconds": 10.0}},
            },
            {"name": "ttft-tail", "sli": "ttft", "target": 99, "threshold_seconds": 5.0},
            {"name": "tpot", "sli": "tpot", "target": 95, "threshold_seconds": 0.05},
            {"name": "itl", "sli": "itl", "target": 99, "threshold_seconds": 0.1},
            {"name": "e2e", "sli": "e2e", "target": 99, "threshold_seconds": 120.0},
        ],
    }
    drill = default_spec_data()
    drill["period"] = "12h"
    grouped = default_spec_data()
    grouped["grouping"] = ["cluster", "namespace", "service", "model", "route"]
    for name, data in (
        ("default-28d.yaml", d28),
        ("every-kind.yaml", every),
        ("drill-12h.yaml", drill),
        ("grouped.yaml", grouped),
    ):
        path = tmp_path / name
        path.write_text(render_rules(generate(parse_spec(data))), encoding="utf-8")
        out.append(path)
    return out


def test_every_rules_file_passes_promtool_check_with_fatal_lint(tmp_path):
    assert RULE_FILES, "no rules under deploy/prometheus/"
    files = [*RULE_FILES, *rendered_variants(tmp_path)]
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


# --------------------------------------------------------------------- unit tests


def test_promtool_test_files_exist_and_set_interval_in_every_group():
    names = {p.name for p in PROMTOOL_TESTS}
    assert {"page.yaml", "ticket.yaml", "latency.yaml", "health.yaml"} <= names
    for path in PROMTOOL_TESTS:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert doc["rule_files"] == ["../../deploy/prometheus/llm-sidecar-rules.yaml"], path.name
        # Later groups read the aggregates' records: promtool must evaluate the groups in the
        # file's order at each step (unlisted, it picks a random order).
        assert doc["group_eval_order"] == group_names(RULE_FILES[0]), path.name
        for group in doc["tests"]:
            assert "interval" in group, (
                f"{path.name}: Prometheus 2.42 needs interval: in every test group"
            )


@pytest.mark.parametrize("name", [p.name for p in PROMTOOL_TESTS])
def test_promtool_unit_tests_pass(unit_test_results, name):
    result = unit_test_results[name]
    assert result.returncode == 0, (
        f"promtool test rules tests/promtool/{name}\n{result.stdout}{result.stderr}"
    )
    assert "SUCCESS" in result.stdout


# --------------------------------------------------------------------- 28d vs 30d

# Burn-rate factors by hand: budget share x period / long window.
#   30d = 720h: 0.02*720/1 = 14.4, 0.05*720/6 = 6, 0.1*720/24 = 3, 0.1*720/72 = 1
#   28d = 672h: 0.02*672/1 = 13.44, 0.05*672/6 = 5.6, 0.1*672/24 = 2.8, 0.1*672/72 = 0.9333
FACTORS = {"30d": [14.4, 6.0, 3.0, 1.0], "28d": [13.44, 5.6, 2.8, 0.9333]}
ARMS = [("page", "1h", "5m"), ("page", "6h", "30m"), ("ticket", "1d", "2h"), ("ticket", "3d", "6h")]
# Steady burns from the start (every window holds the same ratio), between the two periods'
# factors: per 4000 non-cancelled requests a minute, this many errors (budget 0.5%).
BURNS = {"b14": (14.0, 280), "b095": (0.95, 19)}


def expected_alerts(period: str) -> list[str]:
    out = []
    for model, (burn, _) in BURNS.items():
        for factor, (severity, long, short) in zip(FACTORS[period], ARMS, strict=True):
            if burn > factor:
                out.append(
                    'ALERTS{alertname="LLMAvailabilityBurnRate",alertstate="firing",'
                    f'severity="{severity}",slo="availability",model="{model}",long_window="{long}",short_window="{short}"}}'
                )
    return out


def group_names(rules: Path) -> list[str]:
    """The rule groups of a rules file, in its order."""
    return [g["name"] for g in yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]]


def steady_burn_test(rules: Path, period: str) -> dict:
    series = []
    for model, (_, errors) in BURNS.items():
        labels = f'model="{model}",route="/v1/chat/completions"'
        series.append(
            {
                "series": f'llm_requests_total{{{labels},code="200",outcome="ok"}}',
                "values": f"0+{4000 - errors}x60",
            }
        )
        series.append(
            {
                "series": f'llm_requests_total{{{labels},code="500",outcome="error"}}',
                "values": f"0+{errors}x60",
            }
        )
    return {
        "rule_files": [rules.name],
        "evaluation_interval": "10m",
        "group_eval_order": group_names(rules),
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="LLMAvailabilityBurnRate"}',
                        "eval_time": "1h",
                        "exp_samples": [{"labels": a, "value": 1} for a in expected_alerts(period)],
                    }
                ],
            }
        ],
    }


def test_expected_alerts_differ_between_28d_and_30d():
    assert len(expected_alerts("28d")) == 5  # b14: all four arms; b095: the 3d ticket
    assert len(expected_alerts("30d")) == 3  # b14: all but the 1h page; b095: nothing
    assert not any('model="b095"' in a for a in expected_alerts("30d"))


@pytest.mark.parametrize("period", ["30d", "28d"])
def test_period_moves_the_factors_promtool_agrees(tmp_path, period):
    data = default_spec_data()
    data["period"] = period
    spec = parse_spec(copy.deepcopy(data))
    rules = tmp_path / "rules.yaml"
    rules.write_text(render_rules(generate(spec)), encoding="utf-8")
    test_file = tmp_path / "steady.yaml"
    test_file.write_text(
        yaml.safe_dump(steady_burn_test(rules, period), sort_keys=False), encoding="utf-8"
    )
    result = promtool("test", "rules", test_file.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_spec_renders_to_the_committed_file():
    """Guards the promtool tests above: they run against the committed rules."""
    assert RULE_FILES == [ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml"]
    assert RULE_FILES[0].read_text(encoding="utf-8") == render_rules(
        generate(load_spec(str(DEFAULT_SPEC)))
    )


# --------------------------------------------------------------------- cheap long windows


def test_long_windows_read_recorded_rates_not_raw_series():
    """No rule of the committed file runs rate() over a day or more of raw series."""
    text = RULE_FILES[0].read_text(encoding="utf-8")
    assert "sum_over_time(llm:sli_bad_events:rate5m" in text
    for window in ("1d", "3d", "30d"):
        assert not any(
            f"[{window}]" in line and "rate(llm_" in line for line in text.splitlines()
        ), f"a raw rate over {window} is left"
    raw = render_rules(generate(load_spec(str(DEFAULT_SPEC)), long_windows="raw"))
    assert "rate(llm_time_to_first_token_seconds_bucket{" in raw and "[30d]))" in raw


def _labels(metric: str, labels: dict) -> str:
    return metric + "{" + ",".join(f"{k}={json.dumps(str(v))}" for k, v in labels.items()) + "}"


# Where the hand-written tests pin the recorded chain's lag: a window above 5m sums the
# recorded 5m rates, so it reaches a burn's threshold up to half the base window (one
# evaluation at 10m) after a raw rate() would; at these checks the recorded rules are still
# quiet and the raw form already fires (windows.yaml relates the two forms' numbers).
LAG_CHECKS = {
    "page.yaml": {"18h06m", "18h32m", "19h00m"},
    "ticket.yaml": {"39h40m"},
}


def verdicts_only(doc: dict, rules: Path, skip: frozenset[str] = frozenset()) -> dict:
    """A promtool test file reduced to its verdicts: which alerts fire, with which labels, at
    every checked time. Recorded values and annotations are dropped: the two forms' numbers
    differ a little (the recorded form's window edges taper over 5m); the verdicts must not.
    Each alert_rule_test becomes the same check on the firing ``ALERTS`` series."""
    tests = []
    for group in doc["tests"]:
        checks = [
            t
            for t in group.get("promql_expr_test", [])
            if t["expr"].startswith("ALERTS") and t["eval_time"] not in skip
        ]
        for t in group.get("alert_rule_test", []):
            name = t["alertname"]
            checks.append(
                {
                    "expr": f'ALERTS{{alertname="{name}",alertstate="firing"}}',
                    "eval_time": t["eval_time"],
                    "exp_samples": [
                        {
                            "labels": _labels(
                                "ALERTS",
                                {"alertname": name, "alertstate": "firing", **a["exp_labels"]},
                            ),
                            "value": 1,
                        }
                        for a in t.get("exp_alerts", [])
                    ],
                }
            )
        kept = {k: v for k, v in group.items() if k not in ("promql_expr_test", "alert_rule_test")}
        tests.append({**kept, "promql_expr_test": checks})
    return {**doc, "rule_files": [str(rules)], "tests": tests}


# history.yaml checks LLMSLOHistoryShort, the same rule in both forms, over 30 days of
# one-minute samples: there the raw form's rate[30d] stops promtool with "query processing
# would load too many samples into memory", which is the cost this issue removes.
# windows.yaml relates the two forms' numbers exactly instead, and dashboards.yaml checks the
# dashboards' records: neither checks an alert.
NO_VERDICTS = ("history.yaml", "windows.yaml", "dashboards.yaml")
VERDICT_FILES = [p.name for p in PROMTOOL_TESTS if p.name not in NO_VERDICTS]


@pytest.fixture(scope="module")
def verdict_results(promtool_runs) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Every hand-written test's verdicts in both forms. The recorded form is the committed
    rules file (test_default_spec_renders_to_the_committed_file), whose full test checks every
    verdict the reduced file would (the same series and times, the same ``ALERTS``; beside
    them values and annotations), so its result is the full file's; the raw form runs the
    reduced file."""
    committed = RULE_FILES[0].read_text(encoding="utf-8")
    assert committed == render_rules(generate(load_spec(str(DEFAULT_SPEC)))), (
        "the committed rules are not the recorded form of the default spec"
    )
    return {
        (name, form): promtool_runs[("full" if form == "recorded" else "raw", name)]
        for name in VERDICT_FILES
        for form in ("recorded", "raw")
    }


@pytest.mark.parametrize("name", VERDICT_FILES)
def test_recorded_and_raw_long_windows_reach_the_same_verdicts(verdict_results, name):
    """Every hand-written promtool test, reduced to its verdicts, passes against the rules
    with recorded long windows (the committed form) and against the raw ``rate[30d]`` form
    rendered from the same spec: on the same series both fire the same alerts at the same
    checked times, and stay quiet at the same times."""
    for form in ("recorded", "raw"):
        result = verdict_results[(name, form)]
        assert result.returncode == 0, f"{form} form, {name}:\n{result.stdout}{result.stderr}"


# --------------------------------------------------------------------- one spec per deployment


def deployment_spec(namespace: str, target: float) -> dict:
    return {
        "version": 1,
        "grouping": ["cluster", "namespace", "model"],
        "selector": {"namespace": namespace},
        "objectives": [{"name": "availability", "sli": "availability", "target": target}],
        "alerts": {"target_down": {"job": "llm-sidecar"}},
    }


def test_one_spec_per_deployment_side_by_side_in_one_prometheus(tmp_path):
    """Prod (99.5%) and staging (90%) serve the same model with the same 5% errors, each with
    its own spec (`selector: {namespace: ...}`), both rule files in one Prometheus. Prod burns
    at 5% / 0.5% = 10: the 6h page (above 6) and both tickets fire, not the 1h page (14.4).
    Staging burns at 5% / 10% = 0.5 and stays quiet. Neither spec's rules read the other's
    series (and promtool's lint passes with both loaded)."""
    files = []
    for namespace, target in (("prod", 99.5), ("staging", 90)):
        path = tmp_path / f"{namespace}.yaml"
        path.write_text(
            render_rules(generate(parse_spec(deployment_spec(namespace, target)))), encoding="utf-8"
        )
        files.append(path.name)
    check = promtool("check", "rules", "--lint=all", "--lint-fatal", *files, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    series = []
    for namespace in ("prod", "staging"):
        labels = f'namespace="{namespace}",model="m",route="/v1/chat/completions"'
        series.append(
            {
                "series": f'llm_requests_total{{{labels},code="200",outcome="ok"}}',
                "values": "0+950x60",
            }
        )
        series.append(
            {
                "series": f'llm_requests_total{{{labels},code="500",outcome="error"}}',
                "values": "0+50x60",
            }
        )
    firing = [
        {
            "labels": f'ALERTS{{alertname="LLMAvailabilityBurnRate",alertstate="firing",severity="{severity}",slo="availability",'
            f'namespace="prod",model="m",long_window="{long_window}",short_window="{short_window}"}}',
            "value": 1,
        }
        for severity, long_window, short_window in (
            ("page", "6h", "30m"),
            ("ticket", "1d", "2h"),
            ("ticket", "3d", "6h"),
        )
    ]
    test = {
        "rule_files": files,
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="LLMAvailabilityBurnRate"}',
                        "eval_time": "1h",
                        "exp_samples": firing,
                    },
                    {
                        "expr": "round(llm:burn_rate:ratio_rate1h * 100) / 100",
                        "eval_time": "1h",
                        "exp_samples": [
                            {
                                "labels": '{slo="availability",namespace="prod",model="m"}',
                                "value": 10,
                            },
                            {
                                "labels": '{slo="availability",namespace="staging",model="m"}',
                                "value": 0.5,
                            },
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    result = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------- judged on misses alone

# A TTFT objective with `cache_class: none` reads llm_time_to_first_token_by_cache_seconds
# {cache="none"}: prefill, which cache hits would hide. Both objectives 95% <= 2.0s (budget
# 5%), steady traffic of one model, a minute apart:
#   every request (TTFT histogram): 1000, of which 990 within 2.0s -> 1% bad, burn 0.2: quiet.
#   misses (cache="none"): 100, of which 80 within 2.0s -> 20% bad, burn 4: above the
#     ticket arms' 3 (1d/2h) and 1 (3d/6h), below the pages' 14.4 and 6.
#   hits (cache="most"): 900, all within 2.0s. Read together with the misses (a rule that
#     left out the class matcher), 20 of 1000 bad -> burn 0.4: no alert at all.
PREFILL_SPEC = {
    "version": 1,
    "objectives": [
        {"name": "ttft", "sli": "ttft", "target": 95, "threshold_seconds": 2.0},
        {
            "name": "ttft-prefill",
            "sli": "ttft",
            "target": 95,
            "threshold_seconds": 1.0,  # a bound of the by-cache layout (0.25, 1, 5)
            "cache_class": "none",
        },
    ],
}


def _histogram(name: str, labels: str, per_minute: dict[str, int]) -> list[dict]:
    out = [{"series": f"{name}_count{{{labels}}}", "values": f"0+{per_minute['+Inf']}x60"}]
    for le, n in per_minute.items():
        out.append({"series": f'{name}_bucket{{{labels},le="{le}"}}', "values": f"0+{n}x60"})
    return out


def test_a_prefill_objective_burns_on_misses_that_hits_would_hide(tmp_path):
    rules = tmp_path / "prefill-rules.yaml"
    rules.write_text(
        render_rules(generate(parse_spec(copy.deepcopy(PREFILL_SPEC)))), encoding="utf-8"
    )
    check = promtool("check", "rules", "--lint=all", "--lint-fatal", str(rules))
    assert check.returncode == 0, check.stdout + check.stderr
    route = 'model="m",route="/v1/chat/completions"'
    series = [
        *_histogram(
            "llm_time_to_first_token_seconds",
            f'{route},prompt_class="all"',
            {"2.0": 990, "+Inf": 1000},
        ),
        *_histogram(
            "llm_time_to_first_token_by_cache_seconds",
            f'{route},cache="none"',
            {"1.0": 80, "+Inf": 100},
        ),
        *_histogram(
            "llm_time_to_first_token_by_cache_seconds",
            f'{route},cache="most"',
            {"1.0": 900, "+Inf": 900},
        ),
    ]
    tickets = [
        'ALERTS{alertname="LLMTTFTPrefillBurnRate",alertstate="firing",severity="ticket",slo="ttft-prefill",'
        f'model="m",long_window="{long}",short_window="{short}"}}'
        for long, short in (("1d", "2h"), ("3d", "6h"))
    ]
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "10m",
        "group_eval_order": group_names(rules),
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": "round(llm:burn_rate:ratio_rate1h * 1000) / 1000",
                        "eval_time": "1h",
                        "exp_samples": [
                            {"labels": '{slo="ttft",model="m"}', "value": 0.2},
                            {"labels": '{slo="ttft-prefill",model="m"}', "value": 4},
                        ],
                    },
                    {
                        "expr": 'ALERTS{alertname=~"LLMTTFT.*BurnRate"}',
                        "eval_time": "1h",
                        "exp_samples": [{"labels": a, "value": 1} for a in tickets],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "prefill.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    result = promtool("test", "rules", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
