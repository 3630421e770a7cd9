"""The simulator and a sidecar in the test's own event loop, the sidecar on
:class:`sidecar.app.SidecarRunner` as ``serve`` runs it (guarded handler, early path).

``rig_factory`` builds one per call and cleans every runner up after the test. Its keywords
beyond ``upstream`` and ``sim`` are :class:`sidecar.config.Settings` fields, and the sidecar is
built from them by ``build_sidecar``, as ``serve`` builds it: a setting reaches the relay only
through the production wiring, never set on the built objects. The test process then holds
the simulator, the sidecar and the client, so a census of it (see ``tests.support.census``)
sees everything a fault could leave behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.app import RUNNER_KWARGS, ProxyRunner, SidecarRunner, build_sidecar
from sidecar.config import Settings
from sidecar.tools.sim.core import SIM_STATS, SimStats, SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.support.in_process import start_app
from tests.support.samples import sample_value

CHAT = "/v1/chat/completions"


@dataclass
class Rig:
    sim_port: int
    sim: SimStats
    port: int
    admin_port: int
    registry: CollectorRegistry
    runners: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sample(self, name: str, **labels) -> float | None:
        return sample_value(self.registry, name, labels)


async def start_site(runner: web.AppRunner | ProxyRunner) -> int:
    """Start ``runner`` on a free port of 127.0.0.1; the port."""
    await runner.setup()
    if isinstance(runner, ProxyRunner):
        await runner.listen("127.0.0.1", 0)
        return int(runner.addresses[0][1])
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@pytest.fixture
async def rig_factory():
    runners: list[web.AppRunner | ProxyRunner] = []

    async def make(
        *,
        upstream: str | None = None,
        sim: SimulatorConfig | None = None,
        **settings,
    ) -> Rig:
        app = build_simulator_app(
            sim or SimulatorConfig(ttft=0.01, tpot=0.005, jitter=0, tokens=20, seed=7)
        )
        # As run_simulator (and uvicorn): a handler learns at once that its client left.
        sim_runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        runners.append(sim_runner)
        sim_port = await start_site(sim_runner)
        sc = build_sidecar(
            Settings(upstream=upstream or f"http://127.0.0.1:{sim_port}", **settings),
            CollectorRegistry(),
            access_log=False,
        )
        proxy_runner = ProxyRunner(sc, shutdown_timeout=1.0)
        admin_runner = SidecarRunner(sc.admin_app, **RUNNER_KWARGS)
        runners.extend([proxy_runner, admin_runner])
        port = await start_site(proxy_runner)
        admin_port = await start_site(admin_runner)
        return Rig(sim_port, app[SIM_STATS], port, admin_port, sc.registry, runners)

    yield make
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def simulator():
    """Starts simulators in this event loop (``SimulatorConfig`` keywords); each one's URL."""
    runners = []

    async def make(**kwargs) -> str:
        runner, port = await start_app(
            build_simulator_app(SimulatorConfig(**kwargs)), handler_cancellation=True
        )
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield make
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def serve_process(serve_process):
    """conftest's ``serve_process``, without the caller's ``OTEL_*``/``LLM_SIDECAR_*`` environment."""
    return partial(serve_process, clean_env=True)
