"""A sidecar and aiohttp apps started in the test's own event loop, on ports the kernel picks:
the sidecar as ``serve`` starts it (``setup_runners`` and ``bind_sites``), so the server a
test drives is the production one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.app import Sidecar, bind_sites, setup_runners
from sidecar.config import Settings
from tests.support.samples import in_flight_total, sample_value


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
