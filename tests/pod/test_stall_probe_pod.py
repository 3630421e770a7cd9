"""The chart's stall probe (``modelServer.stallProbe``) as `podman kube play` runs it: what
podman 4.3 makes of the model server's liveness probe, and what restarts a hung engine.

podman has no kubelet. `kube play` turns a container's ``livenessProbe`` into a podman
healthcheck run *inside that container*: an ``httpGet`` becomes the shell command
``curl -f http://localhost:<port><path> || exit 1`` (so the model server's image must have
curl; the sidecar's own image has none), ``periodSeconds`` its interval, ``failureThreshold``
its retries, ``timeoutSeconds`` its timeout, and with the Deployment's ``restartPolicy:
Always`` the on-failure action ``restart``. Nothing else of the kubelet's probing happens:
the checks are run by a systemd timer podman creates per container, and only where systemd
runs; without it (this machine, most CI containers) `kube play` logs that it could not
create the timer and no check ever runs unless something calls `podman healthcheck run`.

So the test proves the chain piece by piece, against the rendered chart played as
tests/pod/test_kube_play.py plays it, with three changes: the model server is the image
under test with curl added, running ``simulate`` with streams long enough to hang; and the
sidecar's thresholds are seconds, not minutes (its ``LLM_SIDECAR_STALL_SECONDS`` and
``LLM_SIDECAR_STALL_PROBE_SECONDS``; the chart allows 60 s at least):

- the model server container carries the healthcheck podman derived from the probe, with
  the probe's interval, retries, timeout and the restart action (and the sidecar's own
  probe, which names its port, became a check of port 0: docs/kubernetes.md says what
  follows from that);
- the check passes while the engine is healthy;
- with a stream in flight, the model server stopped (`podman kill --signal STOP`) makes the
  sidecar's ``/stallz`` 503, and then the check fails;
- on a host without systemd, nothing runs the check by itself: the stopped container is
  never restarted and its health log holds only the check the test ran;
- `podman healthcheck run` (what the timer would call), ``failureThreshold`` times, turns
  the container unhealthy and podman restarts it: a new process, not stopped, the stream it
  held ends, and the pod serves again with ``/stallz`` back to 200.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.pod.conftest import MODEL_SERVER_PORT, kube_played, podman, publish_ports
from tests.pod.test_kube_play import BODY, for_podman, rendered_deployment
from tests.support.http import wait_status
from tests.support.waits import wait_for

pytestmark = pytest.mark.pod

CURL_IMAGE = "localhost/llm-sidecar-curl:test"
STALL, PROBE = 2, 4  # the sidecar's --stall-seconds and --stall-probe-seconds
PERIOD, FAILURES = 2, 2
# Streams of 2000 tokens at 50 ms: a hung engine is stopped long before one ends.
LONG_STREAMS = ["simulate", "--listen", f"127.0.0.1:{MODEL_SERVER_PORT}", "--ttft", "0.05",
                "--tpot", "0.05", "--tokens", "2000", "--tokens-spread", "0", "--jitter", "0"]  # fmt: skip
NO_SYSTEMD = not Path("/run/systemd/system").is_dir()


@pytest.fixture(scope="module")
def curl_image(image: str, tmp_path_factory) -> str:
    """The image under test with Debian's curl added, for the healthcheck podman derives from
    an httpGet probe (vLLM's and llama.cpp's server images have curl). Built every session on
    top of ``image`` as it is now (podman's layer cache makes that a second when unchanged)."""
    context = tmp_path_factory.mktemp("curl-image")
    (context / "Containerfile").write_text(
        f"FROM {image}\nUSER 0\n"
        "RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends curl "
        "&& rm -rf /var/lib/apt/lists/*\n"
        "USER 10001:10001\n",
        encoding="utf-8",
    )
    podman("build", "--quiet", "--format", "docker", "--network", "host",
           "-t", CURL_IMAGE, str(context), timeout=600)  # fmt: skip
    return CURL_IMAGE


def _inspect(container: str) -> dict:
    return json.loads(podman("inspect", container).stdout)[0]


def _process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T`` when stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


async def test_the_probe_restarts_a_stopped_model_server_when_podman_runs_its_check(
    image, curl_image, tmp_path
):
    repo, tag = curl_image.rsplit(":", 1)
    deployment = for_podman(
        rendered_deployment(
            image,
            "--set", "modelServer.stallProbe.enabled=true",
            "--set", f"modelServer.stallProbe.periodSeconds={PERIOD}",
            "--set", f"modelServer.stallProbe.failureThreshold={FAILURES}",
            "--set", "sidecar.workers=1",
            "--set", f"modelServer.image.repository={repo}",
            "--set", f"modelServer.image.tag={tag}",
        )
    )  # fmt: skip
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    probe = containers["model-server"]["livenessProbe"]
    ports = {p["name"]: p["containerPort"] for p in containers["llm-sidecar"]["ports"]}
    admin_port = ports["metrics"]
    assert probe["httpGet"] == {"path": "/stallz", "port": admin_port}, probe
    containers["model-server"]["args"] = LONG_STREAMS
    # The thresholds in seconds, not minutes (the chart allows 60 s at least): the sidecar's.
    env = containers["llm-sidecar"]["env"]
    (probe_env,) = [e for e in env if e["name"] == "LLM_SIDECAR_STALL_PROBE_SECONDS"]
    probe_env["value"] = str(PROBE)
    env.append({"name": "LLM_SIDECAR_STALL_SECONDS", "value": str(STALL)})
    published = publish_ports(deployment)
    name = f"llm-sidecar-stall-test-{uuid.uuid4().hex[:6]}"
    deployment["metadata"]["name"] = name
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(deployment, sort_keys=False), encoding="utf-8")
    proxy = f"http://127.0.0.1:{published[ports['http']]}"
    admin_url = f"http://127.0.0.1:{published[admin_port]}"

    with kube_played(path, name) as pod:
        server = f"{pod}-model-server"
        await wait_status(f"{admin_url}/readyz", 200)

        # What podman made of the probe.
        config = _inspect(server)["Config"]
        check = config["Healthcheck"]
        assert check["Test"] == ["CMD-SHELL", "curl", "-f",
                                 f"http://localhost:{admin_port}/stallz", "||", "exit", "1"]  # fmt: skip
        assert check["Interval"] == PERIOD * 10**9 and check["Retries"] == FAILURES
        assert check["Timeout"] == probe["timeoutSeconds"] * 10**9
        assert config["HealthcheckOnFailureAction"] == "restart"
        # The sidecar's own liveness probe names its port: podman 4.3 makes that port 0
        # (docs/kubernetes.md says what follows; this fails when a podman resolves names).
        sidecar_check = _inspect(f"{pod}-llm-sidecar")["Config"]["Healthcheck"]["Test"]
        assert containers["llm-sidecar"]["livenessProbe"]["httpGet"]["port"] == "metrics"
        assert "http://localhost:0/healthz" in sidecar_check, sidecar_check
        assert podman("healthcheck", "run", server, check=False).returncode == 0  # healthy

        before = _inspect(server)["State"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
            async with s.post(f"{proxy}/v1/chat/completions", json=BODY) as r:
                assert r.status == 200
                while b'"content"' not in await r.content.readline():
                    pass  # until a token
                podman("kill", "--signal", "STOP", server)
                assert _process_state(before["Pid"]) == "T"
                await wait_status(f"{admin_url}/stallz", 503, timeout=PROBE + 15)

                if NO_SYSTEMD:
                    # Nobody runs the check: well past interval x retries, the container holds
                    # the same stopped process, and its health log has only the run above.
                    await asyncio.sleep(PERIOD * (FAILURES + 2))
                    state = _inspect(server)["State"]
                    assert (state["Pid"], state["StartedAt"]) == (
                        before["Pid"],
                        before["StartedAt"],
                    )
                    assert _process_state(before["Pid"]) == "T"
                    assert len(state["Health"]["Log"]) == 1, state["Health"]

                    # What the timer would run. Once: failing on the probe's 503, not yet
                    # unhealthy; failureThreshold times: unhealthy, and podman restarts it.
                    first = podman("healthcheck", "run", server, check=False)
                    health = _inspect(server)["State"]["Health"]
                    assert first.returncode == 1 and health["FailingStreak"] == 1
                    assert "error: 503" in health["Log"][-1]["Output"], health["Log"][-1]
                    started = time.monotonic()
                    runs = [podman("healthcheck", "run", server, check=False, timeout=120)
                            for _ in range(FAILURES - 1)]  # fmt: skip
                    print(f"restarted by the check's last failure in "
                          f"{time.monotonic() - started:.1f} s")  # fmt: skip
                    assert [run.returncode for run in runs] == [1] * (FAILURES - 1), runs
                else:  # systemd runs the check every period: the restart comes by itself

                    async def restarted() -> bool:
                        return _inspect(server)["State"]["Pid"] not in (0, before["Pid"])

                    await wait_for(restarted, timeout=PERIOD * (FAILURES + 2) + 30)
                with pytest.raises(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(r.content.read(), 60)  # the stream it held ends

        after = _inspect(server)["State"]
        assert after["Running"] and after["Pid"] != before["Pid"]
        assert after["StartedAt"] != before["StartedAt"]
        assert _process_state(after["Pid"]) != "T"
        await wait_status(f"{admin_url}/readyz", 200, timeout=60)
        await wait_status(f"{admin_url}/stallz", 200, timeout=30)
        # The new engine holds no stream: the check passes again, and the pod serves.
        assert podman("healthcheck", "run", server, check=False).returncode == 0
        assert _inspect(server)["State"]["Health"]["Status"] == "healthy"
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{proxy}/v1/chat/completions", json={**BODY, "max_tokens": 3}) as r:
                assert r.status == 200
                assert (await r.read()).rstrip().endswith(b"data: [DONE]")
