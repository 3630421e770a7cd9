"""A TTFT objective judged on one prefix-cache class (``cache_class`` in the SLO spec): with
``none``, on the requests that missed the cache alone, i.e. on prefill, from the companion
histogram ``llm_time_to_first_token_by_cache_seconds{cache="none"}`` instead of the TTFT
histogram of every request. The promtool test that it burns on misses a hit-heavy mix would
hide is in tests/integration/tools/test_promtool.py.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.utils import floatToGoString

from sidecar.base.buckets import TTFT_BY_CACHE_BUCKETS
from sidecar.export.metrics import SidecarMetrics
from sidecar.measure.cache_class import CACHE_CLASSES
from sidecar.tools.dashboards.inspect import panel_queries
from sidecar.tools.dashboards.render import to_json_dict
from sidecar.tools.dashboards.slo import build as build_slo_dashboard
from sidecar.tools.slo import conventions as c
from sidecar.tools.slo.helm import schema_section
from sidecar.tools.slo.rules import generate, objective_text
from sidecar.tools.slo.spec import Objective, SpecError, parse_spec

PREFILL = {
    "name": "ttft-prefill",
    "sli": "ttft",
    "target": 95,
    "threshold_seconds": 1.0,
    "cache_class": "none",
}


def spec(*objectives: dict, **top):
    return parse_spec({"version": 1, "objectives": list(objectives), **top})


def test_a_miss_objective_reads_only_the_misses_of_the_by_cache_histogram():
    rs = generate(spec(PREFILL, {**PREFILL, "name": "ttft", "cache_class": None}))
    bad = {r.labels["slo"]: r.expr for r in rs.rules() if r.record == "llm:sli_bad_events:rate5m"}
    events = {r.labels["slo"]: r.expr for r in rs.rules() if r.record == "llm:sli_events:rate5m"}
    by = "sum by (cluster, namespace, model)"
    # The events read once; the bad ones are those less the good, from that record.
    assert events["ttft-prefill"] == (
        f'{by} (rate(llm_time_to_first_token_by_cache_seconds_count{{cache="none"}}[5m]))'
    )
    assert bad["ttft-prefill"] == (
        'llm:sli_events:rate5m{slo="ttft-prefill"} - ignoring (slo)'
        f' {by} (rate(llm_time_to_first_token_by_cache_seconds_bucket{{cache="none",le="1.0"}}[5m]))'
    )
    # Without cache_class: every request, from the TTFT histogram's record.
    assert (
        "by_cache" not in bad["ttft"]
        and 'llm:time_to_first_token_seconds_bucket:rate5m{le="1.0"}' in bad["ttft"]
    )
    alert = next(r for r in rs.rules() if r.alert == "LLMTTFTPrefillBurnRate")
    assert (
        "time to first token <= 1s for 95% of streamed requests that missed the prefix cache"
        in (alert.annotations["description"])
    )
    assert alert.annotations["runbook_url"].endswith("#runbook-llmttftburnrate")  # a TTFT runbook


def test_overrides_keep_the_class_and_the_model_matchers():
    rs = generate(spec({**PREFILL, "models": {"big": {"threshold_seconds": 5.0}}}))
    exprs = [r.expr for r in rs.rules() if r.record == "llm:sli_bad_events:rate5m"]
    assert (
        'llm_time_to_first_token_by_cache_seconds_bucket{cache="none",model!="big",le="1.0"}'
        in exprs[0]
    )
    assert (
        'llm_time_to_first_token_by_cache_seconds_bucket{cache="none",model="big",le="5.0"}'
        in exprs[1]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sli": "tpot", "threshold_seconds": 0.1}, "cache_class applies to ttft objectives only"),
        ({"prompt_class": "gt8192"}, "cache_class and prompt_class cannot be combined"),
        ({"cache_class": "unknown"}, "cache_class: Input should be 'none', 'partial' or 'most'"),
        ({"cache_class": "miss"}, "cache_class: Input should be"),
        (
            {"threshold_seconds": 1.1},
            "not a bucket bound of llm_time_to_first_token_by_cache_seconds",
        ),
        (
            {"models": {"big": {"threshold_seconds": 4.0}}},
            "models.big: threshold_seconds 4 is not a bucket bound",
        ),
    ],
)
def test_bad_cache_class_objectives_are_refused_in_one_line(change, message):
    with pytest.raises(SpecError, match=None) as err:
        spec({**PREFILL, **change})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_tenant_grouping_cannot_judge_a_cache_class():
    with pytest.raises(SpecError, match="the TTFT-by-cache histogram has no tenant label"):
        spec(PREFILL, grouping=["namespace", "model", "tenant"])


def test_the_threshold_check_knows_the_by_cache_histograms_buckets():
    """The generator validates thresholds against the buckets it names for the histogram it
    reads: those must be the sidecar's own buckets of that family, for every class."""
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    metrics.ttft_by_cache.labels("m", "none").observe(0.1)
    written = {
        s.labels["le"]
        for family in registry.collect()
        if family.name == c.TTFT_BY_CACHE_HISTOGRAM
        for s in family.samples
        if s.name.endswith("_bucket")
    }
    assert len(written) == len(TTFT_BY_CACHE_BUCKETS) + 1
    for cls in c.CACHE_CLASSES_JUDGED:
        latency = c.latency_sli("ttft", cls)
        assert latency.histogram == c.TTFT_BY_CACHE_HISTOGRAM and latency.matchers == (
            (c.LABEL_CACHE, cls),
        )
        assert {floatToGoString(b) for b in latency.buckets} | {"+Inf"} == written
    assert latency.buckets == TTFT_BY_CACHE_BUCKETS


def test_the_spec_offers_exactly_the_classes_the_sidecar_writes_but_unknown():
    offered = set(Objective.model_fields["cache_class"].annotation.__args__[0].__args__)
    assert offered == set(c.CACHE_CLASSES_JUDGED) == set(CACHE_CLASSES) - {"unknown"}


def test_objective_text_and_chart_schema_name_the_histogram_read():
    s = spec(PREFILL)
    (scope,) = s.scopes(s.objectives[0])
    assert (
        objective_text(scope)
        == "time to first token <= 1s for 95% of streamed requests that missed the prefix cache"
    )
    schema = schema_section(s)
    threshold = schema["properties"]["ttft-prefill"]["properties"]["thresholdSeconds"]
    assert (
        "llm_time_to_first_token_by_cache_seconds" in threshold["description"]
        and 1.0 in threshold["enum"]
    )


def test_the_slo_dashboards_breakdown_reads_the_misses_too():
    board = to_json_dict(build_slo_dashboard(spec(PREFILL)))
    exprs = [q.expr for q in panel_queries(board) if "llm_time_to_first_token" in q.expr]
    assert exprs and all('cache="none"' in e and "by_cache" in e for e in exprs)
