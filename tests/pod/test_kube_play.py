"""The chart's pod, played by `podman kube play` with the real image as both containers.

The chart is rendered by the pinned helm for Kubernetes 1.28 (the sidecar as a regular
container) with the image built from the Dockerfile as the sidecar and, running `simulate`,
as the model server. The kubelet's argv rules apply (podman gives a container the image's
ENTRYPOINT with the manifest's args, as the kubelet does), so the pod runs exactly the
chart's command line: today's `args: [serve]` on the old `ENTRYPOINT [llm-sidecar, serve]`
crash-looped here with `unrecognized arguments: serve`.

The test copy differs from the render only where podman needs it: image names and pull
policy (no registry), the simulator's arguments, no GPU limit or /dev/shm volume, a hostPort
taken free at run time on every declared port (the sidecar's two, to reach the pod from here,
and the model server's, which podman 4.3 would otherwise publish on the host's 8000), and no
downward-API env entries other than metadata.name (podman refuses them).

The native-sidecar rendering (Kubernetes >= 1.29) is not played: podman 4.3 runs init
containers to completion before the others, so a native sidecar (an init container with
restartPolicy: Always) never lets the model server start there (checked by hand: the model
server stays "Created"). Its ordering is proven with real processes instead, in
tests/integration/app/test_rollout.py.

Then, against the running pod: the pod becomes ready; a streamed request through the
proxy port arrives byte-exact (compared with the first request to a second, identically
seeded simulator from the same image, masking only `created`, the second it was made in);
the admin port serves the sidecar's metrics and the engine's own (/metrics/engine), which a
real Prometheus scrapes with pod labels without counting them as requests; /readyz follows
the model server down and back up.
"""

from __future__ import annotations

import asyncio
import copy
import re
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.pod.conftest import (
    MODEL_SERVER_PORT,
    kube_played,
    podman,
    publish_ports,
    published_host_ports,
)
from tests.support.chart import require_helm, sync
from tests.support.http import status, wait_status
from tests.support.ports import free_port
from tests.support.processes import start_prometheus
from tests.support.scrape import pod_scrape_config
from tests.support.tools import require_tool

pytestmark = pytest.mark.pod

SEED = "7"
SIM_ARGS = [
    "simulate",
    "--listen",
    f"127.0.0.1:{MODEL_SERVER_PORT}",
    "--seed",
    SEED,
    "--ttft",
    "0.05",
    "--tpot",
    "0.01",
    "--tokens",
    "12",
]
BODY = {"model": "sim-llama-3-8b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
CREATED = re.compile(rb'"created":\d+')


def rendered_deployment(image: str, *extra: str) -> dict:
    require_helm()
    repo, tag = image.rsplit(":", 1)
    args = ["--kube-version", sync.KUBE_VERSION_LEGACY, "--show-only", "templates/deployment.yaml",
            "--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
            "--set", f"modelServer.image.repository={repo}", "--set", f"modelServer.image.tag={tag}",
            "--set", "modelServer.image.pullPolicy=Never", "--set", "modelServer.shmSize=",
            "--set", "modelServer.preStopSeconds=2", "--set", "sidecar.drainSeconds=10", *extra]  # fmt: skip
    (deployment,) = sync.objects(sync.template(args))
    return deployment


def for_podman(deployment: dict) -> dict:
    """The render, changed only where podman needs it (see the module docstring); the host
    ports are :func:`publish_ports`'s."""
    doc = copy.deepcopy(deployment)
    spec = doc["spec"]["template"]["spec"]
    assert "initContainers" not in spec, (
        "the legacy rendering runs the sidecar as a regular container"
    )
    for container in spec["containers"]:
        if container["name"] == "llm-sidecar":
            assert container["args"] == ["serve"], "played with the chart's own command line"
            container["env"] = [e for e in container["env"]
                                if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "metadata.name") == "metadata.name"]  # fmt: skip
        else:
            container["args"] = SIM_ARGS
            container.pop("resources", None)  # no GPU here
    return doc


