"""``llm-sidecar demo``: a simulated server, the sidecar and load, with live figures.

The first command a newcomer runs, so it is a real deployment in miniature::

    load generator (this process) ──► sidecar subprocess ──► simulator subprocess
                                          │ admin port: /metrics
    live table (this process) ◄── scrape ─┘ every second

The simulator and the sidecar run as their own processes (``python -m sidecar simulate``
and ``python -m sidecar serve``), exactly as a user would start them; the simulator with
vLLM's ``--enable-force-include-usage``, so the sidecar counts tokens from usage. The proxy
listens on ``--port`` (8080) and the admin port on ``--metrics-port``, by default the next
port up (8081), so ``--port 9000`` moves both to 9000 and 9001. Every figure in the
table is computed from the sidecar's ``/metrics`` the way Prometheus would compute it:
counter deltas over a sliding window for rates, and ``histogram_quantile`` over bucket
deltas for percentiles. The load generator's own error count is shown only in the final
summary, as a cross-check of what the sidecar counted.

This module runs the demo; each concern has its own module beside it: :mod:`.exposition`
(``/metrics`` text -> :class:`~.exposition.Snapshot`) and :mod:`.quantiles` (window choice,
deltas, quantiles, rates) are pure functions tested by hand-computed values; :mod:`.draw`
prints, :mod:`.supervise` starts and stops the children, :mod:`.load` is the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from collections import deque

import aiohttp

from ..sim.core import SimulatorConfig
from .draw import Screen, curve_lines, intro, summary
from .exposition import Snapshot, parse_snapshot
from .load import MODEL, RAMP_SECONDS, LoadStats, client_loop
from .quantiles import WINDOW_SECONDS, window_baseline, window_figures
from .supervise import HOST, Child, DemoError, exited_message, free_port, port_free, wait_ready

__all__ = [
    "DEFAULT_PORT",
    "DEMO_SIMULATOR",
    "METRICS_PORT_OFFSET",
    "metrics_port_for",
    "run_demo",
    "simulator_args",
]

DEFAULT_PORT = 8080
METRICS_PORT_OFFSET = 1
"""Without ``--metrics-port`` the admin (metrics) port is the proxy port plus this."""

REFRESH_SECONDS = 1.0
MAX_FAILED_SCRAPES = 5  # consecutive; then the demo stops with an error

DEMO_SIMULATOR = SimulatorConfig(
    # Realistic timing for a mid-sized model on one GPU under light load.
    ttft=0.25,
    tpot=0.03,
    jitter=0.3,
    tokens=80,
    fail_rate=0.01,
    model=MODEL,
    # Continuous batching with a knee past 4 streams (docs/capacity.md): the default 8
    # clients land in band 8, slower per stream, faster in total than band 4.
    batch_alpha=0.1,
    batch_knee=4,
    batch_knee_factor=3.0,
    force_include_usage=True,
)
"""The demo's simulated server; its header describes this same config."""


def simulator_args(config: SimulatorConfig) -> list[str]:
    """``llm-sidecar simulate`` flags that start a simulator with ``config``'s timing."""
    args = [
        "--ttft", repr(config.ttft), "--tpot", repr(config.tpot),
        "--jitter", repr(config.jitter), "--tokens", str(config.tokens),
        "--tokens-spread", repr(config.tokens_spread), "--model", config.model,
        "--fail-rate", repr(config.fail_rate), "--drop-rate", repr(config.drop_rate),
        "--batch-alpha", repr(config.batch_alpha), "--batch-knee", str(config.batch_knee),
        "--batch-knee-factor", repr(config.batch_knee_factor),
    ]  # fmt: skip
    if config.force_include_usage:
        args.append("--enable-force-include-usage")
    return args


def metrics_port_for(port: int, metrics_port: int | None = None) -> int:
    """The admin port: ``--metrics-port`` if given, else ``--port`` + 1."""
    return port + METRICS_PORT_OFFSET if metrics_port is None else metrics_port


# How long each child gets to exit after SIGTERM before it is killed.
SIDECAR_DRAIN_SECONDS = 5.0
SIDECAR_STOP_TIMEOUT = SIDECAR_DRAIN_SECONDS + 3.0
SIMULATOR_STOP_TIMEOUT = 3.0
LOAD_GRACE_SECONDS = 3.0  # in-flight client requests may finish before they are cancelled


async def _scrape(session: aiohttp.ClientSession, url: str) -> Snapshot:
    async with session.get(url) as resp:
        resp.raise_for_status()
        text = await resp.text()
    return parse_snapshot(text, time.monotonic())


