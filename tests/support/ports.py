"""Ports for servers a test starts. The sidecar and every aiohttp app bind port 0 and say which
port they got; these are for third-party servers that cannot."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable


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
