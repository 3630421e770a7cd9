"""SLOs from Helm values: `helm install --set` changes a target or threshold, and the chart's
rules are still exactly what the generator renders for that target and threshold.

- With the default values the chart's PrometheusRule holds deploy/prometheus/'s rules as the
  release applies them (sidecar.tools.slo.helm.release_rules: scoped to its namespace and
  release (llm_release), kube-prometheus-stack severities), and --set changes severities and the
  runbook URL.
- With --set (ttft: 99% within 5 s), the rules equal `llm-sidecar slo render` of the spec
  changed the same way, promtool's lint passes, and a promtool unit test shows the changed
  verdict: a TTFT of 3% over 5 s is a ticket under 99% (burn 3) where the shipped 95%
  within 2 s reads 4% over 2 s (burn 0.8), quiet.
- values.schema.json refuses a threshold that is not a bucket bound, a target of 100, an
  unknown objective; its objectives section and the values are what sidecar/tools/slo/helm.py
  derives from the spec.
- Burn-rate windows (prometheus.rules.windows) and per-model overrides
  (prometheus.rules.modelOverrides) from --set alone: the rules equal `llm-sidecar slo render`
  of the spec changed the same way (windows: ..., models: ...), a window two arms share is
  recorded once, the override's rules select its model and every other rule of its
  objective leaves it out. One promtool run checks them: with page-fast at 2h/5m (factor
  7.2) and a model `strict` given a 1 s TTFT threshold, `strict` (50% over 1 s: burn 10)
  fires all four arms, the 2h one included, while model `m` with the same latencies (4% over
  2 s: burn 0.8) stays quiet; no 1h window is recorded any more. The schema and the
  template refuse windows that are not canonical, not ordered, or longer than the period,
  and an override given twice or with a threshold its objective cannot have.
Skipped without helm (make tools) or promtool locally; fails under CI=true.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from sidecar.base.buckets import TTFT_BUCKETS
from sidecar.tools.slo import load_spec, parse_spec, render_rules
from sidecar.tools.slo.helm import (
    OVERRIDES_PATH,
    VALUES_PATH,
    WINDOWS_PATH,
    overrides_schema,
    release_rules,
    schema_section,
    values_section,
    windows_schema,
    windows_values,
)
from tests.support.chart import CHART, ROOT, by_kind, render, render_error, sync
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

SPEC = ROOT / "deploy" / "slo" / "default.yaml"
KEY = ".".join(VALUES_PATH)


def rules_of(objs: list[dict]) -> dict:
    (rule,) = by_kind(objs, "PrometheusRule")
    return rule["spec"]


def render_text(*args: str) -> str:
    """The PrometheusRule spec as text, as Prometheus would read it from a rules file."""
    return yaml.safe_dump(rules_of(render(*args)), sort_keys=False, width=10**9)


def spec_with(**ttft) -> dict:
    data = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    for o in data["objectives"]:
        if o["name"] == "ttft":
            o.update(ttft)
    return data


@pytest.fixture(scope="module")
def helm_ok():
    if not sync.HELM.exists():
        require_tool(str(sync.HELM))  # skips locally, fails under CI=true


def released(spec, **kw) -> dict:
    return yaml.safe_load(render_rules(release_rules(spec, sync.NAMESPACE, sync.RELEASE, **kw)))


def test_default_values_give_the_committed_rules_scoped_to_the_release(helm_ok):
    got = rules_of(render())
    assert got == released(load_spec(str(SPEC)))
    text = json.dumps(got)
    assert 'llm_release=\\"llm/llm-sidecar\\"' in text and 'namespace=\\"' not in text
    assert 'severity": "critical' in text and 'severity": "page' not in text


def test_set_changes_severities_and_runbook_url(helm_ok):
    severities = {"page": "page", "ticket": "ticket", "info": "none"}
    url = "https://runbooks.example.com/llm"
    args = [
        a for k, v in severities.items() for a in ("--set", f"prometheus.rules.severities.{k}={v}")
    ]
    got = rules_of(render(*args, "--set", f"prometheus.rules.runbookUrl={url}"))
    assert got == released(load_spec(str(SPEC)), severities=severities, runbook_url=url)
    assert got != rules_of(render())
    links = {
        r["annotations"]["runbook_url"] for g in got["groups"] for r in g["rules"] if "alert" in r
    }
    assert links and all(link.startswith(url + "#runbook-") for link in links)


def test_set_changes_target_and_threshold_as_the_generator_would(helm_ok, tmp_path):
    args = ["--set", f"{KEY}.ttft.target=99", "--set", f"{KEY}.ttft.thresholdSeconds=5.0"]
    got = rules_of(render(*args))
    want = released(parse_spec(spec_with(target=99, threshold_seconds=5.0)))
    assert got == want
    assert got != released(load_spec(str(SPEC)))


def test_the_capacity_bound_follows_the_objective_threshold_from_values(helm_ok):
    """The capacity rules judge each band against the TPOT objective's threshold: set from
    values, both move together (neither keeps the spec's number)."""
    got = rules_of(render("--set", f"{KEY}.tpot.thresholdSeconds=0.075"))
    data = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    for o in data["objectives"]:
        if o["name"] == "tpot":
            o["threshold_seconds"] = 0.075
    assert got == released(parse_spec(data))
    # The bands are judged on the share of gaps in the bucket at the threshold: the bound
    # the capacity group reads is the one set from values.
    (within,) = [
        r["expr"]
        for g in got["groups"]
        for r in g["rules"]
        if r.get("record") == "llm:inter_token_latency_by_concurrency_seconds_bucket:rate2m"
    ]
    assert 'le="0.075"' in within and 'le="0.1"' not in within


def test_promtool_agrees_with_the_values(helm_ok, tmp_path):
    promtool = require_tool("promtool")
    files = {
        "default": render_text(),
        "set": render_text(
            "--set", f"{KEY}.ttft.target=99", "--set", f"{KEY}.ttft.thresholdSeconds=5.0"
        ),
    }
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text, encoding="utf-8")
    check = subprocess.run(
        [promtool, "check", "rules", "--lint=all", "--lint-fatal", "default.yaml", "set.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    # Steady TTFT from the start: 960 of 1000 within 2 s, 970 within 5 s.
    series = [
        ("_count", None, "0+1000x60"),
        ("_bucket", "2.0", "0+960x60"),
        ("_bucket", "5.0", "0+970x60"),
        ("_bucket", "+Inf", "0+1000x60"),
    ]
    inputs = [
        {
            "series": "llm_time_to_first_token_seconds"
            + suffix
            + '{namespace="llm",llm_release="llm/llm-sidecar",model="m",route="/v1/chat/completions",prompt_class="all"'
            + (f',le="{le}"' if le else "")
            + "}",
            "values": values,
        }
        for suffix, le, values in series
    ]
    alert = 'ALERTS{alertname="LLMTTFTBurnRate",alertstate="firing",severity="warning",slo="ttft",namespace="llm",llm_release="llm/llm-sidecar",model="m",long_window="3d",short_window="6h"}'
    for name, firing in (("default", False), ("set", True)):
        test = {
            "rule_files": [f"{name}.yaml"],
            "evaluation_interval": "1m",
            "tests": [
                {
                    "interval": "1m",
                    "input_series": inputs,
                    "promql_expr_test": [
                        {
                            "expr": 'ALERTS{alertname="LLMTTFTBurnRate"}',
                            "eval_time": "1h",
                            "exp_samples": [{"labels": alert, "value": 1}] if firing else [],
                        }
                    ],
                }
            ],
        }
        (tmp_path / f"test-{name}.yaml").write_text(
            yaml.safe_dump(test, sort_keys=False), encoding="utf-8"
        )
        result = subprocess.run(
            [promtool, "test", "rules", f"test-{name}.yaml"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"


WKEY = ".".join(WINDOWS_PATH)
OKEY = ".".join(OVERRIDES_PATH)
BIG = "meta-llama/Llama-3.1-405B-Instruct"


def sets(*values: str) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def override_sets(index: int, **fields) -> list[str]:
    return sets(*(f"{OKEY}[{index}].{k}={v}" for k, v in fields.items()))


@pytest.mark.parametrize(
    "values, message",
    [
        ((f"{KEY}.ttft.thresholdSeconds=1.7",), "thresholdSeconds"),
        ((f"{KEY}.ttft.target=100",), "target"),
        ((f"{KEY}.availability.target=40",), "target"),
        ((f"{KEY}.ttft-fast.target=99",), "ttft-fast"),
        ((f"{WKEY}.page-fast.long=60m",), "write 60m as 1h"),
        ((f"{WKEY}.page-fast.long=1x",), "page-fast.long"),
        ((f"{WKEY}.page-slow.short=7h",), "must be shorter than the long one"),
        ((f"{WKEY}.page-slow.short=1m",), "the base window"),
        ((f"{WKEY}.ticket-slow.long=30d",), "shorter than the period"),
        ((f"{WKEY}.ticket-slow.budgetPercent=0",), "budgetPercent"),
        ((f"{WKEY}.page-medium.long=3h",), "page-medium"),
        ((f"{OKEY}[0].objective=ttft", f"{OKEY}[0].model=a", f"{OKEY}[0].target=90",
          f"{OKEY}[1].objective=ttft", f"{OKEY}[1].model=a", f"{OKEY}[1].target=91"), "second override for model a"),
        ((f"{OKEY}[0].objective=availability", f"{OKEY}[0].model=a", f"{OKEY}[0].thresholdSeconds=5.0"), "modelOverrides.0"),
        ((f"{OKEY}[0].objective=ttft", f"{OKEY}[0].model=a", f"{OKEY}[0].thresholdSeconds=1.7"), "modelOverrides.0"),
        ((f"{OKEY}[0].objective=ttft", f"{OKEY}[0].model=a", f"{OKEY}[0].target=40.5"), "target"),
        ((f"{OKEY}[0].objective=ttft", f"{OKEY}[0].model=a"), "target"),
        ((f"{OKEY}[0].objective=ttft-fast", f"{OKEY}[0].model=a", f"{OKEY}[0].target=90"), "objective"),
        ((f"{OKEY}[0].objective=ttft", f'{OKEY}[0].model=a"b', f"{OKEY}[0].target=90"), "model"),
    ],
)  # fmt: skip
def test_schema_and_template_refuse_what_the_spec_would(helm_ok, values, message):
    assert message in render_error(*sets(*values))


WINDOW_SETS = (
    f"{WKEY}.page-fast.long=2h",
    f"{WKEY}.ticket-slow.long=7d",
    f"{WKEY}.ticket-slow.budgetPercent=2.5",
)
WINDOW_SPEC = {"page-fast": {"long": "2h"}, "ticket-slow": {"long": "7d", "budget_percent": 2.5}}


def spec_data(windows: dict | None = None, models: dict | None = None) -> dict:
    data = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    if windows:
        data["windows"] = windows
    for o in data["objectives"]:
        if models and o["name"] in models:
            o["models"] = models[o["name"]]
    return data


def exprs(spec: dict) -> dict[str, list[str]]:
    """record or alert name -> its expressions, in order."""
    out: dict[str, list[str]] = {}
    for g in spec["groups"]:
        for r in g["rules"]:
            out.setdefault(r.get("record") or r["alert"], []).append(r["expr"])
    return out


def test_a_base_window_other_than_the_aggregates_reads_the_raw_series(helm_ok):
    """The SLOs read their base window's events from the aggregates' 5m records; with another
    base window (page-fast's short) they read the raw series over it, as the generator does."""
    got = rules_of(render(*sets(f"{WKEY}.page-fast.short=10m")))
    assert got == released(parse_spec(spec_data(windows={"page-fast": {"short": "10m"}})))
    events = exprs(got)["llm:sli_events:rate10m"]
    assert any(
        e.startswith("sum by (") and "(rate(llm_time_to_first_token_seconds_count{" in e
        for e in events
    ), events
    assert not any("llm:time_to_first_token_seconds_bucket:rate5m" in e for e in events)
    default = exprs(rules_of(render()))["llm:sli_events:rate5m"]
    assert any("llm:time_to_first_token_seconds_bucket:rate5m{" in e for e in default), default


def test_set_changes_windows_as_the_generator_would(helm_ok):
    got = rules_of(render(*sets(*WINDOW_SETS)))
    assert got == released(parse_spec(spec_data(windows=WINDOW_SPEC)))
    found = exprs(got)
    # page-fast: 2% x 30d / 2h = 7.2 over 2h and 5m; ticket-slow: 2.5% x 30d / 7d = 0.107143.
    burn = [e for e in found["LLMTTFTBurnRate"]]
    assert (
        burn[0].startswith("llm:burn_rate:ratio_rate2h{")
        and " > 7.2 and llm:burn_rate:ratio_rate5m{" in burn[0]
    )
    assert (
        burn[3].startswith("llm:burn_rate:ratio_rate7d{")
        and " > 0.107143 and llm:burn_rate:ratio_rate6h{" in burn[3]
    )
    assert "llm:burn_rate:ratio_rate1h" not in found and "llm:burn_rate:ratio_rate3d" not in found
    # 2h is page-fast's long and ticket-fast's short window: recorded once per scope.
    assert len(found["llm:sli_error:ratio_rate2h"]) == len(found["llm:sli_error:ratio_rate5m"])
    # 7d is a long window (a day or more): summed from the recorded 5m rates, not a raw rate.
    assert all(
        e.startswith("sum_over_time(llm:sli_bad_events:rate5m{") and "[7d])" in e
        for e in found["llm:sli_error:ratio_rate7d"]
    )
    alerts = [r for g in got["groups"] for r in g["rules"] if r.get("alert") == "LLMTTFTBurnRate"]
    assert (alerts[0]["labels"]["long_window"], alerts[0]["labels"]["short_window"]) == ("2h", "5m")
    assert (
        "fires above 7.2x, i.e. when 2% of the budget is gone in 2h"
        in alerts[0]["annotations"]["description"]
    )


def test_set_adds_model_overrides_as_the_generator_would(helm_ok):
    args = override_sets(0, objective="ttft", model=BIG, thresholdSeconds="5.0", target=90)
    args += override_sets(1, objective="availability", model="qwen", target="99.9")
    got = rules_of(render(*args))
    models = {
        "ttft": {BIG: {"threshold_seconds": 5.0, "target": 90}},
        "availability": {"qwen": {"target": 99.9}},
    }
    assert got == released(parse_spec(spec_data(models=models)))
    assert rules_of(render()) == released(load_spec(str(SPEC))), "no override by default"
    ttft = next(g for g in got["groups"] if g["name"] == "llm-sidecar-slo-ttft")["rules"]
    mine = [r for r in ttft if r.get("labels", {}).get("model") == BIG]
    others = [r for r in ttft if "model" not in r.get("labels", {})]
    assert mine and others and len(mine) + len(others) == len(ttft)
    assert all(f'model="{BIG}"' in r["expr"] for r in mine)
    assert all(f'model!="{BIG}"' in r["expr"] and "qwen" not in r["expr"] for r in others)
    assert any(f'model="{BIG}",le="5.0"' in r["expr"] for r in mine)
    assert any(',le="2.0"' in r["expr"] for r in others)
    budget = [r["expr"] for r in mine if r.get("record") == "llm:error_budget_remaining:ratio"]
    assert budget == [
        f'1 - llm:sli_error:ratio_rate30d{{slo="ttft",llm_release="llm/llm-sidecar",model="{BIG}"}} / 0.1'
    ]
    # A target-only override keeps its objective's threshold (availability has none).
    avail = next(g for g in got["groups"] if g["name"] == "llm-sidecar-slo-availability")["rules"]
    assert any(
        r.get("labels", {}).get("model") == "qwen" and r["expr"].endswith(" / 0.001") for r in avail
    )


def test_promtool_reads_windows_and_an_override_from_values(helm_ok, tmp_path):
    """One check and one test run: a stricter threshold for one model fires, the same
    latencies for another model stay quiet, and page-fast reads its 2h window."""
    promtool = require_tool("promtool")
    args = sets(f"{WKEY}.page-fast.long=2h") + override_sets(
        0, objective="ttft", model="strict", thresholdSeconds="1.0"
    )
    (tmp_path / "rules.yaml").write_text(render_text(*args), encoding="utf-8")
    check = subprocess.run(
        [promtool, "check", "rules", "--lint=all", "--lint-fatal", "rules.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    # Both models, 1000 first tokens a minute: 500 within 1 s, 960 within 2 s. m (2 s, 95%):
    # 4% bad of a 5% budget, burn 0.8: quiet. strict (1 s, 95%): 50% bad, burn 10: above
    # page-fast's 7.2 (2h/5m), page-slow's 6, and the tickets' 3 and 1.
    labels = 'namespace="llm",llm_release="llm/llm-sidecar",route="/v1/chat/completions",prompt_class="all"'
    inputs = []
    for model in ("m", "strict"):
        for suffix, le, step in (
            ("_count", None, 1000),
            ("_bucket", "1.0", 500),
            ("_bucket", "2.0", 960),
            ("_bucket", "+Inf", 1000),
        ):
            extra = f',le="{le}"' if le else ""
            inputs.append(
                {
                    "series": f'llm_time_to_first_token_seconds{suffix}{{{labels},model="{model}"{extra}}}',
                    "values": f"0+{step}x60",
                }
            )
    arms = (
        ("critical", "2h", "5m"),
        ("critical", "6h", "30m"),
        ("warning", "1d", "2h"),
        ("warning", "3d", "6h"),
    )
    firing = [
        {
            "labels": f'ALERTS{{alertname="LLMTTFTBurnRate",alertstate="firing",severity="{sev}",slo="ttft",'
            f'namespace="llm",llm_release="llm/llm-sidecar",model="strict",long_window="{long}",short_window="{short}"}}',
            "value": 1,
        }
        for sev, long, short in arms
    ]
    scope = 'slo="ttft",namespace="llm",llm_release="llm/llm-sidecar"'
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="LLMTTFTBurnRate"}',
                        "eval_time": "1h",
                        "exp_samples": firing,
                    },
                    {
                        "expr": 'round(llm:burn_rate:ratio_rate2h{slo="ttft"}, 0.001)',
                        "eval_time": "1h",
                        "exp_samples": [
                            {"labels": f'{{{scope},model="m"}}', "value": 0.8},
                            {"labels": f'{{{scope},model="strict"}}', "value": 10},
                        ],
                    },
                    {
                        "expr": "absent(llm:burn_rate:ratio_rate1h)",
                        "eval_time": "1h",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump(test, sort_keys=False, width=10**9), encoding="utf-8"
    )
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_values_and_schema_are_derived_from_the_spec():
    spec = load_spec(str(SPEC))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    node, props = values, schema
    for key in VALUES_PATH:
        node = node[key]
        props = props["properties"][key]
    assert node == values_section(spec)
    assert props == schema_section(spec)
    rules_values = values["prometheus"]["rules"]
    rules_schema = schema["properties"]["prometheus"]["properties"]["rules"]["properties"]
    assert rules_values["windows"] == windows_values(spec)
    assert rules_schema["windows"] == windows_schema(spec)
    assert rules_values["modelOverrides"] == [], "no per-model override is shipped active"
    assert rules_schema["modelOverrides"] == overrides_schema(spec)
    assert props["properties"]["ttft"]["properties"]["thresholdSeconds"]["enum"][-1] == str(
        TTFT_BUCKETS[-1]
    )  # the top bound as text, and as a number before it
