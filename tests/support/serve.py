"""``llm-sidecar serve`` and ``llm-sidecar simulate`` as subprocesses, on ports the kernel
picks and reads back from what each prints at start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp

from tests.support.waits import wait_for

_BOUND = re.compile(r"\b(bound|metrics_bound)\W+(?:\[?[0-9a-fA-F.:]+\]?):(\d+)")


def bound_ports(log: str) -> tuple[int, int] | None:
    """The proxy and admin ports from serve's ``started`` line in ``log`` (JSON or console
    format), or None before that line (whole lines only: a port half written is no port)."""
    for line in log.splitlines(keepends=True):
        if "started" in line and line.endswith("\n"):
            ports = {key: int(port) for key, port in _BOUND.findall(line)}
            if "bound" in ports and "metrics_bound" in ports:
                return ports["bound"], ports["metrics_bound"]
    return None


class ServeProcess:
    """``llm-sidecar serve`` as a subprocess on ports the kernel picks (``127.0.0.1:0``); the
    ports are read back from its ``started`` log line. stdout and stderr are read by threads
    as they arrive, so a chatty process never blocks on a full pipe."""

    def __init__(
        self, upstream_url: str, *extra: str, env: dict | None = None, clean_env: bool = False,
        listen: str = "127.0.0.1:0", metrics_listen: str = "127.0.0.1:0",
        command: tuple[str, ...] = (sys.executable, "-m", "sidecar"), **popen: object,
    ) -> None:  # fmt: skip
        base = os.environ
        if clean_env:
            base = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("OTEL_", "LLM_SIDECAR_", "KUBERNETES_"))
            }
        self.port = self.admin_port = 0
        self.out: list[str] = []
        self.err: list[str] = []
        self.started = threading.Event()
        self.proc = subprocess.Popen(
            [*command, "serve", "--upstream", upstream_url,
             "--listen", listen, "--metrics-listen", metrics_listen, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**base, **(env or {})}, **popen,
        )  # fmt: skip
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read(self, stream, into: list[str]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace")
            into.append(line)
            if not self.started.is_set() and (ports := bound_ports(line)):
                self.port, self.admin_port = ports
                self.started.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def ports(self, timeout: float = 30) -> tuple[int, int]:
        """Block until started; the proxy and admin ports (for tests without an event loop)."""
        deadline = time.monotonic() + timeout
        while not self.started.wait(0.05):
            assert self.proc.poll() is None, "".join(self.err) + "".join(self.out)
            assert time.monotonic() < deadline, "serve did not start"
        return self.port, self.admin_port

    async def wait_started(self, timeout: float = 30) -> None:
        def up() -> bool:
            if self.started.is_set():
                return True
            assert self.proc.poll() is None, "".join(self.err) + "".join(self.out)
            return False

        await wait_for(up, timeout=timeout)

    async def wait_alive(self, timeout: float = 30) -> None:
        """Started, and its admin port answers /healthz 200 (the upstream is ready)."""
        await self.wait_started(timeout)

        async def alive() -> bool:
            assert self.proc.poll() is None, "".join(self.err)
            try:
                async with aiohttp.ClientSession() as s:
                    async with s.get(self.admin_url + "/healthz") as r:
                        return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(alive, timeout=timeout)

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.admin_url + "/metrics") as r:
                return await r.text()

    def stop(self) -> tuple[str, str]:
        """Kill it if still running; everything it wrote to stdout and stderr."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for t in self._readers:
            t.join(timeout=10)
        return "".join(self.out), "".join(self.err)


async def start_pod(serve_process, upstream_url: str, tmp: Path, workers: int, *args: str):
    """``serve --workers N`` (the ``serve_process`` fixture) with its worker sockets under
    ``tmp``, returned once the pod's admin port answers ``/readyz`` 200."""
    pod = serve_process(upstream_url, "--workers", str(workers), *args, env={"TMPDIR": str(tmp)})
    await pod.wait_started()

    async def ready() -> bool:
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(pod.admin_url + "/readyz") as r:
                    return r.status == 200
        except aiohttp.ClientError:
            return False

    await wait_for(ready, timeout=60)
    return pod


def start_simulator(
    *args: str, command: tuple[str, ...] = (sys.executable, "-m", "sidecar"), **popen
) -> tuple[subprocess.Popen, int]:
    """``llm-sidecar simulate`` on a port the kernel picks, read back from the line it prints
    at start (stderr, text). The caller terminates it."""
    proc = subprocess.Popen(
        [*command, "simulate", "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen,
    )  # fmt: skip
    line = proc.stderr.readline()  # type: ignore[union-attr]
    found = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
    if found is None:
        proc.kill()
        raise AssertionError(f"simulate did not start: {line}{proc.communicate(timeout=10)[1]}")
    return proc, int(found[1])
