"""The simulated server's app and process: the core's OpenAI/vLLM routes and every other
dialect's routes (:mod:`sidecar.tools.sim.dialects`) on one aiohttp app.

This module sits on top: it imports the core and the dialects, and neither imports it, so
the simulator has no import circle.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web
from aiohttp.typedefs import Handler

from .core import (
    SHUTDOWN_TIMEOUT,
    SIM_STATE,
    SIM_STATS,
    SimState,
    SimulatorConfig,
    abort,
    add_openai_routes,
)
from .dialects import add_dialect_routes

__all__ = ["build_simulator_app", "run_simulator"]


@web.middleware
async def _reset_faults(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``x-sim-fail: reset`` on any route: read the request, then abort before any header."""
    if request.headers.get("x-sim-fail", "").strip().lower() != "reset":
        return await handler(request)
    await request.read()
    stats = request.app[SIM_STATS]
    stats.started += 1
    stats.dropped += 1
    abort(request)
    return web.Response(status=499, reason="Client Closed Request")


def build_simulator_app(config: SimulatorConfig) -> web.Application:
    """The simulated server as an aiohttp app; ``app[SIM_STATS]`` counts what it saw."""
    sim = SimState(config)
    app = web.Application(middlewares=[_reset_faults], client_max_size=config.max_body_bytes)
    app[SIM_STATE] = sim
    app[SIM_STATS] = sim.stats
    add_openai_routes(app)
    add_dialect_routes(app)
    return app


async def run_simulator(config: SimulatorConfig, host: str, port: int) -> None:
    """Serve the simulator on ``host:port`` until cancelled, SIGTERM or SIGINT; live streams
    get ``SHUTDOWN_TIMEOUT`` seconds to finish, like a real server's graceful shutdown."""
    app = build_simulator_app(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread
            pass
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        if (
            port == 0
        ):  # the kernel picked one: say which, so a caller can bind port 0 without a race
            port = runner.addresses[0][1]
        print(config.describe(host, port), file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
