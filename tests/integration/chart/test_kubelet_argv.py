"""Every rendered llm-sidecar container starts, run with the argv the kubelet would run.

The image's ENTRYPOINT and CMD (parsed from the Dockerfile) and each container's `command`
and `args` compose into one argv by Kubernetes' rules ("Define a Command and Arguments for
a Container"): `command` replaces ENTRYPOINT and drops CMD; `args` replaces CMD. The chart
once said `args: [serve]` to an image whose ENTRYPOINT already said `serve`: the pod ran
`llm-sidecar serve serve` and exited 2 at once, and nothing ran that composition. Here every
container that runs our image, in every golden render (tests/golden/helm/) and every plain
manifest (deploy/kubernetes/, the monitoring-only snippet included), is started as a real
process with its rendered environment (ports moved to free ones, the upstream to the
simulator) and must become alive and ready. The real image does the same in tests/pod.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support.image import image_entrypoint_and_cmd
from tests.support.paths import ROOT
from tests.support.serve import bound_ports, start_simulator

pytestmark = pytest.mark.integration

IMAGE_REPOSITORY = (
    "registry.example.com/team/llm-sidecar-proxy"  # scripts/sync_chart.py EXAMPLE_IMAGE
)
# Renderings of monitoring objects only (the snippet file carries monitoring-only's container).
MONITORING_ONLY = {"monitoring.yaml", "monitoring-only.yaml"}
RENDERINGS = sorted((ROOT / "tests" / "golden" / "helm").glob("*.yaml")) + sorted(
    (ROOT / "deploy" / "kubernetes").rglob("*.yaml")
)


def kubelet_argv(entrypoint: list[str], cmd: list[str], container: dict) -> list[str]:
    """What the kubelet runs for this container on this image."""
    command, args = container.get("command"), container.get("args")
    if command:
        return [*command, *(args or [])]
    return [*entrypoint, *(args if args is not None else cmd)]


def test_kubelet_argv_rules():
    entry, cmd = ["prog"], ["sub"]
    assert kubelet_argv(entry, cmd, {}) == ["prog", "sub"]
    assert kubelet_argv(entry, cmd, {"args": ["x"]}) == ["prog", "x"]
    assert kubelet_argv(entry, cmd, {"command": ["other"]}) == ["other"]
    assert kubelet_argv(entry, cmd, {"command": ["other"], "args": ["y"]}) == ["other", "y"]
    assert kubelet_argv(entry, cmd, {"args": []}) == ["prog"]


def sidecar_containers(path: Path) -> list[dict]:
    """Containers running our image in one rendered file (pod templates or a snippet list)."""
    found = []
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if isinstance(doc, list):  # the snippet: a list of containers
            candidates = doc
        elif isinstance(doc, dict) and doc.get("kind") == "Deployment":
            spec = doc["spec"]["template"]["spec"]
            candidates = spec.get("initContainers", []) + spec["containers"]
        else:
            continue
        found += [c for c in candidates if c["image"].strip('"').split(":")[0] == IMAGE_REPOSITORY]
    return found


def test_every_rendering_has_a_sidecar_container():
    names = {p.name for p in RENDERINGS}
    assert {"default.yaml", "llm-sidecar.yaml", "sidecar-container.yaml"} <= names
    without = {p.name for p in RENDERINGS if not sidecar_containers(p)}
    assert without == MONITORING_ONLY


def literal_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def local_executable(argv0: str) -> str:
    """The console script installed beside this Python, as the image's PATH has it."""
    found = shutil.which(argv0, path=str(Path(sys.executable).parent))
    assert found, f"{argv0} is not installed in this environment"
    return found


@pytest.fixture(scope="module")
def simulator():
    exe = local_executable("llm-sidecar")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_SIDECAR_", "OTEL_"))}
    proc, port = start_simulator(
        "--ttft", "0.01", "--tpot", "0.001", "--tokens", "3", command=(exe,), env=env
    )
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


async def _ready(out: Path, proc: subprocess.Popen, err: Path) -> None:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited {proc.returncode}: {err.read_text()}"
            ports = bound_ports(
                out.read_text()
            )  # port 0: the ports it bound, from its started line
            if ports is None:
                await asyncio.sleep(0.05)
                continue
            admin = f"http://127.0.0.1:{ports[1]}"
            try:
                async with (
                    http.get(f"{admin}/healthz") as alive,
                    http.get(f"{admin}/readyz") as ready,
                ):
                    if alive.status == 200 and ready.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"not ready within 30 s: {err.read_text()}")


@pytest.mark.parametrize(
    "path",
    [p for p in RENDERINGS if p.name not in MONITORING_ONLY],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_rendered_sidecar_starts_with_the_kubelets_argv(path, simulator, tmp_path):
    containers = sidecar_containers(path)
    assert containers
    entrypoint, cmd = image_entrypoint_and_cmd()
    for i, container in enumerate(containers):
        argv = kubelet_argv(entrypoint, cmd, container)
        argv[0] = local_executable(argv[0])
        env = literal_env(container)
        for name in [k for k in env if k.startswith("OTEL_EXPORTER_OTLP")] + [
            "LLM_SIDECAR_OTEL_METRICS"
        ]:
            env.pop(name, None)  # no collector here
        env.update(
            LLM_SIDECAR_UPSTREAM=simulator,
            LLM_SIDECAR_LISTEN="127.0.0.1:0",
            LLM_SIDECAR_METRICS_LISTEN="127.0.0.1:0",
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_SIDECAR_", "OTEL_"))}
        out, err = tmp_path / f"out-{i}", tmp_path / f"err-{i}"
        proc = subprocess.Popen(
            argv, env={**base, **env}, stdout=out.open("w"), stderr=err.open("w")
        )
        try:
            asyncio.run(_ready(out, proc, err))
        finally:
            # (SIGTERM would drain for as long as the simulator answers: tests/integration/app/test_rollout.py)
            proc.kill()
            proc.wait()
