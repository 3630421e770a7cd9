"""Shared fixtures: real sockets on 127.0.0.1, a scripted upstream, and a sidecar in front.

Fixtures and hooks only; the helpers they use (and tests import) live in ``tests/support/``."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from aiohttp import web
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from prometheus_client import CollectorRegistry

from sidecar.app import build_sidecar
from tests.support.in_process import (
    RunningSidecar,
    Upstream,
    run_sidecar,
    sidecar_settings,
    start_app,
)
from tests.support.serve import ServeProcess

# The skip rule: every skip fails under CI=true unless its reason is on the allow-list there;
# and under pytest -n, the few tests that judge the machine's pace run alone.
pytest_plugins = ("tests.support.skips", "tests.support.serial")


@pytest.fixture
def refused_url():
    """A loopback URL that refuses connections: a socket bound but not listening, held for
    the test so no other process can take its port (a closed probe port could be reused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


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
