"""The real image, built from the Dockerfile with podman (scripts/build-image.sh).

`make test-pod` installs podman (scripts/install-podman.sh) and builds the image before
running these tests; run alone, the session builds it once if it is missing. Without podman
the tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import require_tool

ROOT = Path(__file__).resolve().parents[2]
# LLM_SIDECAR_POD_IMAGE: another build to test (e.g. an old one, to see these tests fail on it).
IMAGE = os.environ.get("LLM_SIDECAR_POD_IMAGE", "localhost/llm-sidecar:test")


def podman(
    *args: str, check: bool = True, timeout: float = 120, **kwargs
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, **kwargs
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def image() -> str:
    require_tool("podman")
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        subprocess.run(["bash", str(ROOT / "scripts" / "build-image.sh"), IMAGE.split("/", 1)[1]],
                       check=True, timeout=900)  # fmt: skip
    return IMAGE
