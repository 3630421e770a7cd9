"""The suite's one skip rule: a test that cannot run skips locally with its reason, and fails
when ``CI=true``, unless its reason is on :data:`ALLOWED`.

A skip on a developer's machine says "install this to run me"; the same skip in CI would be a
green run that never ran the test. So every skip, wherever it is raised (``pytest.skip``,
``importorskip`` at module level, a ``skipif`` mark, a helper in ``tests/support/``), is turned
into a failure here under ``CI=true``, and what CI's machine needs is installed by the
project's own files (the ``test`` extra, ``scripts/system-deps.sh``, ``make tools``). The
allow-list holds only what no install step can give a machine, each entry with its reason.

Registered from ``tests/conftest.py`` (``pytest_plugins``); tested by
``tests/unit/test_skip_rule.py``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from dataclasses import dataclass

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class AllowedSkip:
    """A skip reason (a regular expression searched in it) that stays a skip under CI=true."""

    reason: re.Pattern[str]
    why: str


ALLOWED: tuple[AllowedSkip, ...] = (
    AllowedSkip(
        re.compile(r" is not in REAL_SERVERS$"),
        "REAL_SERVERS=a,b is a developer's choice to start only some real servers; CI sets "
        "none, so nothing is filtered there.",
    ),
    AllowedSkip(
        re.compile(r"^no IPv6 on this host$"),
        "a host (or container) started without an IPv6 loopback cannot be given one by an "
        "install step.",
    ),
    AllowedSkip(
        re.compile(r"^needs \d+ CPUs\b"),
        "the number of CPUs is the machine's size, not something the project installs.",
    ),
)


def skip_reason(longrepr: object) -> str:
    """The reason a skip report carries (``(path, line, "Skipped: why")`` for a skip)."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


def allowed(reason: str) -> AllowedSkip | None:
    """The allow-list entry that lets ``reason`` stay a skip under CI=true, if any."""
    return next((entry for entry in ALLOWED if entry.reason.search(reason)), None)


def _failure(reason: str) -> str:
    return (
        f"skipped under CI=true: {reason}\n"
        "CI must run every test: install what it needs through the project's own files "
        "(the test extra in pyproject.toml, scripts/system-deps.sh, make tools), or, if no "
        "install can provide it, add the reason to ALLOWED in tests/support/skips.py with why."
    )


def _fail_unless_allowed(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not (IN_CI and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report.longrepr)
    if allowed(reason) is None:
        report.outcome = "failed"
        report.longrepr = _failure(reason)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _fail_unless_allowed(report)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _fail_unless_allowed(report)
    return report