async def _demo(
    duration: float | None, concurrency: int, port: int, admin: int, screen: Screen
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main = asyncio.current_task()

    def on_signal() -> None:
        if stop.is_set() and main is not None:
            main.cancel()  # a second Ctrl-C: stop now, the finally still reaps the children
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)

    sim_port = free_port()
    children: list[Child] = []
    load_tasks: list[asyncio.Task[None]] = []
    stats = LoadStats()
    codes: dict[str, int] = {}
    try:
        simulator = Child(
            "simulator",
            ["simulate", "--listen", f"{HOST}:{sim_port}", *simulator_args(DEMO_SIMULATOR)],
        )
        children.append(simulator)
        sidecar = Child(
            "sidecar",
            [
                "serve",
                "--upstream", f"http://{HOST}:{sim_port}",
                "--listen", f"{HOST}:{port}",
                "--metrics-listen", f"{HOST}:{admin}",
                "--log-level", "warning",
                "--access-log", "false",
                "--drain-seconds", f"{SIDECAR_DRAIN_SECONDS:g}",
            ],
        )  # fmt: skip
        children.append(sidecar)

        admin_timeout = aiohttp.ClientTimeout(total=5.0)
        async with aiohttp.ClientSession(timeout=admin_timeout) as admin_session:
            await wait_ready(admin_session, f"http://{HOST}:{admin}/readyz", children)
            metrics_url = f"http://{HOST}:{admin}/metrics"
            first = await _scrape(admin_session, metrics_url)
            history: deque[Snapshot] = deque(
                [first], maxlen=int(WINDOW_SECONDS / REFRESH_SECONDS) + 5
            )
            screen.text(
                intro(
                    DEMO_SIMULATOR,
                    sim_port,
                    port,
                    admin,
                    concurrency,
                    RAMP_SECONDS,
                    duration,
                    HOST,
                )
            )

            client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=30.0)
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(
                timeout=client_timeout, connector=connector
            ) as load_session:
                base = f"http://{HOST}:{port}"
                seed = random.randrange(1 << 30)
                load_tasks = [
                    asyncio.create_task(
                        client_loop(load_session, base, stats, stop, seed + i, i * RAMP_SECONDS)
                    )
                    for i in range(concurrency)
                ]
                started = first.at
                deadline = None if duration is None else started + duration
                tick = started
                failed_scrapes = 0
                while not stop.is_set():
                    tick += REFRESH_SECONDS
                    wake = tick if deadline is None else min(tick, deadline)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), max(0.0, wake - time.monotonic()))
                    for child in children:
                        if child.exited:
                            raise DemoError(exited_message(child, "while the demo was running"))
                    if stop.is_set():
                        break
                    try:
                        snap = await _scrape(admin_session, metrics_url)
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        failed_scrapes += 1
                        if failed_scrapes >= MAX_FAILED_SCRAPES:
                            raise DemoError(f"cannot scrape {metrics_url}: {exc!r}") from None
                        continue  # skip this refresh; the window absorbs the gap
                    failed_scrapes = 0
                    history.append(snap)
                    base_snap = window_baseline(history, snap.at, WINDOW_SECONDS)
                    screen.show(
                        window_figures(snap, base_snap),
                        snap.at - started,
                        stats.running,
                        concurrency,
                        curve_lines(snap, first),
                    )
                    if deadline is not None and snap.at >= deadline - 1e-3:
                        break

                # Stop the load: no new requests; in-flight ones get a moment to finish.
                stop.set()
                _, pending = await asyncio.wait(load_tasks, timeout=LOAD_GRACE_SECONDS)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*load_tasks, return_exceptions=True)
            # The load session is closed: no client connection is left for the drain.
            try:
                last = await _scrape(admin_session, metrics_url)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise DemoError(f"cannot scrape {metrics_url} for the summary: {exc!r}") from None

        # As a pod with a native sidecar stops: the server first, then the sidecar, which
        # drains for as long as its upstream answers (sidecar/relay/server/drain.py).
        codes["simulator"] = simulator.stop(SIMULATOR_STOP_TIMEOUT)
        codes["sidecar"] = sidecar.stop(SIDECAR_STOP_TIMEOUT)
        screen.text("\n" + summary(first, last, stats, codes))
        if codes["sidecar"] != 0:
            raise DemoError(exited_message(sidecar, "on SIGTERM (expected 0 after draining)"))
        return 0
    finally:
        for task in load_tasks:
            task.cancel()
        for child in children:  # the upstream first, then the sidecar (it follows it down)
            child.stop(SIDECAR_STOP_TIMEOUT if child.name == "sidecar" else SIMULATOR_STOP_TIMEOUT)
            child.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def run_demo(
    duration: float | None = None,
    concurrency: int = 8,
    port: int = DEFAULT_PORT,
    metrics_port: int | None = None,
) -> int:
    """Run the demo; returns the process exit code (0 ok, 1 failure, 2 bad usage or port taken).

    The proxy listens on ``port``, the admin (metrics) port on ``metrics_port``, by default
    ``port`` + 1."""

    def fail(message: str, code: int) -> int:
        print(f"llm-sidecar demo: {message}", file=sys.stderr, flush=True)
        return code

    admin = metrics_port_for(port, metrics_port)
    if not 1 <= port <= 65535:
        return fail("--port must be 1-65535", 2)
    if not 1 <= admin <= 65535:
        if metrics_port is None:
            return fail(
                f"--port must be 1-{65535 - METRICS_PORT_OFFSET} (the metrics port is --port + "
                f"{METRICS_PORT_OFFSET} unless --metrics-port is given)",
                2,
            )
        return fail("--metrics-port must be 1-65535", 2)
    if admin == port:
        return fail(f"--metrics-port must differ from --port (both {port})", 2)
    if concurrency < 1:
        return fail("--concurrency must be at least 1", 2)
    if duration is not None and not duration > 0:
        return fail("--duration must be a positive number of seconds", 2)
    if not port_free(port):
        return fail(
            f"{HOST}:{port} (proxy port) is already in use; pick another with --port "
            "(make demo PORT=...), which moves the metrics port to the port after it",
            2,
        )
    if not port_free(admin):
        how = "--metrics-port" if metrics_port is not None else "--port or --metrics-port"
        return fail(
            f"{HOST}:{admin} (metrics port{'' if metrics_port is not None else ', --port + 1'}) "
            f"is already in use; pick another with {how}",
            2,
        )

    screen = Screen(sys.stdout, live=sys.stdout.isatty() and os.environ.get("TERM") != "dumb")
    try:
        return asyncio.run(_demo(duration, concurrency, port, admin, screen))
    except DemoError as exc:
        return fail(str(exc), exc.code)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return fail("interrupted", 130)
