"""The distribution's name and extras."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_distribution_name_is_not_the_taken_one():
    # `pip index versions llm-sidecar` lists another project's releases (0.6.0 ...).
    assert PYPROJECT["project"]["name"] == "llm-sidecar-proxy"
    assert PYPROJECT["project"]["scripts"]["llm-sidecar-proxy"] == "sidecar.cli:main"


def test_the_tools_dependencies_are_an_extra_named_in_the_docs():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert any(dep.startswith("grafana-foundation-sdk") for dep in extras["tools"])
    # One name for the tools: nothing is released, so no second name is kept for old installs.
    assert [name for name, deps in extras.items() if deps == extras["tools"]] == ["tools"]
    assert not any(dep.startswith("grafana") for dep in PYPROJECT["project"]["dependencies"])
    assert "llm-sidecar-proxy[tools]" in (ROOT / "docs" / "dashboards.md").read_text()


def test_dashboards_generator_names_the_extra_when_the_sdk_is_missing(tmp_path):
    (tmp_path / "grafana_foundation_sdk.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'grafana_foundation_sdk'\", name='grafana_foundation_sdk')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "sidecar.tools.dashboards", "--check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode != 0
    assert "pip install 'llm-sidecar-proxy[tools]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_licence_text_is_the_one_pyproject_and_the_image_name():
    """Legal review reads LICENSE; pip, the wheel's metadata and the image label must say the
    same licence, and the text must be the Apache-2.0 text itself, whole."""
    text = (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    assert text.lstrip().startswith(
        "Apache License\n                           Version 2.0, January 2004"
    )
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.split("\n")) > 200  # the whole text, appendix included
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()


def test_the_wheel_ships_py_typed_and_a_stub_for_each_c_extension():
    """PEP 561: ``py.typed`` marks the package as typed for its users' type checkers, and each
    C extension's signatures are in a ``.pyi`` beside it; package-data puts both in the wheel."""
    from fnmatch import fnmatch  # noqa: PLC0415

    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert (ROOT / "sidecar" / "py.typed").is_file()
    assert "py.typed" in data["sidecar"]
    extensions = PYPROJECT["tool"]["setuptools"]["ext-modules"]
    assert extensions
    for ext in extensions:
        package, _, module = ext["name"].rpartition(".")
        stub = ROOT / Path(*package.split(".")) / f"{module}.pyi"
        assert stub.is_file(), f"{ext['name']} has no stub"
        assert any(fnmatch(stub.name, pattern) for pattern in data.get(package, [])), package
