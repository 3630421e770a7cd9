"""The real image, built from the Dockerfile with podman (scripts/build-image.sh).

`make test-pod` installs podman (scripts/install-podman.sh) and builds the image before
running these tests (`make test-image`); run alone, the session builds it once if it is
missing. Without podman the tests skip locally and fail under CI=true.

What the tests publish on the host is only ever a port taken free at run time, and what they
create (pods, containers) is removed also when a test fails: the whole session runs with the
host's port 8000 taken on 127.0.0.1 and 0.0.0.0, as a developer's own model server would hold
it (:func:`host_port_8000_taken`).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.tools import require_tool

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


# The port a model server listens on in the chart (vLLM's default), which the tests must
# never need on the host.
MODEL_SERVER_PORT = 8000


@pytest.fixture(scope="session", autouse=True)
def host_port_8000_taken() -> Iterator[None]:
    """Listeners on 0.0.0.0:8000 and 127.0.0.1:8000 for the whole session (SO_REUSEPORT lets the
    two coexist; a bind without it, as podman's port publishing does, fails). They accept and
    close at once, so a client of the host's 8000 meanwhile gets an answer, not a full backlog.
    Where something already listens there, it is left as it is and serves the same purpose."""
    held = []
    for host in ("0.0.0.0", "127.0.0.1"):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, MODEL_SERVER_PORT))
            sock.listen()
            sock.settimeout(0.2)
            held.append(sock)
        except OSError:  # taken already: by the developer's own server, say
            sock.close()
    stop = threading.Event()

    def answer(sock: socket.socket) -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            conn.close()

    threads = [threading.Thread(target=answer, args=(sock,), daemon=True) for sock in held]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        for sock in held:
            sock.close()


def publish_ports(deployment: dict) -> dict[int, int]:
    """Gives every port the pod's containers declare a hostPort taken free now, and returns
    containerPort -> hostPort. podman 4.3's kube play publishes every declared containerPort,
    one without a hostPort on the same number: the model server's 8000 would need the host's
    8000, and the pod would fail to start wherever something listens there."""
    spec = deployment["spec"]["template"]["spec"]
    published: dict[int, int] = {}
    for container in spec.get("initContainers", []) + spec["containers"]:
        for port in container.get("ports", []):
            port["hostPort"] = published.setdefault(port["containerPort"], free_port())
    return published


def pods_named(name: str) -> list[str]:
    """The pods, in any state, whose name contains ``name`` (a Deployment's pod is
    ``<name>-pod-0``)."""
    out = podman("pod", "ps", "--filter", f"name={name}", "--format", "{{.Name}}").stdout
    return out.split()


def published_host_ports(pod: str) -> set[int]:
    """The host ports the pod's containers publish (`podman ps`'s 0.0.0.0:H->C/tcp)."""
    out = podman("ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Ports}}").stdout
    return {int(port) for port in re.findall(r":(\d+)->", out)}


@contextmanager
def kube_played(path: Path, name: str) -> Iterator[str]:
    """`podman kube play` of the Deployment named ``name`` in ``path``; yields its pod's name.
    On the way out the pod and its containers are removed, also when the play fails (a pod
    that cannot start stays in Created) or the test does: `kube down`, then `pod rm -f` of
    whatever is left under the name."""
    try:
        podman("kube", "play", str(path), timeout=180)
        pods = pods_named(name)
        assert len(pods) == 1, pods
        yield pods[0]
    finally:
        podman("kube", "down", str(path), check=False, timeout=120)
        for pod in pods_named(name):
            podman("pod", "rm", "-f", pod, check=False, timeout=120)
