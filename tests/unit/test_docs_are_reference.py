"""Code and docs say what is and why; the history is CHANGELOG.md's.

An issue or session reference (``#33``, ``issue 23``, ``issues 22, 32``, ``session 9``) in
sidecar/, docs/ or README.md means nothing to a reader without the tracker, and goes stale as
the code moves on. Legitimate ``#`` text stays legal: Markdown headings, link anchors
(``docs/kubernetes.md#which-pods-a-release-judges``), hex colours (``#73BF69``), Python
comments, URLs' fragments, a numbered table's ``| # |`` column, and another project's pull
requests cited by name (``PRs #521 and #374`` of the GenAI conventions' repository).

And README's first screen tells a newcomer what they came for, in order: why this instead of
the engine's own metrics or a gateway, then the 30-second demo, then Kubernetes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIRST_SCREEN_LINES = 40

# `#` followed by digits, not part of a word, an anchor or a hex colour: preceded by start,
# whitespace or an opening bracket/quote, and not followed by more hex digits or a word
# character. "#73BF69" (a colour) and "#runbook-x" (an anchor) do not match; "#33", "(#24)",
# "#33," do.
HASH_REF = re.compile(r"(?:^|(?<=[\s(\[\"'`]))#\d{1,5}(?![0-9A-Za-z_-])")
WORD_REF = re.compile(r"\b(?:issues?|sessions?)\s+#?\d+", re.IGNORECASE)
# Another repository's pull requests, named as such: a citation, not this project's history.
CITED_PR = re.compile(r"\b(?:PRs?|pull requests?)\s+#\d+(?:(?:,\s*|,?\s+and\s+)#\d+)*")


def _sources() -> list[Path]:
    files = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for path in sorted((ROOT / "sidecar").rglob("*")):
        if path.suffix in {".py", ".pyi", ".c", ".h", ".md", ".yaml", ".json"} and path.is_file():
            files.append(path)
    return files


def references(text: str) -> list[str]:
    """Every issue or session reference in ``text``, as found."""
    text = CITED_PR.sub("", text)
    return [m.group(0) for m in HASH_REF.finditer(text)] + [
        m.group(0) for m in WORD_REF.finditer(text)
    ]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("the label's name before #32: renamed", ["#32"]),
        ("(#27, session 9)", ["#27", "session 9"]),
        ("sends a request (issue 33, finding 13)", ["issue 33"]),
        ("Rules (issues 22, 32, 33)", ["issues 22"]),
        ("#24 first", ["#24"]),
        ("see Issue #21.", ["#21", "Issue #21"]),
        ("a colour #73BF69, #F2495C and #FF9830", []),
        ("[runbook](docs/runbooks.md#runbook-llmsidecardown)", []),
        ("## Heading\n# comment: 3 bytes\n| # | probe |", []),
        ("x = y  # 16 bytes: see RFC 9110 §8.6", []),
        ("https://example.com/page#section-2", []),
        ("a tissue 5 cm, a session cookie", []),
        ("renamed them ([PRs #521 and #374](https://example.com/m.md))", []),
        ("the upstream's PR #12, pull requests #3, #4", []),
        ("PR #12 and then #13 in ours", ["#13"]),
    ],
)
def test_the_reference_finder_tells_references_from_legitimate_text(text, found):
    assert references(text) == found


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_or_session_reference_outside_the_changelog(path):
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {ref}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for ref in references(line)
    ]
    assert not hits, "history belongs in CHANGELOG.md:\n" + "\n".join(hits)


def test_the_sources_cover_the_runtime_and_every_page():
    names = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert {"README.md", "docs/design.md", "docs/performance.md", "sidecar/cli.py"} <= names
    assert "CHANGELOG.md" not in names


def test_changelog_keeps_a_changelog_with_an_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    for kind in ("Added", "Changed", "Fixed", "Removed"):
        assert f"\n### {kind}\n" in unreleased, kind


def _first_line(lines: list[str], predicate) -> int:
    return next((i for i, line in enumerate(lines) if predicate(line)), len(lines))


def test_readme_first_screen_names_the_comparison_then_the_demo_then_kubernetes():
    lines = README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN_LINES]
    comparison = _first_line(lines, lambda ln: ln.startswith("|") and "vllm:" in ln)
    row = lines[comparison] if comparison < len(lines) else ""
    for engine_metric in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
        assert engine_metric in row, "the comparison table names the engine's own histograms"
    table = "\n".join(ln for ln in lines if ln.startswith("|"))
    for alternative in ("LiteLLM", "Envoy AI Gateway", "llm-d"):
        assert alternative in table, alternative
    demo = _first_line(lines, lambda ln: ln.startswith("make demo"))
    kubernetes = _first_line(lines, lambda ln: ln.startswith("#") and "kubernetes" in ln.lower())
    assert comparison < demo < kubernetes < len(lines), (
        f"first {FIRST_SCREEN_LINES} lines: comparison at {comparison}, make demo at {demo}, "
        f"the Kubernetes heading at {kubernetes}"
    )
