"""The committed dashboards and their kustomization are exactly what the generator makes.

Refresh after changing the generator (sidecar/tools/dashboards/) or the SLO spec:
    python -m sidecar.tools.dashboards
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sidecar.tools.dashboards import DEFAULT_SPEC, KUSTOMIZATION, build_dashboards, render_files
from sidecar.tools.dashboards.render import GENERATED_HEADER
from sidecar.tools.slo import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC_DATA = yaml.safe_load((ROOT / DEFAULT_SPEC).read_text(encoding="utf-8"))
EXPECTED = render_files(load_spec(str(ROOT / DEFAULT_SPEC)))


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_committed_file_is_what_the_generator_makes(path):
    committed = (ROOT / path).read_text(encoding="utf-8")
    expected = EXPECTED[path]
    if committed != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(True), expected.splitlines(True), path, "generated"
                )
            )[:60]
        )
        pytest.fail(f"{path} is stale; refresh it:\n  python -m sidecar.tools.dashboards\n{diff}")


def test_every_generated_file_is_accounted_for():
    dashboards = {f"dashboards/{p.name}" for p in (ROOT / "dashboards").iterdir()}
    assert dashboards == {p for p in EXPECTED if p.startswith("dashboards/")}
    assert len([p for p in dashboards if p.endswith(".json")]) == 2
    assert (ROOT / KUSTOMIZATION).read_text(encoding="utf-8").startswith(GENERATED_HEADER + "\n")


def test_kustomization_makes_one_configmap_per_json_file():
    """`kubectl apply -k dashboards/` reads the JSON files themselves (no second copy)."""
    k = yaml.safe_load((ROOT / KUSTOMIZATION).read_text(encoding="utf-8"))
    assert k["kind"] == "Kustomization"
    assert k["generatorOptions"]["labels"]["grafana_dashboard"] == "1"
    assert k["generatorOptions"]["disableNameSuffixHash"] is True, (
        "a stable name: re-applying replaces it"
    )
    files = sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))
    assert [g["files"] for g in k["configMapGenerator"]] == [[name] for name in files]
    assert [g["name"] for g in k["configMapGenerator"]] == [
        name.removesuffix(".json") for name in files
    ]


def kustomize_build() -> list[dict]:
    """`kubectl kustomize dashboards/` (kubectl carries kustomize): the test extra's kubectl,
    beside the interpreter, before one on PATH."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    kubectl = shutil.which("kubectl", path=search)
    if kubectl is None:
        pytest.skip("kubectl is not installed (the test extra installs it: make install)")
    proc = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "dashboards")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


def test_kustomize_builds_configmaps_carrying_the_json_files_byte_for_byte():
    docs = kustomize_build()
    assert len(docs) == 2
    for doc in docs:
        assert doc["kind"] == "ConfigMap" and doc["apiVersion"] == "v1"
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert doc["metadata"]["annotations"]["grafana_folder"] == "LLM"
        ((name, text),) = doc["data"].items()
        assert doc["metadata"]["name"] == name.removesuffix(".json")
        assert text == (ROOT / "dashboards" / name).read_text(encoding="utf-8")
        assert len(json.dumps(doc)) < 256 * 1024  # kubectl apply's last-applied annotation limit


def test_kustomized_configmaps_validate_against_the_kubernetes_schema():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in kustomize_build():
        kubernetes_validate.validate(doc, "1.29.0", strict=True)


def test_the_command_writes_the_same_files_and_check_reports_stale(tmp_path):
    (tmp_path / "deploy" / "slo").mkdir(parents=True)
    (tmp_path / DEFAULT_SPEC).write_text(
        (ROOT / DEFAULT_SPEC).read_text(encoding="utf-8"), encoding="utf-8"
    )
    cmd = [sys.executable, "-m", "sidecar.tools.dashboards", "--root", str(tmp_path)]
    stale = subprocess.run([*cmd, "--check"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert stale.returncode == 1 and "stale" in stale.stderr
    assert not (tmp_path / "dashboards").exists()
    wrote = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert wrote.returncode == 0, wrote.stderr
    for path, text in EXPECTED.items():
        assert (tmp_path / path).read_text(encoding="utf-8") == text, path
    again = subprocess.run([*cmd, "--check"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert again.returncode == 0, again.stderr


def test_the_slo_dashboard_follows_the_spec():
    """A 28d period moves the burn-rate thresholds the way it moves the alert factors."""
    data = {**SPEC_DATA, "period": "28d"}
    d = build_dashboards(parse_spec(data))["llm-sidecar-slo.json"]
    titles = [p["title"] for p in d["panels"]]
    assert "ttft: burn rate 1h / 5m (page above 13.44×)" in titles
    assert "ttft: burn rate 3d / 6h (ticket above 0.933333×)" in titles
    assert "ttft: SLI over 28d" in titles
