"""The skip rule (tests/support/skips.py) in a pytest run of its own: under CI=true a skip
fails unless its reason is on the allow-list; without CI it stays a skip."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.skips import ALLOWED, allowed

ROOT = Path(__file__).resolve().parents[2]

CASES = """
import pytest

def test_missing_tool():
    pytest.skip("kubectl is not installed")

@pytest.mark.skipif(True, reason="h11 (the reference parser) is not installed")
def test_skipif_mark():
    pass

def test_ipv6():
    pytest.skip("no IPv6 on this host")

def test_cpus():
    pytest.skip("needs 2 CPUs to give two processes one each")

def test_real_server_filtered():
    pytest.skip("vllm is not in REAL_SERVERS")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False

def test_runs():
    assert True
"""

MODULE_SKIP = """
import pytest
pytest.importorskip("no_such_module_anywhere")

def test_never_collected():
    pass
"""


def run_pytest(tmp_path: Path, ci: bool) -> dict[str, str]:
    """Each test's (or module's) outcome in a pytest run of the cases above."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("tests.support.skips",)\n')
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PYTHONPATH=str(ROOT), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    if ci:
        env["CI"] = "true"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider",
         "--continue-on-collection-errors", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    outcomes: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if m := re.match(r"(PASSED|FAILED|ERROR|XFAIL) (test_\w+\.py)(?:::(\w+))?", line):
            outcomes[m[3] or m[2]] = m[1]
        elif m := re.match(r"SKIPPED \[\d+\] (test_\w+\.py):\d+: (.*)", line):
            outcomes[m[2]] = "SKIPPED"
    assert outcomes, done.stdout + done.stderr
    return outcomes


def test_under_ci_a_skip_fails_unless_its_reason_is_allowed(tmp_path):
    outcomes = run_pytest(tmp_path, ci=True)
    assert outcomes == {
        "test_missing_tool": "FAILED",
        "test_skipif_mark": "ERROR",  # a mark skips at set-up: a set-up error
        "test_module_skip.py": "ERROR",
        "no IPv6 on this host": "SKIPPED",
        "needs 2 CPUs to give two processes one each": "SKIPPED",
        "vllm is not in REAL_SERVERS": "SKIPPED",
        "test_expected_failure": "XFAIL",
        "test_runs": "PASSED",
    }


def test_without_ci_every_skip_stays_a_skip(tmp_path):
    outcomes = run_pytest(tmp_path, ci=False)
    assert [o for o in outcomes.values()].count("SKIPPED") == 6
    assert outcomes["test_runs"] == "PASSED" and outcomes["test_expected_failure"] == "XFAIL"


@pytest.mark.parametrize(
    "reason",
    ["kubectl is not installed", "make is not installed", "not an object",
     "needs a finite hard limit above 256", "h11 (the reference parser) is not installed"],
)  # fmt: skip
def test_a_missing_install_is_not_on_the_allow_list(reason):
    assert allowed(reason) is None


def test_every_allowed_skip_says_why():
    assert len(ALLOWED) <= 5, "the allow-list stays short: install what CI needs instead"
    assert all(len(entry.why) > 40 for entry in ALLOWED)
