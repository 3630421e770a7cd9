"""The chart's render helpers for tests: ``scripts/sync_chart.py`` loaded once as a module,
and rendering the chart (default values, or one release of a fleet).

The script is the one source of how the chart is rendered (the pinned helm, the golden
cases, the plain manifests); tests import it through here rather than each loading it again.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sidecar.tools.slo.helm import release_id
from tests.support.paths import CHART, ROOT
from tests.support.skips import IN_CI


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


def render(*args: str) -> list[dict]:
    """The chart's objects for the default release with ``args`` (``--set`` and the like)."""
    return sync.objects(sync.template(["--kube-version", sync.KUBE_VERSION, *args]))


def render_error(*args: str) -> str:
    """The error ``helm template`` refuses ``args`` with."""
    with pytest.raises(sync.SyncError) as err:
        sync.template(["--kube-version", sync.KUBE_VERSION, *args])
    return str(err.value)


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


# -- a fleet: three releases of the chart in two namespaces, one Prometheus ----------------------

OBJECTIVES = "prometheus.rules.objectives"
# (release, namespace, extra --set, model, share of slow first tokens in permille)
RELEASES = (
    ("a", "team-a", (), "llama", 30),
    ("b", "team-b", (f"{OBJECTIVES}.ttft.target=99",), "llama", 5),
    ("c", "team-a", (), "qwen", 800),
)


def deployment(release: str) -> str:
    return f"{release}-llm-sidecar"  # the chart's fullname for a release not named like it


def rid(release: str) -> str:
    """The release's ``llm_release`` value."""
    namespace = next(ns for r, ns, *_ in RELEASES if r == release)
    return release_id(namespace, deployment(release))


def render_release(
    release: str, namespace: str, sets: tuple[str, ...], chart: Path = CHART
) -> list[dict]:
    args = [a for s in sets for a in ("--set", s)]
    return sync.objects(
        sync.helm("template", release, str(chart), "--namespace", namespace,
                  "--kube-version", sync.KUBE_VERSION, "--set", f"image.repository={sync.EXAMPLE_IMAGE}", *args, chart=chart)
    )  # fmt: skip
