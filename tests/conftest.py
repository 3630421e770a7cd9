"""Shared fixtures: real sockets on 127.0.0.1, a scripted upstream, and a sidecar in front."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import yaml
from aiohttp import web
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from prometheus_client import CollectorRegistry

from sidecar.app import Sidecar, bind_sites, build_sidecar, setup_runners
from sidecar.config import Settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The skip rule: every skip fails under CI=true unless its reason is on the allow-list there.
pytest_plugins = ("tests.support.skips",)


def require_tool(name: str) -> str:
    """Path of an external tool; skip locally when missing, but fail in CI (CI=true)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (the repo's install step provides it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    """A port that was free a moment ago. Racy (another process may take it before the caller
    binds), so only for third-party servers that cannot bind port 0 and say which port they
    got; start those with :func:`retry_on_port_clash`. Everything else binds port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def retry_on_port_clash(
    start: Callable[[int], subprocess.Popen], attempts: int = 5, grace: float = 10.0
) -> tuple[subprocess.Popen, int]:
    """Start a third-party server (Prometheus, Alertmanager) that cannot bind port 0 and say
    which port it got: ``start(port)`` on a :func:`free_port`. Another process may take that
    port between the probe and the server's bind; then the server exits, and this picks
    another port and starts it again. Returns once the port accepts connections with the
    server still running (or after ``grace`` seconds alive)."""
    for attempt in range(attempts):
        port = free_port()
        proc = start(port)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
                continue
            time.sleep(0.1)  # a server that lost the port exits at once
            if proc.poll() is None:
                return proc, port
        if proc.poll() is None:
            return proc, port  # alive but slow to listen: the caller's readiness wait decides
        if attempt == attempts - 1:
            return proc, port  # still failing: the caller reports its exit
    raise AssertionError("unreachable")


@pytest.fixture
def refused_url():
    """A loopback URL that refuses connections: a socket bound but not listening, held for
    the test so no other process can take its port (a closed probe port could be reused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


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
        import aiohttp  # noqa: PLC0415

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
        import aiohttp  # noqa: PLC0415

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


@pytest.fixture
def serve_process():
    """Start ``ServeProcess`` es; each is killed at the end of the test."""
    started: list[ServeProcess] = []

    def make(*args, **kwargs) -> ServeProcess:
        p = ServeProcess(*args, **kwargs)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


async def start_app(app: web.Application, **runner_kwargs) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, **runner_kwargs)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


@dataclass
class Upstream:
    """A scripted upstream: tests register handlers and read what it received."""

    app: web.Application
    port: int = 0
    received: list[dict] = field(default_factory=list)
    events: dict[str, asyncio.Event] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def event(self, name: str) -> asyncio.Event:
        return self.events.setdefault(name, asyncio.Event())


@pytest.fixture
async def upstream():
    """An aiohttp server whose routes each test adds before first use."""
    app = web.Application()
    up = Upstream(app)
    runners: list[web.AppRunner] = []

    async def start(routes: Callable[[web.Application], None]) -> Upstream:
        routes(app)
        # Like uvicorn, the upstream notices a closed connection even while idle.
        runner, up.port = await start_app(app, handler_cancellation=True)
        runners.append(runner)
        return up

    up.start = start  # type: ignore[attr-defined]
    yield up
    for runner in runners:
        await runner.cleanup()


@dataclass
class RunningSidecar:
    """A sidecar started by :func:`run_sidecar`: its parts, its ports, and how many requests
    the relay carried from the connection's own callbacks (sidecar/relay/data/exchange.py)."""

    sidecar: Sidecar
    registry: CollectorRegistry
    port: int
    admin_port: int
    runners: list[web.BaseRunner] = field(default_factory=list)
    carried: int = 0

    async def stop(self) -> None:
        """Close both ports as ``serve`` closes them (proxy first): what is still in flight
        gets a second, as after a drain (no test here waits the proxy's ``drain_seconds``)."""
        if self.runners:
            self.runners[0].shutdown_timeout = 1.0
        for runner in self.runners:
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def in_flight(self) -> float:
        return in_flight_total(self.registry)

    def sample(self, name: str, **labels) -> float | None:
        # TTFT carries prompt_class; without configured classes it is always "all", which
        # tests that are not about classes need not spell out.
        if (
            name.startswith("llm_time_to_first_token_seconds")
            and not self.sidecar.settings.ttft_prompt_classes
        ):
            labels.setdefault("prompt_class", "all")
        return sample_value(self.registry, name, labels)


