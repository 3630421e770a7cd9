"""The chart's refusals are one short line a user can read.

A `fail` inside the rules' `tpl` made helm print the whole rules file (401 KB) before the one
useful sentence; the checks now run first, from templates/validate.yaml, so the error is the
sentence. And the chart refuses to render without an image (none is published), saying how
to build one.
"""

from __future__ import annotations

import re

import pytest

from tests.support.chart import require_helm, sync
from tests.support.paths import CHART

pytestmark = pytest.mark.integration

MAX_ERROR = 400  # characters: one line of reason, plus helm's own prefix


@pytest.fixture(scope="module", autouse=True)
def helm_ok() -> None:
    require_helm()


def error_of(*args: str) -> str:
    """The error `helm template` prints (its symbolic-link notice about files/dashboards aside)."""
    with pytest.raises(sync.SyncError) as err:
        sync.helm("template", "llm-sidecar", str(CHART), "--namespace", "llm", *args)
    lines = [
        ln
        for ln in str(err.value).splitlines()[1:]
        if ln.strip() and "found symbolic link" not in ln
    ]
    return "\n".join(ln for ln in lines if "Use --debug" not in ln)


def test_without_an_image_the_chart_refuses_and_says_how_to_build_one():
    text = error_of()
    assert len(text) < MAX_ERROR and "\n" not in text, text
    assert "image.repository is not set" in text and "make image-push REGISTRY=" in text


def test_monitoring_only_also_needs_the_image_it_prints_for_pasting():
    text = error_of(
        "--set", "mode=monitoring-only", "--set", "existingServer.podSelector.app=my-vllm"
    )
    assert "image.repository is not set" in text and len(text) < MAX_ERROR


IMAGE = ("--set", "image.repository=registry.example.com/team/llm-sidecar-proxy")


@pytest.mark.parametrize(
    ("sets", "reason"),
    [
        (("prometheus.rules.windows.page-fast.long=60m",), "prometheus.rules.windows.page-fast.long: write 60m as 1h"),
        (("prometheus.rules.windows.page-slow.short=2h", "prometheus.rules.windows.page-slow.long=1h"),
         "prometheus.rules.windows.page-slow: the short window (2h) must be shorter than the long one (1h)"),
        (("prometheus.rules.objectives.ttft.target=99.99.9",), None),  # the schema's own line
        (("prometheus.rules.objectives.ttft.target=100.0",), None),  # the schema's
        (("prometheus.rules.windows.ticket-slow.long=31d",), "prometheus.rules.windows.ticket-slow.long (31d) must be shorter than the period (30d)"),
    ],
)  # fmt: skip
def test_a_wrong_rules_value_fails_with_one_short_line(sets, reason):
    text = error_of(*IMAGE, *(a for s in sets for a in ("--set", s)))
    assert len(text) < MAX_ERROR, f"{len(text)} characters: {text[:300]}..."
    if reason is not None:
        assert reason in text
        assert text.count("\n") == 0, text


# ------------------------------------------------------------------------------ monitoring-only defaults


def engine_paths(*sets: str) -> list[str]:
    args = [a for s in sets for a in ("--set", s)]
    (monitor,) = sync.objects(
        sync.template(
            ["--kube-version", sync.KUBE_VERSION, "--show-only", "templates/podmonitor.yaml", *args]
        )
    )
    return [e["path"] for e in monitor["spec"]["podMetricsEndpoints"]]


MONITORING_ONLY = ("mode=monitoring-only", "existingServer.podSelector.app=my-vllm")


def test_the_engine_scrape_is_off_in_monitoring_only_and_on_in_full_unless_set():
    """A team that already scrapes vLLM would store every vllm:* series twice (and the Engine
    queue panel's sums would double) if the chart scraped /metrics/engine as well."""
    assert engine_paths() == ["/metrics", "/metrics/engine"]
    assert engine_paths(*MONITORING_ONLY) == ["/metrics"]
    assert engine_paths(*MONITORING_ONLY, "prometheus.monitor.engine.enabled=true") == [
        "/metrics",
        "/metrics/engine",
    ]
    assert engine_paths("prometheus.monitor.engine.enabled=false") == ["/metrics"]


def test_monitoring_only_notes_are_the_checklist_with_the_server_flags():
    notes = sync.render_extra(
        sync.NOTES_TEMPLATE,
        ["--kube-version", sync.KUBE_VERSION, *(a for s in MONITORING_ONLY for a in ("--set", s))],
    )["text"]
    for flag in (
        "--enable-force-include-usage",
        "--enable-per-request-metrics",
        "--enable-prompt-tokens-details",
    ):
        assert flag in notes
    assert (
        "not scraped by this release" in notes and "prometheus.monitor.engine.enabled=true" in notes
    )
    assert [int(n) for n in re.findall(r"^(\d)\. ", notes, re.MULTILINE)] == [1, 2, 3, 4, 5, 6]


FAIL = re.compile(r'fail (?:\(printf )?"((?:[^"\\]|\\.)*)"')


def test_every_refusal_in_a_tpl_file_also_runs_first_from_a_template():
    """A `fail` that only the rules' or dashboards' tpl reaches prints that whole file before
    its sentence: each must also be in a named template that templates/validate.yaml runs."""
    templates = "".join(p.read_text(encoding="utf-8") for p in (CHART / "templates").glob("*.tpl"))
    for path in [
        *(CHART / "files" / "rules").glob("*.yaml"),
        *(CHART / "files" / "dashboard-templates").glob("*.json"),
    ]:
        for message in FAIL.findall(path.read_text(encoding="utf-8")):
            assert message in templates, f"{path.name}: {message!r} fails only inside tpl"
