"""The README's three Kubernetes paths, followed as written, played in podman.

Each path's commands are read from the README's code blocks, not restated here:

- Quick start: ``make image-push REGISTRY=R``, ``helm install ... --set image.repository=...``,
  ``kubectl port-forward svc/<release> 8000``;
- Without Helm: ``make image-push``, ``kubectl apply -n <ns> -f deploy/kubernetes/``;
- Monitoring only: ``make image-push``, ``helm install ... --set mode=monitoring-only ...``,
  then the checklist the chart prints (NOTES), applied to a team's own server Deployment.

What a cluster would do is done here as closely as podman allows, and no more:

- ``make image-push``: no registry runs here. ``make -n`` says which name it builds; the image
  built from the same Dockerfile (scripts/build-image.sh) is tagged with that name, so the
  manifests' ``image:`` with ``imagePullPolicy: IfNotPresent`` finds it as a node would after
  the push. A manifest naming another image fails here as a cluster's pull would.
- ``helm install`` becomes ``helm template`` with the same arguments, for Kubernetes 1.28 (a
  regular sidecar container: podman 4.3 runs init containers to completion, so a native
  sidecar would never let the server start; tests/integration/app/test_rollout.py proves that
  ordering with real processes). The plain manifests are rendered for 1.33, so their native
  sidecar is moved to the containers, the only change of that path.
- The model server has no GPU or vLLM image here: its container runs the simulator from the
  same image on the port the render gives it, with no resources and no /dev/shm volume.
  Downward-API env entries other than metadata.name are dropped (podman refuses them).
- ``kubectl port-forward svc/...``: the Service is not played; its targetPort is looked up in
  the render and published as a hostPort of the container that declares it. Every declared
  port gets a hostPort taken free at run time (podman 4.3 would publish the model server's
  8000 on the host's 8000 otherwise), and every pod is removed also when a test fails.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.pod.conftest import ROOT, kube_played, podman, publish_ports
from tests.support.chart import sync
from tests.support.http import wait_status

pytestmark = pytest.mark.pod

README = ROOT / "README.md"


# ------------------------------------------------------------------------------ the README


def code_block(heading: str, marker: str) -> list[str]:
    """The lines of the first ```sh block under ``heading`` that contains ``marker``."""
    text = README.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1]
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        if marker in block:
            return [ln.split("   #", 1)[0].strip() for ln in block.splitlines() if ln.strip()]
    raise AssertionError(f"README: no sh block with {marker!r} under {heading!r}")


def command(lines: list[str], start: str) -> list[str]:
    (line,) = [ln for ln in lines if ln.startswith(start)]
    return shlex.split(line.split(" #", 1)[0])


def pushed_image(lines: list[str], image: str) -> str:
    """What the block's `make image-push REGISTRY=...` builds and pushes (asked from make),
    made available under that name as a node would have it after the push."""
    make = command(lines, "make image-push")
    done = subprocess.run(
        [*make, "-n", "CONTAINER=podman"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (name,) = re.findall(r"podman build -t (\S+) \.", done.stdout)
    assert re.findall(r"podman push (\S+)", done.stdout) == [name]
    podman("tag", image, name)
    return name


def helm_template(install: list[str]) -> tuple[str, list[str]]:
    """`helm install REL CHART ARGS...` -> (release namespace, `helm template` arguments for 1.28)."""
    assert install[:2] == ["helm", "install"], install
    release, chart, *rest = install[2:]
    assert (ROOT / chart).resolve() == sync.CHART
    args, namespace, i = [], "default", 0
    while i < len(rest):
        if rest[i] in ("-n", "--namespace"):
            namespace = rest[i + 1]
            i += 2
        elif rest[i] == "--create-namespace":
            i += 1
        else:
            args.append(rest[i])
            i += 1
    assert release == sync.RELEASE
    return namespace, ["--kube-version", sync.KUBE_VERSION_LEGACY, *args]


def render(namespace: str, args: list[str]) -> list[dict]:
    return sync.objects(
        sync.helm("template", sync.RELEASE, str(sync.CHART), "--namespace", namespace, *args)
    )


def one(objs: list[dict], kind: str) -> dict:
    (found,) = [o for o in objs if o["kind"] == kind]
    return found


# ------------------------------------------------------------------------------ playing a pod


def for_podman(deployment: dict, server: str, server_port: int, model: str) -> dict:
    """The Deployment as podman can play it (module docstring): a native sidecar as a regular
    container, the server as the simulator, downward API limited to metadata.name."""
    doc = copy.deepcopy(deployment)
    spec = doc["spec"]["template"]["spec"]
    native = [c for c in spec.pop("initContainers", []) if c.get("restartPolicy") == "Always"]
    for c in native:
        c.pop("restartPolicy")
    spec["containers"] = native + spec["containers"]
    for c in spec["containers"]:
        c["env"] = [e for e in c.get("env", [])
                    if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "metadata.name") == "metadata.name"]  # fmt: skip
        if c["name"] == server:
            c.pop("command", None)
            c["args"] = [
                "simulate",
                "--listen",
                f"127.0.0.1:{server_port}",
                "--model",
                model,
                "--ttft",
                "0.02",
                "--tpot",
                "0.005",
                "--tokens",
                "8",
                "--tokens-spread",
                "0",
            ]
            c["image"], c["imagePullPolicy"] = "localhost/llm-sidecar:test", "Never"
            c.pop("resources", None)
            c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] != "dshm"]
            c.pop("lifecycle", None)  # the preStop sleep belongs to stopping, not to this test
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != "dshm"]
    return doc


def publish(deployment: dict, *container_ports: int) -> list[int]:
    """The hostPorts of the container ports a Service targets (what port-forward reaches).
    Every port the pod declares gets one, taken free now (:func:`publish_ports`), so call
    this once per pod."""
    published = publish_ports(deployment)
    missing = [port for port in container_ports if port not in published]
    assert not missing, f"no container declares port(s) {missing}"
    return [published[port] for port in container_ports]


@contextmanager
def played_pod(deployment: dict, tmp: Path) -> Iterator[str]:
    """The Deployment played as a pod (its name made unique), removed afterwards also when
    the play or the test fails (:func:`kube_played`)."""
    name = f"install-path-{uuid.uuid4().hex[:6]}"
    deployment = copy.deepcopy(deployment)
    deployment["metadata"]["name"] = name
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(deployment, sort_keys=False), encoding="utf-8")
    with kube_played(path, name) as pod:
        yield pod


async def stream_through(port: int, model: str) -> bytes:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "Hello"}]}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            return await r.read()


async def counted(admin: int, model: str) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{admin}/metrics") as r:
            text = await r.text()
    return "\n".join(
        ln
        for ln in text.splitlines()
        if ln.startswith("llm_requests_total{") and f'model="{model}"' in ln
    )


async def check_pod_serves(deployment: dict, proxy: int, admin: int, model: str) -> None:
    await wait_status(f"http://127.0.0.1:{admin}/readyz", 200, timeout=90)
    got = await stream_through(proxy, model)
    assert got.endswith(b"data: [DONE]\n\n") and got.count(b"data: ") >= 8
    assert 'outcome="ok"' in await counted(admin, model), (
        "the request passed the sidecar and was measured"
    )


def sidecar_of(deployment: dict) -> dict:
    spec = deployment["spec"]["template"]["spec"]
    (c,) = [
        c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "llm-sidecar"
    ]
    return c


def port_named(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


@pytest.fixture
def untag():
    names: list[str] = []
    yield names
    for name in names:
        podman("rmi", name, check=False)


# ------------------------------------------------------------------------------ the paths


async def test_quick_start_as_written(image, tmp_path, untag):
    lines = code_block("## Quick start", "helm install")
    untag.append(pushed_image(lines, image))
    namespace, args = helm_template(command(lines, "helm install"))
    objs = render(namespace, args)
    deployment, service = one(objs, "Deployment"), one(objs, "Service")
    # kubectl -n NS port-forward svc/NAME PORT: the Service the README names, its port, its target.
    forward = command(lines, "kubectl")
    assert (
        forward[:3] == ["kubectl", "-n", namespace]
        and forward[4] == f"svc/{service['metadata']['name']}"
    )
    (svc_port,) = [p for p in service["spec"]["ports"] if p["port"] == int(forward[5])]
    assert svc_port["targetPort"] == port_named(sidecar_of(deployment), "http"), (
        "the Service leads to the sidecar"
    )
    model = next(a.split("=", 1)[1] for a in args if a.startswith("modelServer.model="))
    pod = for_podman(deployment, "model-server", 8000, model)
    proxy, admin = publish(
        pod, svc_port["targetPort"], port_named(sidecar_of(deployment), "metrics")
    )
    with played_pod(pod, tmp_path):
        await check_pod_serves(pod, proxy, admin, model)


async def test_without_helm_as_written(image, tmp_path, untag):
    lines = code_block("## Without Helm, or monitoring only", "kubectl apply -n")
    untag.append(pushed_image(lines, image))
    apply = command(lines, "kubectl apply -n")
    assert apply[:4] == ["kubectl", "apply", "-n", apply[3]] and apply[4] == "-f"
    directory = ROOT / apply[5]
    files = sorted(
        directory.glob("*.yaml")
    )  # -f DIR applies the directory's files, not its subdirectories
    objs = [o for f in files for o in yaml.safe_load_all(f.read_text(encoding="utf-8")) if o]
    assert all("namespace" not in o["metadata"] for o in objs), (
        "the namespace is the one given to kubectl -n"
    )
    deployment, service, monitor = (
        one(objs, "Deployment"),
        one(objs, "Service"),
        one(objs, "PodMonitor"),
    )
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(), (
        "the monitor finds the pod"
    )
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"metrics"}
    (svc_port,) = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    (server,) = [
        c
        for c in deployment["spec"]["template"]["spec"]["containers"]
        if c["name"] == "model-server"
    ]
    model = server["args"][server["args"].index("--model") + 1]
    pod = for_podman(deployment, "model-server", 8000, model)
    proxy, admin = publish(
        pod, svc_port["targetPort"], port_named(sidecar_of(deployment), "metrics")
    )
    with played_pod(pod, tmp_path):
        await check_pod_serves(pod, proxy, admin, model)


def team_server(labels: dict[str, str]) -> tuple[dict, dict]:
    """A team's own vLLM Deployment and Service before the checklist (what they run today)."""
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "my-vllm"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": dict(labels)},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                                     "args": ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--port", "8000"],
                                     "ports": [{"name": "http", "containerPort": 8000}]}]}}},
    }  # fmt: skip
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "my-vllm"},
               "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}}  # fmt: skip
    return deployment, service


async def test_monitoring_only_checklist_as_written(image, tmp_path, untag):
    lines = code_block("## Without Helm, or monitoring only", "mode=monitoring-only")
    untag.append(pushed_image(lines, image))
    namespace, args = helm_template(command(lines, "helm install"))
    objs = render(namespace, args)
    assert {o["kind"] for o in objs} <= {"PodMonitor", "PrometheusRule", "ConfigMap"}, (
        "monitoring objects only"
    )
    monitor = one(objs, "PodMonitor")
    assert [e["path"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["/metrics"], (
        "no second scrape of vLLM"
    )
    notes = sync.render_extra(sync.NOTES_TEMPLATE, args)["text"]
    labels = monitor["spec"]["selector"]["matchLabels"]
    deployment, service = team_server(labels)
    spec = deployment["spec"]["template"]["spec"]

    # 1. Paste the printed container into the pod template.
    printed = notes.split("pod template", 1)[1].split("\n\n", 1)[1].split("\n\n", 1)[0]
    (container,) = yaml.safe_load(printed)
    spec["containers"].append(container)
    # 2. The Service's targetPort: the number NOTES gives.
    (target,) = re.findall(r"targetPort at the sidecar's port number, (\d+)", notes)
    service["spec"]["ports"][0]["targetPort"] = int(target)
    # 3. The pods' labels are the ones NOTES names (the monitor selects them).
    assert f"Label the pods {json.dumps(labels, separators=(',', ':'))}" in notes
    # 4. The server flags, as printed.
    flags = re.findall(r"^\s+(--enable-[a-z-]+)\s", notes, re.M)
    assert {"--enable-force-include-usage", "--enable-per-request-metrics"} <= set(flags)
    spec["containers"][0]["args"] += flags
    # 5. preStop sleep and the grace period NOTES gives.
    (grace,) = re.findall(r"terminationGracePeriodSeconds: (\d+)", notes)
    spec["terminationGracePeriodSeconds"] = int(grace)
    spec["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "10"]}}}
    # The upstream the pasted sidecar uses is the server's port in the pod.
    upstream = {e["name"]: e.get("value") for e in container["env"]}["LLM_SIDECAR_UPSTREAM"]
    assert (
        upstream
        == "http://127.0.0.1:8000"
        == f"http://127.0.0.1:{spec['containers'][0]['ports'][0]['containerPort']}"
    )

    pod = for_podman(deployment, "vllm", 8000, "Qwen/Qwen2.5-1.5B-Instruct")
    proxy, admin = publish(
        pod, service["spec"]["ports"][0]["targetPort"], port_named(container, "metrics")
    )
    with played_pod(pod, tmp_path):
        await check_pod_serves(pod, proxy, admin, "Qwen/Qwen2.5-1.5B-Instruct")
        # The sidecar still relays the engine's own metrics for whoever scrapes them.
        await wait_status(f"http://127.0.0.1:{admin}/metrics/engine", 200)