def sample_value(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    """``registry.get_sample_value``, except that ``llm_requests_total`` asked without an
    ``error_type`` is summed over its error types (None when no series matches): tests that
    are not about why a request failed need not spell it out."""
    if name != "llm_requests_total" or "error_type" in labels:
        return registry.get_sample_value(name, labels)
    values = [
        s.value
        for family in registry.collect()
        if family.name == "llm_requests"
        for s in family.samples
        if s.name == name and {k: v for k, v in s.labels.items() if k != "error_type"} == labels
    ]
    return sum(values) if values else None


def in_flight_total(registry: CollectorRegistry) -> float:
    """``llm_requests_in_flight`` summed over its label sets: a request counts in flight under
    the label it started with, which for a model not yet vouched for is ``other``."""
    return sum(
        sample.value
        for family in registry.collect()
        if family.name == "llm_requests_in_flight"
        for sample in family.samples
    )


LOOPBACK = {"listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0"}
"""Settings for an in-process sidecar: both ports on loopback, picked by the kernel."""


def sidecar_settings(upstream_url: str, **overrides) -> Settings:
    """``Settings`` for :func:`run_sidecar` (``overrides`` may name other addresses)."""
    return Settings(upstream=upstream_url, **{**LOOPBACK, **overrides})


async def run_sidecar(sc: Sidecar) -> RunningSidecar:
    """Start ``sc`` in this event loop as ``serve`` starts it (sidecar.app's ``setup_runners``
    and ``bind_sites``: ``ProxyRunner``, the proxy port's connections, the connection
    caps, the head budget, the relay's own way in), on the addresses its settings name
    (:func:`sidecar_settings`); ``carried`` counts the requests the relay answered (every
    one). Stop it with :meth:`RunningSidecar.stop`."""
    proxy_runner, admin_runner = await setup_runners(sc)
    running = RunningSidecar(sc, sc.registry, 0, 0, [proxy_runner, admin_runner])
    try:
        await bind_sites(sc, proxy_runner, admin_runner)
    except BaseException:
        await running.stop()
        raise
    running.port = proxy_runner.addresses[0][1]
    running.admin_port = admin_runner.addresses[0][1]
    guard = proxy_runner.guard
    hook = guard.carry
    assert hook is not None, "the production proxy port carries requests; is this SidecarRunner?"

    def counted(connection, message, payload):
        running.carried += 1
        return hook(connection, message, payload)

    guard.carry = counted
    return running


@pytest.fixture
async def sidecar_factory():
    """Start a sidecar (proxy and admin apps, the production server) in this event loop on
    ephemeral ports."""
    started: list[RunningSidecar] = []

    async def make(upstream_url: str, **overrides) -> RunningSidecar:
        sc = build_sidecar(
            sidecar_settings(upstream_url, **overrides),
            CollectorRegistry(),
            access_log=overrides.get("access_log", False),
        )
        started.append(running := await run_sidecar(sc))
        return running

    yield make
    for running in started:
        await running.stop()


async def wait_for(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0) -> None:
    """Poll until ``predicate`` is true (finalisation happens just after the client sees EOF).
    The timeout is long so that a loaded machine is not a failure; a passing test never waits it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout:.1f} s")
        await asyncio.sleep(0.01)


def metric_points(reader) -> dict[str, list]:
    """An in-memory OTel metric reader's data points by instrument name (every resource and scope)."""
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


@pytest.fixture
def spans():
    """A tracer provider that samples everything into memory, and its exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create({"service.name": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
async def traced(spans):
    """A sidecar with tracing on (the ``spans`` provider), in front of ``url``, as served (the
    relay starts the span where it sends the request)."""
    provider, _ = spans
    started: list[RunningSidecar] = []

    async def make(url: str) -> RunningSidecar:
        s = build_sidecar(
            sidecar_settings(url), CollectorRegistry(), access_log=False, tracer_provider=provider
        )
        started.append(running := await run_sidecar(s))
        return running

    yield make
    for running in started:
        await running.stop()


def start_prometheus(binary: str, workdir, config: dict) -> tuple[subprocess.Popen, int]:
    """A real Prometheus on a free loopback port (retried if the port is taken), with ``config`` (a prometheus.yml as a
    dict) and its data under ``workdir``. The caller terminates it."""
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return retry_on_port_clash(
        lambda port: subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    )  # fmt: skip
