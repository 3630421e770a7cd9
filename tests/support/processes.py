"""Ending the processes a test started (Prometheus, Alertmanager, a server): politely first."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