class Played:
    def __init__(
        self, path: Path, published: dict[int, int], ports: dict[str, int], pod: str, workers: int
    ):
        self.path, self.published, self.pod, self.workers = path, published, pod, workers
        self.proxy, self.admin = published[ports["http"]], published[ports["metrics"]]

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin}"

    def container(self, name: str) -> str:
        return f"{self.pod}-{name}"


@pytest.fixture(
    scope="module",
    params=[(), ("--set", "sidecar.resources.requests.cpu=2")],
    ids=["one-worker", "two-workers"],  # the chart: one worker per core of the CPU request
)
def played(image, tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("kube")
    deployment = for_podman(rendered_deployment(image, *request.param))
    published = publish_ports(deployment)
    (sidecar,) = [
        c
        for c in deployment["spec"]["template"]["spec"]["containers"]
        if c["name"] == "llm-sidecar"
    ]
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    name = f"llm-sidecar-pod-test-{uuid.uuid4().hex[:6]}"
    deployment["metadata"]["name"] = name
    path = tmp / "pod.yaml"
    path.write_text(yaml.safe_dump(deployment, sort_keys=False), encoding="utf-8")
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    with kube_played(path, name) as pod:
        yield Played(path, published, ports, pod, int(env["LLM_SIDECAR_WORKERS"]))


async def test_pod_starts_and_becomes_ready(played):
    await wait_status(f"{played.admin_url}/readyz", 200)
    states = podman(
        "pod",
        "inspect",
        played.pod,
        "--format",
        "{{range .Containers}}{{.Name}}={{.State}} {{end}}",
    ).stdout
    assert f"{played.container('llm-sidecar')}=running" in states
    assert f"{played.container('model-server')}=running" in states
    # Only the free ports taken for it are published: the model server's port is one of them.
    assert MODEL_SERVER_PORT in played.published
    assert published_host_ports(played.pod) == set(played.published.values())
    assert MODEL_SERVER_PORT not in played.published.values()
    logs = podman("logs", played.container("llm-sidecar"), check=False).stderr
    assert "unrecognized arguments" not in logs


async def test_a_stream_through_the_pod_arrives_byte_exact(played, image):
    await wait_status(f"{played.admin_url}/readyz", 200)
    async with aiohttp.ClientSession() as s:
        served_before = await _served(s, f"{played.admin_url}/metrics/engine")
        async with s.post(f"{played.proxy_url}/v1/chat/completions", json=BODY) as r:
            assert r.status == 200
            through = await r.read()
    # The reference: a second simulator with the same seed, given the same requests in the
    # same order (each request draws the same random plan from the seeded generator).
    port, ref = free_port(), f"llm-sidecar-ref-{uuid.uuid4().hex[:6]}"
    listen = f"127.0.0.1:{MODEL_SERVER_PORT}"
    try:
        podman("run", "-d", "--read-only", "--network", "host", "--name", ref, image,
               *[a if a != listen else f"127.0.0.1:{port}" for a in SIM_ARGS])  # fmt: skip
        await wait_status(f"http://127.0.0.1:{port}/health", 200)
        async with aiohttp.ClientSession() as s:
            for _ in range(served_before):
                async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=BODY) as r:
                    await r.read()
            async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=BODY) as r:
                direct = await r.read()
    finally:
        podman("rm", "-f", "-t", "0", ref, check=False)
    assert through.endswith(b"data: [DONE]\n\n") and through.count(b"data: ") > 12
    assert CREATED.sub(b'"created":0', through) == CREATED.sub(b'"created":0', direct)


async def test_admin_port_serves_the_sidecars_and_the_engines_metrics(played):
    await wait_status(f"{played.admin_url}/readyz", 200)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{played.proxy_url}/v1/chat/completions", json=BODY) as r:
            await r.read()
        async with s.get(f"{played.admin_url}/metrics") as r:
            assert (
                'llm_requests_total{code="200",error_type="none",model="sim-llama-3-8b",outcome="ok",route="/v1/chat/completions"}'
                in await r.text()
            )
        async with s.get(f"{played.admin_url}/metrics/engine") as r:
            assert r.status == 200
            assert "vllm:num_requests_running" in await r.text()


