"""External tools a test runs (promtool, helm, kubectl, make, ...), found on PATH."""

from __future__ import annotations

import shutil

import pytest

from tests.support.skips import IN_CI


def require_tool(name: str) -> str:
    """Path of an external tool; skip locally when missing, but fail in CI (CI=true)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (the repo's install step provides it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path
