"""Prompt-length classes of the TTFT histogram: a fixed, small set of label values."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.base.prompt_class import MAX_BOUNDS, PromptClasses, parse_bounds
from sidecar.config import ConfigError, load_settings
from sidecar.export.metrics import SidecarMetrics
from sidecar.measure.summary import summarize
from sidecar.streams.protocols.events import Usage
from tests.support.timelines import ROUTE, streamed


def test_classes_from_bounds_and_unknown_without_a_count():
    pc = PromptClasses([1024, 8192])
    assert pc.values == ("le1024", "le8192", "gt8192", "unknown")
    assert [pc(n) for n in (0, 1024, 1025, 8192, 8193, 10**9)] == [
        "le1024",
        "le1024",
        "le8192",
        "le8192",
        "gt8192",
        "gt8192",
    ]
    assert pc(None) == "unknown"


def test_no_bounds_is_one_class():
    pc = PromptClasses()
    assert pc.values == ("all",)
    assert pc(None) == pc(5) == pc(10**6) == "all"


@pytest.mark.parametrize(
    "value, message",
    [
        ("1024,512", "increasing"),
        ("1024,1024", "increasing"),
        ("0", ">= 1"),
        ("1k", "whole number"),
        (",".join(str(2**i) for i in range(MAX_BOUNDS + 1)), f"at most {MAX_BOUNDS}"),
    ],
)
def test_bad_bounds_are_refused_with_the_reason(value, message):
    with pytest.raises(ValueError, match=message):
        parse_bounds(value)
    with pytest.raises(ConfigError, match="ttft_prompt_classes|ttft-prompt-classes"):
        load_settings({"upstream": "http://x", "ttft_prompt_classes": value}, environ={})


def test_setting_from_flag_env_and_file(tmp_path):
    assert load_settings({"upstream": "http://x"}, environ={}).ttft_prompt_classes == []
    env = {"LLM_SIDECAR_TTFT_PROMPT_CLASSES": "1024, 8192"}
    assert load_settings({"upstream": "http://x"}, environ=env).ttft_prompt_classes == [1024, 8192]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ttft_prompt_classes: [2048]\n")
    assert load_settings(
        {"upstream": "http://x"}, environ={}, config_file=str(cfg)
    ).ttft_prompt_classes == [2048]


def test_cardinality_is_bounded_whatever_the_prompts():
    """Many requests of every length: the label never takes a value outside the fixed set."""
    reg = CollectorRegistry()
    m = SidecarMetrics(reg, prompt_classes=PromptClasses([1024, 8192]))
    for n in [None, *range(0, 20000, 97)]:
        usage = None if n is None else Usage(input_tokens=n, output_tokens=4)
        m.started("m", ROUTE)
        m.record(summarize(streamed([100.2, 100.25, 100.3, 100.4], usage=usage), "m"))
    seen = {
        s.labels["prompt_class"]
        for fam in reg.collect()
        if fam.name == "llm_time_to_first_token_seconds"
        for s in fam.samples
    }
    assert seen == {"le1024", "le8192", "gt8192", "unknown"}
    base = {"model": "m"}
    assert (
        reg.get_sample_value(
            "llm_time_to_first_token_seconds_count", {**base, "prompt_class": "unknown"}
        )
        == 1
    )
    # 0..1024 step 97: 11 requests
    assert (
        reg.get_sample_value(
            "llm_time_to_first_token_seconds_count", {**base, "prompt_class": "le1024"}
        )
        == 11
    )
