"""The chart's render helpers for tests: ``scripts/sync_chart.py`` loaded once as a module.

The script is the one source of how the chart is rendered (the pinned helm, the golden
cases, the plain manifests); tests import it through here rather than each loading it again.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "llm-sidecar"


def load_sync() -> ModuleType:
    """``scripts/sync_chart.py`` as the module ``sync_chart`` (one instance per process)."""
    loaded = sys.modules.get("sync_chart")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("sync_chart", ROOT / "scripts" / "sync_chart.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sync_chart"] = module
    spec.loader.exec_module(module)
    return module


sync = load_sync()


def require_helm() -> None:
    """Skip without the pinned helm locally; fail in CI (``make tools`` installs it)."""
    if not sync.HELM.exists():
        message = f"{sync.HELM} is missing (make tools)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
