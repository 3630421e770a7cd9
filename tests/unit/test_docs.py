"""README and docs/ as a newcomer reads them: the first screen says how to run it
beside vLLM, every link leads somewhere, and the example sends a model the simulator serves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.cli import _build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(page):
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: {target}"


def test_no_reference_outside_the_repository():
    for page in PAGES:
        assert "../shared" not in page.read_text(encoding="utf-8"), page.name


def test_first_screen_has_kubernetes_quick_start_and_the_two_commands():
    first_screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:60])
    for needed in (
        "helm install llm-sidecar helm/llm-sidecar",
        "make demo",
        "make test",
        "## Contents",
    ):
        assert needed in first_screen, needed


def test_front_of_server_example_asks_for_the_model_the_simulator_serves():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Put it in front of a server", 1)[1].split("\n## ", 1)[0]
    simulate = next(
        a
        for a in _build_parser()._actions
        if getattr(a, "choices", None) and "simulate" in a.choices
    ).choices["simulate"]
    served = simulate.get_default("model")
    assert "llm-sidecar simulate" in section
    assert re.findall(r'"model":"([^"]+)"', section) == [served]
    # The sidecar relays the client's path as-is, so the upstream is the server's root.
    assert re.search(r"--upstream http://127\.0\.0\.1:8000 ", section)


def test_every_runbook_the_alerts_link_to_stays_in_docs_runbooks():
    """Deployed PrometheusRules link to docs/runbooks.md#runbook-<alert>; moving a runbook out
    would break links in alerts already firing somewhere
    (tests/unit/tools/slo/test_runbooks.py checks every alert the generator emits)."""
    text = (README.parent / "docs" / "runbooks.md").read_text(encoding="utf-8")
    for alert in (
        "LLMAvailabilityBurnRate",
        "LLMTTFTBurnRate",
        "LLMSidecarDown",
        "LLMNoTrafficData",
        "LLMSLOHistoryShort",
    ):
        assert f"## Runbook: {alert}\n" in text
    assert "[docs/runbooks.md](docs/runbooks.md)" in README.read_text(encoding="utf-8")
