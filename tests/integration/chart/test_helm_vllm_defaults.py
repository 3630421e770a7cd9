"""Chart defaults a vLLM operator would pick: the vLLM release the tests prove,
the server options the dashboards read on vLLM's default command line only, resources, a
model cache, and a rollout that needs no spare GPU.
Skipped without helm (make tools) locally; fails under CI=true."""

from __future__ import annotations

import pytest

from tests.support.chart import by_kind, render, sync
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

FLAGS = ["--enable-force-include-usage", "--enable-per-request-metrics"]


@pytest.fixture(scope="module")
def helm_ok():
    if not sync.HELM.exists():
        require_tool(str(sync.HELM))  # skips locally, fails under CI=true


def model_server(*args: str) -> tuple[dict, dict]:
    (deployment,) = by_kind(render(*args), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (server,) = [c for c in pod["containers"] if c["name"] == "model-server"]
    return deployment, server


def test_default_model_server_is_current_vllm_with_the_dashboards_flags(helm_ok):
    deployment, server = model_server()
    assert server["image"] == "vllm/vllm-openai:v0.32.0"
    assert server["args"][-2:] == FLAGS
    assert (
        server["resources"]["requests"]["memory"]
        and server["resources"]["limits"]["nvidia.com/gpu"] == 1
    )
    mount = next(m for m in server["volumeMounts"] if m["name"] == "model-cache")
    assert mount["mountPath"] == "/root/.cache/huggingface"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"] == {"name": "model-cache", "emptyDir": {"sizeLimit": "50Gi"}}
    # One GPU per pod: never a surge pod waiting for a spare GPU.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_vllm_flags_stay_off_another_servers_command_line(helm_ok):
    _, server = model_server("--set", "modelServer.args={--model-path,m,--port,port}")
    assert server["args"] == ["--model-path", "m", "--port", "port"]


def test_model_cache_from_a_claim_or_none(helm_ok):
    deployment, _ = model_server("--set", "modelServer.modelCache.existingClaim=weights")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "weights"}
    deployment, server = model_server("--set", "modelServer.modelCache.enabled=false")
    assert all(
        v["name"] != "model-cache"
        for v in deployment["spec"]["template"]["spec"].get("volumes", [])
    )
    assert all(m["name"] != "model-cache" for m in server.get("volumeMounts", []))
