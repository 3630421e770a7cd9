"""`make image` builds the image the chart runs and nothing else (for kind or minikube to
load); `make image-push` builds the same and pushes it; the podman test image is
`make test-image`'s. The recipes are read from make itself (`make -n`); the image's OCI
source label is a build argument, empty unless given."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib

from tests.support.image import final_stage
from tests.support.paths import ROOT
from tests.support.tools import require_tool

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
NAME = f"registry.example.com/team/llm-sidecar-proxy:{VERSION}"


def make(*args: str, dry: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(
        [require_tool("make"), "--no-print-directory", *(["-n"] if dry else []), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def commands(done: subprocess.CompletedProcess) -> list[str]:
    """The recipe's commands, without the REGISTRY guard."""
    assert done.returncode == 0, done.stderr
    return [ln for ln in done.stdout.splitlines() if not ln.startswith("test -n")]


def test_make_image_builds_the_charts_image_and_nothing_else():
    assert commands(make("image", "REGISTRY=registry.example.com/team")) == [
        f"docker build -t {NAME} ."
    ]


def test_make_image_push_builds_the_same_image_and_pushes_it():
    built = commands(make("image", "REGISTRY=registry.example.com/team", "CONTAINER=podman"))
    pushed = commands(make("image-push", "REGISTRY=registry.example.com/team", "CONTAINER=podman"))
    assert pushed == [*built, f"podman push {NAME}"]


def test_the_registry_is_required_and_the_usage_says_so():
    for target in ("image", "image-push"):
        done = make(target, dry=False)
        assert done.returncode == 2
        assert f"usage: make {target} REGISTRY=registry.example.com/team" in done.stderr


def test_the_test_image_is_a_target_of_its_own():
    """The podman build on a debootstrapped base belongs to the pod tests, not to `image`."""
    lines = commands(make("test-image"))
    assert lines == ["bash scripts/install-podman.sh", "bash scripts/build-image.sh"]
    (prerequisites,) = re.findall(r"^test-pod:(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert "test-image" in prerequisites.split() and "image" not in prerequisites.split()


def test_the_source_label_is_a_build_argument_empty_unless_given():
    stage = final_stage()
    assert ("ARG", 'SOURCE_URL=""') in stage
    (label,) = [args for instruction, args in stage if instruction == "LABEL"]
    assert 'org.opencontainers.image.source="${SOURCE_URL}"' in label
    assert "github.com" not in (ROOT / "Dockerfile").read_text(encoding="utf-8")
    given = commands(
        make("image", "REGISTRY=registry.example.com/team", "SOURCE_URL=https://git.example/x")
    )
    assert given == [f"docker build -t {NAME} . --build-arg 'SOURCE_URL=https://git.example/x'"]
