"""``llm-sidecar demo``: a simulated server, the sidecar and load, with live figures.

The first command a newcomer runs, so it is a real deployment in miniature::

    load generator (this process) ──► sidecar subprocess ──► simulator subprocess
                                          │ admin port: /metrics
    live table (this process) ◄── scrape ─┘ every second

The simulator and the sidecar run as their own processes (``python -m sidecar simulate``
and ``python -m sidecar serve``), exactly as a user would start them. Every figure in the
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

from .draw import Screen, curve_lines, summary
from .exposition import Snapshot, parse_snapshot
from .load import MODEL, RAMP_SECONDS, LoadStats, client_loop
from .quantiles import WINDOW_SECONDS, window_baseline, window_figures
from .supervise import HOST, Child, DemoError, exited_message, free_port, port_free, wait_ready

__all__ = ["ADMIN_PORT_OFFSET", "run_demo"]

ADMIN_PORT_OFFSET = 1384
"""The admin (metrics) port is the proxy port plus this (8080 -> 9464)."""

REFRESH_SECONDS = 1.0
MAX_FAILED_SCRAPES = 5  # consecutive; then the demo stops with an error

# Realistic timing for a mid-sized model on one GPU under light load.
SIMULATOR_ARGS = (
    "--ttft", "0.25", "--tpot", "0.03", "--jitter", "0.3", "--tokens", "80",
    "--fail-rate", "0.01", "--model", MODEL,
    # Continuous batching with a knee past 4 streams (docs/capacity.md): the default 8
    # clients land in band 8, slower per stream, faster in total than band 4.
    "--batch-alpha", "0.1", "--batch-knee", "4", "--batch-knee-factor", "3",
)  # fmt: skip

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


def _intro(port: int, admin: int, sim_port: int, concurrency: int, duration: float | None) -> str:
    body = '{"model":"%s","stream":true,"messages":[{"role":"user","content":"hi"}]}' % MODEL
    until = "Ctrl-C" if duration is None else f"{duration:g}s"
    return "\n".join(
        [
            "llm-sidecar demo: simulated vLLM server -> sidecar -> your client",
            f"  simulated server   http://{HOST}:{sim_port}   (ttft ~0.25s, tpot ~0.03s, 1% errors)",
            f"  sidecar proxy      http://{HOST}:{port}",
            f"  sidecar metrics    http://{HOST}:{admin}/metrics   (what Prometheus would scrape)",
            "  try it:",
            f"    curl -N http://{HOST}:{port}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'",
            f"  load: {concurrency} concurrent clients (joining {RAMP_SECONDS:g}s apart) until {until}",
            "",
        ]
    )


async def _demo(duration: float | None, concurrency: int, port: int, screen: Screen) -> int:
    admin = port + ADMIN_PORT_OFFSET
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
    load_tasks: list[asyncio.Task] = []
    stats = LoadStats()
    codes: dict[str, int] = {}
    try:
        simulator = Child(
            "simulator", ["simulate", "--listen", f"{HOST}:{sim_port}", *SIMULATOR_ARGS]
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
            screen.text(_intro(port, admin, sim_port, concurrency, duration))

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
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), max(0.0, wake - time.monotonic()))
                    for child in children:
                        if child.exited:
                            raise DemoError(exited_message(child, "while the demo was running"))
                    if stop.is_set():
                        break
                    try:
                        snap = await _scrape(admin_session, metrics_url)
                    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
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
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
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


def run_demo(duration: float | None = None, concurrency: int = 8, port: int = 8080) -> int:
    """Run the demo; returns the process exit code (0 ok, 1 failure, 2 bad usage or port taken)."""

    def fail(message: str, code: int) -> int:
        print(f"llm-sidecar demo: {message}", file=sys.stderr, flush=True)
        return code

    admin = port + ADMIN_PORT_OFFSET
    if port < 1 or admin > 65535:
        top = 65535 - ADMIN_PORT_OFFSET
        return fail(f"--port must be 1-{top} (the metrics port is --port + {ADMIN_PORT_OFFSET})", 2)
    if concurrency < 1:
        return fail("--concurrency must be at least 1", 2)
    if duration is not None and not duration > 0:
        return fail("--duration must be a positive number of seconds", 2)
    for p, what in ((port, "proxy"), (admin, "metrics")):
        if not port_free(p):
            return fail(
                f"{HOST}:{p} ({what} port) is already in use; pick another with --port (make demo PORT=...)",
                2,
            )

    screen = Screen(sys.stdout, live=sys.stdout.isatty() and os.environ.get("TERM") != "dumb")
    try:
        return asyncio.run(_demo(duration, concurrency, port, screen))
    except DemoError as exc:
        return fail(str(exc), exc.code)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return fail("interrupted", 130)
