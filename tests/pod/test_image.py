"""The image as `docker run` users meet it: read-only, uid 10001, `serve` by default and
`simulate` on request, a stream relayed through it."""

from __future__ import annotations

import json
import uuid

import aiohttp
import pytest

from tests.pod.conftest import podman
from tests.support.http import wait_status
from tests.support.ports import free_port

pytestmark = pytest.mark.pod


def test_runs_as_uid_10001_on_a_read_only_root(image):
    out = podman("run", "--rm", "--read-only", "--entrypoint", "id", image, "-u").stdout.strip()
    assert out == "10001"
    denied = podman(
        "run",
        "--rm",
        "--read-only",
        "--entrypoint",
        "touch",
        image,
        "/opt/llm-sidecar/x",
        check=False,
    )
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr


def test_the_image_relays_with_the_c_byte_checks(image):
    """The build stage compiles sidecar/base/_speedups.c (Dockerfile: gcc, and Python's
    headers where the base lacks them); the runtime image keeps no compiler."""
    code = "from sidecar.base import speedups; print(speedups.IN_C)"
    out = podman(
        "run",
        "--rm",
        "--read-only",
        "--no-healthcheck",
        "--entrypoint",
        "python",
        image,
        "-c",
        code,
    )
    assert out.stdout.strip() == "True"
    gcc = podman(
        "run",
        "--rm",
        "--no-healthcheck",
        "--entrypoint",
        "sh",
        image,
        "-c",
        "command -v gcc || echo none",
    )
    assert gcc.stdout.strip() == "none"


def test_the_oci_labels_name_no_repository_unless_given(image):
    """scripts/build-image.sh gives no SOURCE_URL build argument: the source label is empty
    (the project has no public repository), the licence label is pyproject's."""
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", image).stdout)
    assert labels["org.opencontainers.image.source"] == ""
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_a_bad_setting_exits_with_one_line(image):
    # (--no-healthcheck: podman would set up the image's HEALTHCHECK with systemd, absent here,
    # and say so on the same stderr)
    proc = podman(
        "run",
        "--rm",
        "--read-only",
        "--no-healthcheck",
        image,
        "serve",
        "--upstream",
        "ftp://nowhere",
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "upstream" in proc.stderr


async def test_default_command_serves_and_simulate_runs_from_the_same_image(image):
    """`podman run IMAGE` (ENTRYPOINT + CMD) is `llm-sidecar serve`; `podman run IMAGE
    simulate` is the simulator; a stream passes through both, read-only."""
    tag = uuid.uuid4().hex[:8]
    up, proxy, admin = free_port(), free_port(), free_port()
    names = [f"llm-sidecar-test-sim-{tag}", f"llm-sidecar-test-serve-{tag}"]
    common = ["run", "-d", "--read-only", "--network", "host"]
    try:
        podman(*common, "--name", names[0], image, "simulate", "--listen", f"127.0.0.1:{up}", "--ttft", "0.01",
               "--tpot", "0.001", "--tokens", "5")  # fmt: skip
        podman(*common, "--name", names[1], "-e", f"LLM_SIDECAR_UPSTREAM=http://127.0.0.1:{up}",
               "-e", f"LLM_SIDECAR_LISTEN=127.0.0.1:{proxy}", "-e", f"LLM_SIDECAR_METRICS_LISTEN=127.0.0.1:{admin}",
               image)  # fmt: skip
        await wait_status(f"http://127.0.0.1:{admin}/readyz", 200)
        body = {
            "model": "sim-llama-3-8b",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{proxy}/v1/chat/completions", json=body) as r:
                assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
            async with s.get(f"http://127.0.0.1:{admin}/metrics") as r:
                assert (
                    'llm_requests_total{code="200",error_type="none",model="sim-llama-3-8b"'
                    in await r.text()
                )
        inspect = podman(
            "inspect", "--format", "{{.Config.Cmd}} {{.Config.Entrypoint}}", names[1]
        ).stdout
        assert "serve" in inspect and "llm-sidecar" in inspect
    finally:
        for name in names:
            podman("rm", "-f", "-t", "0", name, check=False)
