"""The upstream's health in plain words, and one log line per change of it.

An operator who stops the inference server should read it in the sidecar's log at once, in
the same words a client's 502 carries (:func:`sidecar.relay.data.upstream._unreachable`), not as a
Python class name on ``/readyz``. :class:`UpstreamWatch` keeps the last known state; every
probe (the periodic one of :func:`watch`, and each ``/readyz``/``/upstreamz``) reports to it,
and it logs only transitions: ``upstream_unreachable`` with the cause, then
``upstream_reachable`` with how long it was down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import aiohttp
import structlog

from ..data.upstream import _timeout, _unreachable

__all__ = ["WATCH_SECONDS", "UpstreamWatch", "describe_failure", "watch"]

_log = structlog.get_logger("sidecar.upstream")

WATCH_SECONDS = 2.0
"""How often a serving sidecar asks the upstream's health path when nothing else does."""


def describe_failure(exc: BaseException, upstream: str) -> str:
    """Why a health probe failed, in the words of the proxy's own 502/504 messages."""
    parts = urlsplit(upstream)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return str(_timeout())
    os_error = getattr(exc, "os_error", None)
    if isinstance(exc, aiohttp.ClientSSLError) and isinstance(os_error, OSError):
        return str(_unreachable(os_error, host, port))
    if isinstance(os_error, OSError):
        return str(_unreachable(os_error, host, port))
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the inference server closed the connection"
    return f"the inference server at {host}:{port} is unreachable ({exc})"


class UpstreamWatch:
    """Last known state of the upstream; logs each change once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.up: bool | None = None  # None: not asked yet
        self.reason = ""
        self._since = clock()

    def report(self, up: bool, reason: str = "") -> None:
        now = self._clock()
        if up and self.up is False:
            _log.info("upstream_reachable", down_seconds=round(now - self._since, 1))
        elif not up and self.up is not False:
            _log.warning("upstream_unreachable", reason=reason)
        if up != self.up:
            self._since = now
        self.up, self.reason = up, reason


async def watch(probe: Callable[[], Awaitable[object]], interval: float = WATCH_SECONDS) -> None:
    """Call ``probe`` (which reports to the watch) every ``interval`` seconds until cancelled."""
    while True:
        try:
            await probe()
        except Exception:  # noqa: BLE001 - watching must never stop serving
            _log.debug("upstream_watch_failed", exc_info=True)
        await asyncio.sleep(interval)
