"""Shared fixtures: real sockets on 127.0.0.1, a scripted upstream, and a sidecar in front."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
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

from sidecar.app import RUNNER_KWARGS, Sidecar, build_sidecar
from sidecar.config import Settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    sidecar: Sidecar
    registry: CollectorRegistry
    port: int
    admin_port: int

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
        if name.startswith("llm_time_to_first_token_seconds") and not self.sidecar.settings.ttft_prompt_classes:
            labels.setdefault("prompt_class", "all")
        return self.registry.get_sample_value(name, labels)


def in_flight_total(registry: CollectorRegistry) -> float:
    """``llm_requests_in_flight`` summed over its label sets: a request counts in flight under
    the label it started with, which for a model not yet vouched for is ``other``."""
    return sum(
        sample.value
        for family in registry.collect()
        if family.name == "llm_requests_in_flight"
        for sample in family.samples
    )


@pytest.fixture
async def sidecar_factory():
    """Start a sidecar (proxy and admin apps) in this event loop on ephemeral ports."""
    runners: list[web.AppRunner] = []

    async def make(upstream_url: str, **overrides) -> RunningSidecar:
        settings = Settings(upstream=upstream_url, **overrides)
        registry = CollectorRegistry()
        sc = build_sidecar(settings, registry, access_log=overrides.get("access_log", False))
        proxy_runner, port = await start_app(sc.proxy_app, shutdown_timeout=1.0, **RUNNER_KWARGS)
        admin_runner, admin_port = await start_app(sc.admin_app, **RUNNER_KWARGS)
        runners.extend([proxy_runner, admin_runner])
        return RunningSidecar(sc, registry, port, admin_port)

    yield make
    for runner in runners:
        await runner.cleanup()


async def wait_for(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0) -> None:
    """Poll until ``predicate`` is true (finalisation happens just after the client sees EOF)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met within %.1f s" % timeout)
        await asyncio.sleep(0.01)


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
    """A sidecar with tracing on (the ``spans`` provider), in front of ``url``."""
    provider, _ = spans
    runners: list[web.AppRunner] = []

    async def make(url: str) -> RunningSidecar:
        registry = CollectorRegistry()
        s = build_sidecar(Settings(upstream=url), registry, access_log=False, tracer_provider=provider)
        proxy_runner, port = await start_app(s.proxy_app, shutdown_timeout=1.0, **RUNNER_KWARGS)
        admin_runner, admin_port = await start_app(s.admin_app, **RUNNER_KWARGS)
        runners.extend([proxy_runner, admin_runner])
        return RunningSidecar(s, registry, port, admin_port)

    yield make
    for runner in runners:
        await runner.cleanup()


def start_prometheus(binary: str, workdir, config: dict) -> tuple[subprocess.Popen, int]:
    """A real Prometheus on a free loopback port, with ``config`` (a prometheus.yml as a
    dict) and its data under ``workdir``. The caller terminates it."""
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, port
