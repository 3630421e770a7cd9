"""What the client-facing HTTP server refuses before a request reaches the proxy, and how.

Policy only: the numbers (connection cap, request head budget), the answers (503 with
Retry-After, 431, the parser's 414/431/400 as the proxy's JSON error body) and the log lines.
The mechanics are the proxy port's own connection
(:class:`sidecar.relay.server.proxy_port.ProxyConnection`) and, on the admin port, aiohttp's
(:class:`sidecar.relay.server.aiohttp_internals.GuardedRequestHandler`); each asks a
:class:`ConnectionGuard` at each step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any, Protocol

import structlog
from aiohttp import web
from aiohttp.http import RawRequestMessage
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader

try:
    import resource
except ImportError:  # pragma: no cover - not on Linux
    resource = None  # type: ignore[assignment]  # no module there: None guards its use

from .errors import error_response, raw_error_response
from .head_budget import head_too_large_response

__all__ = ["ConnectionGuard", "RefusalLog", "connection_cap", "parse_refusal"]

_log = structlog.get_logger("sidecar.app")


def parse_refusal(exc: BaseException) -> tuple[int, str, str]:
    """Status, error type and message for a request aiohttp's parser refused.

    aiohttp raises ``LineTooLong`` for the request line with a ``bytearray`` excerpt and for
    a header field with ``bytes``; "Too many headers received" is a plain BadHttpMessage.
    Anything else the parser refuses (framing conflicts, bad characters) stays a 400.
    """
    if isinstance(exc, LineTooLong):
        if isinstance(exc.args[0], bytearray):
            return (
                414,
                "request_line_too_long",
                "the request line is longer than the sidecar accepts",
            )
        return 431, "header_too_large", "a request header field is larger than the sidecar accepts"
    if isinstance(exc, HttpProcessingError) and "Too many headers" in (exc.message or ""):
        return (
            431,
            "too_many_headers",
            "the request has more header fields than the sidecar accepts",
        )
    return 400, "bad_request", "the request is not valid HTTP/1.1 (framing or header syntax)"


_BUSY_RETRY_AFTER = 1  # seconds: connections free up as fast as streams end


def busy_response() -> bytes:
    return raw_error_response(
        503, "Service Unavailable", "too_many_connections",
        "the sidecar has as many client connections open as it accepts; retry shortly",
        b"Retry-After: %d\r\n" % _BUSY_RETRY_AFTER,
    )  # fmt: skip


class RefusalLog:
    """One log line per ``every`` seconds at most while connections are being refused, with
    the number refused since the last line: a flood must not become a flood of lines."""

    def __init__(self, every: float = 10.0) -> None:
        self._every = every
        self._last = float("-inf")
        self._count = 0

    def refused(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._count += 1
        now = loop.time()
        if now - self._last >= self._every:
            _log.warning("connection_limit_reached", max_connections=limit, refused=self._count)
            self._last, self._count = now, 0


class Carried(Protocol):
    """A request the relay carries on a connection (sidecar/relay/data/exchange.py's
    ``Exchange``), told what happens to that connection."""

    def start(self) -> None: ...
    def body_arrived(self) -> None: ...
    def client_drained(self) -> None: ...
    def client_gone(self) -> None: ...


CarryHook = Callable[[Any, RawRequestMessage, StreamReader], Carried]
"""``carry(connection, head, body)``: the relay's answer to the next request on
``connection``, its body perhaps still arriving (sidecar/relay/data/exchange.py's
``Carrier``)."""


class ConnectionGuard:
    """The limits of one listening port and the answers past them (see the module doc)."""

    def __init__(
        self, max_connections: int = 0, head_budget: int = 0, carry: CarryHook | None = None
    ) -> None:
        self.max_connections = max_connections  # 0: no cap
        self.head_budget = (
            head_budget  # bytes of one request head; 0: aiohttp's per-field limits alone
        )
        # Given each request head on a connection, in order: the relay answers every one
        # (sidecar/relay/data/exchange.py). None on the admin port (aiohttp's handlers).
        self.carry = carry
        self.refusal_log = RefusalLog()

    def refuse_connection(self, loop: asyncio.AbstractEventLoop) -> bytes:
        """A connection past the cap: the bytes to answer it with before closing it."""
        self.refusal_log.refused(loop, self.max_connections)
        return busy_response()

    def head_too_large(self) -> bytes:
        _log.info("request_refused", status=431, reason="request_head_too_large", peer=None)
        return head_too_large_response()

    def parse_refused(self, exc: HttpProcessingError, peer: str | None) -> web.Response:
        """The JSON answer to a request aiohttp's parser refused, logged without the request
        bytes (aiohttp would quote them in its answer and its log)."""
        response = error_response(*self._refused(exc, peer))
        response.force_close()
        return response

    def refused_unparsed(self, exc: BaseException, peer: str | None) -> bytes:
        """:meth:`parse_refused` as a whole response on a port whose requests the relay
        answers (no aiohttp response there); the connection closes after it."""
        status, kind, text = self._refused(exc, peer)
        return raw_error_response(status, HTTPStatus(status).phrase, kind, text)

    @staticmethod
    def _refused(exc: BaseException, peer: str | None) -> tuple[int, str, str]:
        status, kind, text = parse_refusal(exc)
        if not isinstance(exc, BadHttpMethod):  # not HTTP at all (TLS, scanners): not worth a line
            _log.info("request_refused", status=status, reason=kind, peer=peer)
        return status, kind, text


MEMORY_RESERVE = 128 << 20
"""The container memory the connection cap leaves to the process itself (its idle RSS is about
55 MiB) and to one largest request body being read."""
MEMORY_PER_CONNECTION = 16 << 10
"""What one open stream costs the process (docs/reliability.md: 15.6-17.6 KiB a stream)."""
CGROUP = Path("/sys/fs/cgroup")


def memory_limit(root: Path = CGROUP) -> int | None:
    """The container's memory limit in bytes (cgroup v2 ``memory.max``, else v1's
    ``memory.limit_in_bytes``), or None when it has none."""
    try:
        text = (root / "memory.max").read_text().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        pass
    try:
        limit = int((root / "memory" / "memory.limit_in_bytes").read_text())
    except (OSError, ValueError):
        return None
    return None if limit >= 1 << 60 else limit  # v1 says "none" with a huge number


def connection_cap(configured: int, *, workers: int = 1, memory: int | None = None) -> int:
    """Client connections the proxy port accepts at once: as configured, else the smaller of
    half the open-files limit (each stream also holds an upstream socket) less a reserve for
    the admin port, the pooled upstream connections and the process's own files, and what
    the container's memory limit (``memory``, else the cgroup's) holds at
    :data:`MEMORY_PER_CONNECTION` a stream past :data:`MEMORY_RESERVE`, shared by the pod's
    ``workers``. A cap the memory cannot hold would end in an OOM kill of every stream."""
    if configured:
        return configured
    caps: list[int] = []
    if resource is not None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            caps.append(max((soft - 128) // 2, 16))
    limit = memory_limit() if memory is None else memory
    if limit is not None:
        caps.append(max((limit - MEMORY_RESERVE) // MEMORY_PER_CONNECTION // max(workers, 1), 16))
    return min(caps) if caps else 0
