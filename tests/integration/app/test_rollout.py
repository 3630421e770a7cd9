"""A rollout loses nothing: the pod's termination sequence, replayed with real processes.

What Kubernetes does when it deletes the chart's pod (README "Kubernetes", pod lifecycle):

- at t0 the pod is marked terminating; the endpoint controller and every node's kube-proxy
  take it out of the Service within seconds (ENDPOINT_REMOVAL here), and until then new
  requests still arrive;
- the model server runs its preStop (a sleep of PRE_STOP, longer than endpoint removal),
  then gets SIGTERM and finishes its streams with its listener closed (vLLM's uvicorn and
  the simulator both do);
- native sidecar: the sidecar gets SIGTERM only once the model server has exited;
  regular container: the sidecar gets SIGTERM at t0 (it has no preStop) and must keep
  relaying until the server is gone (sidecar/relay/server/drain.py).

The simulator is the model server, a real `llm-sidecar serve` is the sidecar, and a load
loop keeps streams in flight through it until the endpoints are gone. Every request must
succeed, byte-complete, in both orders; the old sidecar, which closed its listener on
SIGTERM, fails the regular-container order with refused connections.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

import aiohttp
import pytest

from tests.support.serve import ServeProcess, start_simulator
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ENDPOINT_REMOVAL = 1.5  # seconds until no new request reaches the pod
PRE_STOP = (
    3.0  # the model server's preStop sleep (the chart's default is 10 s for ~seconds of removal)
)
WORKERS = 6  # concurrent client streams
STREAM = ("--ttft", "0.05", "--tpot", "0.02", "--tokens", "25")  # about 0.6 s per stream
BODY = {"model": "sim-llama-3-8b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LLM_SIDECAR_", "OTEL_"))}


@dataclass
class Pod:
    """The two containers of one pod, as processes."""

    server: subprocess.Popen
    sidecar: subprocess.Popen
    url: str
    admin: str

    def stop(self) -> None:
        for p in (self.sidecar, self.server):
            if p.poll() is None:
                p.kill()
            p.wait()


@dataclass
class Load:
    """Clients streaming through the sidecar until ``stop`` (the endpoints are gone)."""

    url: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    ok: list[float] = field(default_factory=list)  # start times of complete streams
    failed: list[tuple[float, str]] = field(default_factory=list)

    async def worker(self, http: aiohttp.ClientSession) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                async with http.post(self.url + "/v1/chat/completions", json=BODY) as r:
                    body = await r.read()
                    if r.status == 200 and body.endswith(b"data: [DONE]\n\n"):
                        self.ok.append(started)
                    else:
                        self.failed.append((started, f"{r.status} {body[:120]!r}"))
            except aiohttp.ClientError as exc:
                self.failed.append((started, f"{type(exc).__name__}: {exc}"))

    async def run(self) -> None:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(self.worker(http) for _ in range(WORKERS)))


async def start_pod(drain_seconds: float) -> Pod:
    server, up = start_simulator(*STREAM, env=_env())
    # A pod: the kubelet sets KUBERNETES_SERVICE_HOST, and the drain waits for the server
    # (outside Kubernetes it would end with the last request; test_drain_outside_kubernetes.py).
    sc = ServeProcess(
        f"http://127.0.0.1:{up}",
        "--drain-seconds",
        str(drain_seconds),
        "--access-log",
        "false",
        clean_env=True,
        env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
    )
    pod = Pod(server, sc.proc, sc.url, sc.admin_url)
    try:
        await sc.wait_started()
    except AssertionError:
        pod.stop()
        raise
    pod = Pod(server, sc.proc, sc.url, sc.admin_url)  # the ports are known now
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(pod.admin + "/readyz") as r:
                    if r.status == 200:
                        return pod
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    pod.stop()
    raise AssertionError("the pod never became ready")


async def wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "did not exit in time"
        await asyncio.sleep(0.05)
    return proc.returncode


async def terminate(pod: Pod, native: bool, load: Load) -> dict[str, float]:
    """Kubernetes' termination sequence from t0; returns when both containers have exited."""
    t0 = time.monotonic()
    times: dict[str, float] = {}

    async def endpoints() -> None:
        await asyncio.sleep(ENDPOINT_REMOVAL)
        load.stop.set()
        times["endpoints_removed"] = time.monotonic() - t0

    async def model_server() -> None:
        await asyncio.sleep(PRE_STOP)  # its preStop
        pod.server.send_signal(signal.SIGTERM)
        assert await wait_exit(pod.server, 10) in (0, -signal.SIGTERM)
        times["server_exited"] = time.monotonic() - t0

    async def sidecar() -> None:
        if native:
            while "server_exited" not in times:
                await asyncio.sleep(0.01)
        pod.sidecar.send_signal(signal.SIGTERM)
        times["sidecar_signalled"] = time.monotonic() - t0
        assert await wait_exit(pod.sidecar, 20) == 0
        times["sidecar_exited"] = time.monotonic() - t0

    await asyncio.gather(endpoints(), model_server(), sidecar())
    return times


@pytest.mark.parametrize("native", [True, False], ids=["native-sidecar", "regular-container"])
async def test_termination_sequence_under_load_loses_no_request(native):
    pod = await start_pod(drain_seconds=15)
    try:
        load = Load(pod.url)
        running = asyncio.create_task(load.run())
        await wait_for(lambda: len(load.ok) >= WORKERS)  # steady load before the pod is deleted
        t0 = time.monotonic()
        times = await terminate(pod, native, load)
        await asyncio.wait_for(running, timeout=10)
    finally:
        pod.stop()
    during = [t for t in load.ok if t >= t0]
    assert not load.failed, f"{len(load.failed)} failed: {load.failed[:5]} (sequence {times})"
    assert len(during) >= WORKERS, (
        f"the load kept streams in flight during termination ({len(during)})"
    )
    # The sidecar stayed up until the server stopped serving (its SIGTERM, after the
    # preStop), and left soon after, not at drain_seconds.
    assert times["sidecar_exited"] >= PRE_STOP, times
    assert times["sidecar_exited"] - times["server_exited"] < 10, times  # drain_seconds is 15