async def test_prometheus_scrapes_the_pod_with_its_labels_and_counts_no_scrape(played, tmp_path):
    """Two scrape jobs as the chart's PodMonitor has them, against the played pod; the pod's
    labels come from static labels here (Kubernetes service discovery adds them there)."""
    binary = require_tool("prometheus")
    await wait_status(f"{played.admin_url}/readyz", 200)
    config = pod_scrape_config(f"127.0.0.1:{played.admin}", {"namespace": "llm", "pod": played.pod})
    proc, port = start_prometheus(binary, tmp_path, config)
    try:
        async with aiohttp.ClientSession() as s:

            async def query(expr: str) -> list[dict]:
                try:
                    async with s.get(
                        f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr}
                    ) as r:
                        return (await r.json())["data"]["result"] if r.status == 200 else []
                except aiohttp.ClientError:
                    return []

            before = await _requests_total(s, played)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not await query(
                'vllm:num_requests_running{job="llm-engine"}'
            ):
                await asyncio.sleep(0.5)
            await asyncio.sleep(3)  # a few more scrapes of both jobs
            (series,) = await query('vllm:kv_cache_usage_perc{job="llm-engine"}')
            assert series["metric"]["pod"] == played.pod and series["metric"]["namespace"] == "llm"
            assert await query(f'up{{job="llm-engine", pod="{played.pod}"}} == 1')
            assert await query(f'up{{job="llm-sidecar", pod="{played.pod}"}} == 1')
            assert await _requests_total(s, played) == before, "scrapes are not LLM requests"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _served(s: aiohttp.ClientSession, url: str) -> int:
    """Requests the simulated vLLM has completed (its vllm:request_success_total)."""
    async with s.get(url) as r:
        text = await r.text()
    (line,) = [x for x in text.splitlines() if x.startswith("vllm:request_success_total{")]
    return int(float(line.rsplit(" ", 1)[1]))


async def _requests_total(s: aiohttp.ClientSession, played: Played) -> float:
    async with s.get(f"{played.admin_url}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llm_requests_total{")
    )


async def test_readyz_follows_the_model_server_down_and_up(played):
    await wait_status(f"{played.admin_url}/readyz", 200)
    server = played.container("model-server")
    podman("stop", "-t", "5", server)
    try:
        await wait_status(f"{played.admin_url}/readyz", 503, timeout=20)
        assert await status(f"{played.admin_url}/healthz") == 200, "the sidecar itself stays alive"
        assert await status(f"{played.admin_url}/upstreamz") == 503
    finally:
        podman("start", server)
    await wait_status(f"{played.admin_url}/readyz", 200, timeout=30)


async def test_the_sidecar_runs_the_workers_its_cpu_request_asks_for(played):
    """The chart's worker count from the CPU request, in the real image with its read-only
    root: two workers behind the one proxy port, one page for the pod."""
    await wait_status(f"{played.admin_url}/readyz", 200)
    async with aiohttp.ClientSession() as s:
        for _ in range(6):
            async with aiohttp.ClientSession() as one:  # a connection each
                async with one.post(f"{played.proxy_url}/v1/chat/completions", json=BODY) as r:
                    assert r.status == 200
                    await r.read()
        async with s.get(f"{played.admin_url}/metrics") as r:
            page = await r.text()
    served = re.search(r'llm_requests_total\{code="200"[^}]*outcome="ok"[^}]*\} (\S+)', page)
    assert served is not None and float(served[1]) >= 6
    if played.workers == 1:
        assert "llm_sidecar_workers" not in page
        return
    assert f"llm_sidecar_workers {float(played.workers)}" in page
    assert "llm_sidecar_worker_restarts_total 0.0" in page
