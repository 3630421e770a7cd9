"""One version source: pyproject.toml's `version`. The package's `__version__` is read from
the installed distribution's metadata, the Makefile's image tag from pyproject.toml, and the
chart's appVersion is checked against it here."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

import yaml

import sidecar
from tests.support.paths import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_the_package_version_is_the_installed_distributions():
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", VERSION), VERSION
    # Differs after a version change until `make install` (its stamp follows pyproject.toml).
    assert sidecar.__version__ == importlib.metadata.version("llm-sidecar-proxy") == VERSION


def test_the_package_holds_no_version_of_its_own():
    text = (ROOT / "sidecar" / "__init__.py").read_text(encoding="utf-8")
    assert not re.search(r"\d+\.\d+\.\d+", text), "sidecar/__init__.py names a version"


def test_the_charts_app_version_is_the_one_source():
    chart = yaml.safe_load((ROOT / "helm" / "llm-sidecar" / "Chart.yaml").read_text("utf-8"))
    assert chart["appVersion"] == VERSION
