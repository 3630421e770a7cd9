"""Runbooks that resolve: every alert the rule generator can emit links into
docs/runbooks.md, and that file has the section its anchor names; the base of the links is
the user's to set (spec, `slo render --runbook-url`, the chart's prometheus.rules.runbookUrl),
and defaults to the file's path in the repository, not to an address that does not exist."""

from __future__ import annotations

import re

import pytest
import yaml

from sidecar.cli import main
from sidecar.tools.slo import conventions as c, generate
from sidecar.tools.slo.spec import DEFAULT_RUNBOOK_URL, load_spec
from tests.support.paths import ROOT
from tests.support.rules import SPEC, every_alert_spec

RUNBOOKS = ROOT / "docs" / "runbooks.md"


def github_anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading: lower case, punctuation
    other than - and _ dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors() -> set[str]:
    text = RUNBOOKS.read_text(encoding="utf-8")
    return {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def alerts_of(ruleset) -> list:
    return [r for g in ruleset.groups for r in g.rules if r.alert]


def test_the_heading_anchor_rule():
    assert github_anchor("Runbook: LLMTTFTBurnRate") == "runbook-llmttftburnrate"
    assert c.runbook_anchor("LLMTTFTBurnRate") == "runbook-llmttftburnrate"


@pytest.mark.parametrize("spec", ["default", "every-alert"])
def test_every_alert_links_to_a_section_of_docs_runbooks(spec):
    ruleset = generate(load_spec(str(SPEC)) if spec == "default" else every_alert_spec())
    have = anchors()
    emitted = alerts_of(ruleset)
    assert emitted
    for rule in emitted:
        url, _, anchor = rule.annotations["runbook_url"].partition("#")
        assert url == DEFAULT_RUNBOOK_URL == "docs/runbooks.md"
        assert anchor == c.runbook_anchor(rule.alert) or rule.alert.endswith("BurnRate"), rule.alert
        assert anchor in have, f"{rule.alert}: docs/runbooks.md has no section #{anchor}"


def test_every_alert_kind_has_its_section():
    """Alert names the generator can produce, by kind: each has a heading of its own."""
    names = {c.alert_name(sli) for sli in c.SLI_KINDS}
    names |= {c.ALERT_TARGET_DOWN, c.ALERT_NO_TRAFFIC, c.ALERT_HISTORY_SHORT}
    names |= {r.alert for r in alerts_of(generate(every_alert_spec()))}
    missing = sorted(n for n in names if c.runbook_anchor(n) not in anchors())
    assert not missing, f"docs/runbooks.md lacks a section for {missing}"


def test_the_default_base_is_the_file_in_the_repository_everywhere():
    assert (ROOT / DEFAULT_RUNBOOK_URL).is_file()
    assert yaml.safe_load(SPEC.read_text())["alerts"]["runbook_url"] == DEFAULT_RUNBOOK_URL
    values = yaml.safe_load((ROOT / "helm" / "llm-sidecar" / "values.yaml").read_text())
    assert values["prometheus"]["rules"]["runbookUrl"] == DEFAULT_RUNBOOK_URL
    chart = yaml.safe_load((ROOT / "helm" / "llm-sidecar" / "Chart.yaml").read_text())
    assert "home" not in chart and "sources" not in chart, "no address that does not exist"
    for path in (ROOT / "deploy" / "prometheus").glob("*.yaml"):
        links = re.findall(r"runbook_url: '?([^'#\s]+)#", path.read_text())
        assert links and set(links) == {DEFAULT_RUNBOOK_URL}, path.name


def test_slo_render_takes_the_base_url(tmp_path, capsys):
    out = tmp_path / "rules.yaml"
    url = "https://git.example.com/platform/llm-sidecar/blob/main/docs/runbooks.md"
    assert main(["slo", "render", str(SPEC), "-o", str(out), "--runbook-url", url]) == 0
    rules = [
        r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"] if "alert" in r
    ]
    assert rules and all(
        r["annotations"]["runbook_url"].startswith(url + "#runbook-") for r in rules
    )
    assert (
        main(["slo", "render", str(SPEC), "--runbook-url", "https://x.example/runbooks#top"]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--runbook-url" in err


def test_every_section_is_there_once():
    """Two sections with one heading get two anchors (GitHub suffixes the second ``-1``): an
    alert's link opens the first, and the second is a runbook nobody reaches."""
    headings = re.findall(r"^#{1,6} (.+)$", RUNBOOKS.read_text(encoding="utf-8"), re.MULTILINE)
    twice = sorted({h for h in headings if headings.count(h) > 1})
    assert not twice, f"docs/runbooks.md has these sections more than once: {twice}"


def test_each_error_cause_section_queries_what_its_alert_reads():
    """The on-call's first query is the share the alert fired on, then its own error types by pod."""
    from sidecar.tools.slo.rules import ERROR_CAUSES, ERROR_SHARE_BY_TYPE

    text = RUNBOOKS.read_text(encoding="utf-8")
    for cause in ERROR_CAUSES:
        section = text.split(f"## Runbook: {cause.alert}\n", 1)[1].split("\n## ", 1)[0]
        assert ERROR_SHARE_BY_TYPE in section, cause.alert
        assert f'error_type=~"{"|".join(cause.error_types)}"' in section, cause.alert
        assert "by (namespace, pod" in section, cause.alert
