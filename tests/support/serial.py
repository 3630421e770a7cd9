"""Tests that run alone while the suite runs in parallel (``pytest -n 2``, as ``make test``).

Most tests wait on sockets, subprocesses and timers, so two pytest-xdist workers on two cores
finish the suite in about half the time. A few judge the machine's pace against a fixed bound
(a healthy load must stay within its latency objective, an export must finish inside a grace
window): beside a second worker's CPU-bound test they can miss it though nothing is wrong.
Those are listed in :data:`SERIAL` with why; each takes the suite's lock alone, so the other
worker waits between two of its tests until that one is done, and they run as they do in a
serial run. Without xdist this plugin does nothing.

The lock is a readers-writer lock over two files (``flock``): every test holds it shared, a
serial test exclusive; both pass through a turnstile first, so a serial test waiting for the
lock is not starved by the other worker's next tests. The files live in a folder the
controller makes for the run (``workerinput``), so two suites run side by side on one machine
do not wait for each other.

Registered from ``tests/conftest.py`` (``pytest_plugins``); tested by
``tests/unit/test_serial_lock.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

SERIAL: dict[str, str] = {
    "tests/integration/tools/test_alert_delivery.py::": (
        "its healthy load must stay within the TTFT objective (no burn recorded): a second "
        "worker's CPU-bound test slows the sidecar's answers past it"
    ),
    "tests/unit/export/test_otlp_health.py::test_a_collector_gone_at_shutdown_": (
        "0.2 s exports must each finish inside the 0.5 s window the shutdown waits on a "
        "healthy exporter"
    ),
}
"""Node-id prefixes of the tests that run alone, each with why."""

_DIR_KEY = "serial_lock_dir"
_folder = pytest.StashKey[Path]()


def is_serial(nodeid: str) -> bool:
    return any(nodeid.startswith(prefix) for prefix in SERIAL)


@contextlib.contextmanager
def held(folder: Path, *, alone: bool) -> Iterator[None]:
    """The suite's lock in ``folder``: exclusive when ``alone``, else shared with other tests."""
    with open(folder / "turnstile", "a") as turnstile, open(folder / "suite", "a") as suite:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(suite, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(suite, fcntl.LOCK_UN)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "serial: runs alone under pytest -n (tests/support/serial.py)"
    )
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        config.stash[_folder] = Path(tempfile.mkdtemp(prefix="pytest-serial-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_folder, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """xdist, on the controller: every worker is handed the run's lock folder."""
    folder = node.config.stash.get(_folder, None)  # type: ignore[attr-defined]
    if folder is not None:
        node.workerinput[_DIR_KEY] = str(folder)  # type: ignore[attr-defined]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_serial(item.nodeid):
            item.add_marker(pytest.mark.serial)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    folder = getattr(item.config, "workerinput", {}).get(_DIR_KEY)
    if folder is None or not os.path.isdir(folder):
        return (yield)
    with held(Path(folder), alone=item.get_closest_marker("serial") is not None):
        return (yield)
