"""The demo's child processes: free ports, starting ``python -m sidecar ...`` in its own
session (killed with the demo, on Linux), its output kept for error messages, waiting for
readiness, stopping with SIGTERM then SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import aiohttp

__all__ = [
    "HOST",
    "READY_TIMEOUT",
    "Child",
    "DemoError",
    "exited_message",
    "free_port",
    "indent",
    "port_free",
    "wait_ready",
]

READY_TIMEOUT = 15.0
HOST = "127.0.0.1"


class DemoError(Exception):
    """Ends the demo with a message for the user and an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def port_free(port: int, host: str = HOST) -> bool:
    # SO_REUSEADDR as aiohttp binds, so a port in TIME_WAIT is not reported as taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _parent_death_signal() -> Callable[[], None] | None:
    """On Linux, a child gets SIGTERM if the demo itself is killed (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes  # noqa: PLC0415

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


class Child:
    """A subprocess whose combined output goes to an anonymous file, for error messages."""

    def __init__(self, name: str, args: Sequence[str]) -> None:
        self.name = name
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", *args],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            # Own process group: a Ctrl-C in the terminal reaches only the demo, which then
            # stops load, reads the final figures and stops the children in order.
            start_new_session=True,
            preexec_fn=_parent_death_signal(),
        )

    @property
    def exited(self) -> bool:
        return self.proc.poll() is not None

    def tail(self, lines: int = 15) -> str:
        try:
            self.log.seek(0)
            data = self.log.read()
        except (OSError, ValueError):
            return ""
        text = data.decode("utf-8", "replace").rstrip()
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        self.log.close()


def exited_message(child: Child, what: str) -> str:
    tail = child.tail()
    detail = ("\n" + indent(tail)) if tail else " (no output)"
    return f"the {child.name} exited with code {child.proc.returncode} {what}:{detail}"


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


async def wait_ready(session: aiohttp.ClientSession, url: str, children: Sequence[Child]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    last = "no answer"
    while True:
        for child in children:
            if child.exited:
                tail = child.tail()
                if child.proc.returncode == 2 and "cannot listen" in tail:
                    # Someone took the port between our check and the bind: still a one-liner.
                    raise DemoError(
                        f"{child.name}: {tail.splitlines()[-1].removeprefix('llm-sidecar: ')}", 2
                    )
                raise DemoError(exited_message(child, "before the sidecar was ready"))
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                body = await resp.text()
                if resp.status == 200:
                    return
                last = f"{resp.status} {body.strip()}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            last = type(exc).__name__
        if time.monotonic() > deadline:
            tails = "".join(
                f"\n  {c.name} output:\n{indent(c.tail()) or '    (none)'}" for c in children
            )
            raise DemoError(
                f"the sidecar was not ready after {READY_TIMEOUT:.0f}s ({url}: {last}){tails}"
            )
        await asyncio.sleep(0.1)
