"""What a process holds, read from /proc: asyncio tasks, open file descriptors, TCP sockets by
state, and memory.

"Nothing left behind" after a fault is a census taken before it that must come back to
exactly that once the client has gone (``quiet_census`` then ``settles_to``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

MiB = 1 << 20
CHART_LIMIT = 512 * MiB  # the chart's default memory limit for the sidecar container

_TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
    "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}  # fmt: skip


def _socket_inodes(pid: int | str) -> tuple[int, set[str]]:
    fds = 0
    inodes: set[str] = set()
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:  # closed between listdir and readlink
            continue
        fds += 1
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return fds, inodes


def tcp_sockets(pid: int | str = "self") -> list[tuple[str, int, int]]:
    """(state, local port, remote port) of every TCP socket the process holds open."""
    _, inodes = _socket_inodes(pid)
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[9] in inodes:
                local, remote, state = parts[1], parts[2], parts[3]
                out.append(
                    (
                        _TCP_STATES.get(state, state),
                        int(local.rsplit(":", 1)[1], 16),
                        int(remote.rsplit(":", 1)[1], 16),
                    )
                )
    return out


@dataclass(frozen=True)
class Census:
    """What a process holds: asyncio tasks (own process only), fds, TCP sockets by state."""

    tasks: int | None
    fds: int
    tcp: tuple[tuple[str, int], ...]  # sorted (state, count)

    def plus(self, *, tasks: int = 0, fds: int = 0, established: int = 0) -> Census:
        tcp = Counter(dict(self.tcp))
        tcp["ESTABLISHED"] += established
        return Census(
            None if self.tasks is None else self.tasks + tasks,
            self.fds + fds,
            tuple(sorted((k, v) for k, v in tcp.items() if v)),
        )


def process_census(pid: int | str = "self") -> Census:
    fds, _ = _socket_inodes(pid)
    states = Counter(state for state, _, _ in tcp_sockets(pid))
    tasks = len(asyncio.all_tasks()) if pid == "self" else None
    return Census(tasks, fds, tuple(sorted(states.items())))


async def quiet_census(pid: int | str = "self") -> Census:
    """A baseline census: garbage from earlier tests collected (an unclosed session closes
    its sockets when collected) and two readings 50 ms apart agreeing."""
    last = None
    for _ in range(40):
        gc.collect()
        now = process_census(pid)
        if now == last:
            return now
        last = now
        await asyncio.sleep(0.05)
    return last


async def settles_to(expected: Census, pid: int | str = "self", timeout: float = 30.0) -> None:
    """Wait until the census equals ``expected``; fail with both when it never does."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        now = process_census(pid)
        if now == expected:
            return
        if time.monotonic() > deadline:
            tasks = [repr(t.get_coro()) for t in asyncio.all_tasks()] if pid == "self" else []
            raise AssertionError(
                f"left behind: expected {expected}, got {now}; tasks {tasks}; sockets {tcp_sockets(pid)}"
            )
        await asyncio.sleep(0.02)


def proc_status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` size field (``VmRSS``, ``VmHWM``...) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


def rss_bytes(pid: int) -> int:
    return proc_status(pid, "VmRSS")


def reset_peak(pid: int) -> None:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@contextlib.asynccontextmanager
async def answer_times(session, url: str, every: float = 0.02):
    """Probe ``url`` (an admin endpoint, e.g. ``/healthz``) every ``every`` seconds while the
    block runs; yields the list of each answer's time in seconds, filled as they come. What a
    readiness or liveness probe would have waited for while the sidecar was busy."""
    waits: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            t = loop.time()
            async with session.get(url) as r:
                assert r.status == 200
                await r.read()
            waits.append(loop.time() - t)
            await asyncio.sleep(every)

    prober = asyncio.create_task(probe())
    try:
        yield waits
    finally:
        done.set()
        await prober
