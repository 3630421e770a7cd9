"""An upstream that is the sidecar itself: refused at start, and named when it comes back.

``--upstream`` at the sidecar's own ``--listen`` address (a copy-paste slip, or ``localhost``
when the server listens elsewhere) would relay every request to the sidecar again, each hop
adding to ``X-Forwarded-For`` until a head passes its budget and the innermost hop answers
431, hundreds of connections deep, while ``/readyz`` blames the inference server. Two
checks, neither touching what a client sends:

- at start, once the proxy port is bound, :func:`loop_reason` resolves the upstream's host
  and refuses to serve when one of its addresses is one the proxy listens on (the same
  address, or any local address when listening on ``0.0.0.0``/``::``);
- the sidecar's own requests to the upstream (health probes, the model listing, engine
  metrics: never a client's) carry :data:`LOOP_HEADER` with this process's
  :data:`LOOP_TOKEN`; the proxy port answers such a request with :func:`loop_refusal`
  with 508 at once, so a loop the start-up check cannot see (through a port forward, a
  Service, a name that resolves elsewhere later) is cut at the first hop, and ``/readyz``
  says "the upstream relays back to this sidecar" instead of blaming the server. Clients'
  requests are relayed unchanged (the prime directive): in such a loop they still recurse,
  but the pod is not ready, and its log and ``/readyz`` say why.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import secrets
import socket
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import structlog

from ..server.errors import raw_error_response

__all__ = [
    "LOOP_HEADER",
    "LOOP_STATUS",
    "LOOP_TOKEN",
    "UpstreamLoopError",
    "came_back",
    "loop_refusal",
    "loop_reason",
]

_log = structlog.get_logger("sidecar.upstream")

LOOP_HEADER = "X-LLM-Sidecar-Loop"
LOOP_TOKEN = secrets.token_hex(8)
"""One per process: two sidecars stacked in front of each other (a gateway's and a pod's)
never mistake each other's probes for their own."""

LOOP_STATUS = 508  # Loop Detected (RFC 5842)

LOOP_MESSAGE = (
    "this request came back to the sidecar that sent it: --upstream leads back to this sidecar "
    "(directly or through a forwarder); give the inference server's address"
)

_WILDCARDS = {"", "0.0.0.0", "::"}


class UpstreamLoopError(OSError):
    """``--upstream`` is the sidecar's own listen address (the CLI prints the one line)."""

    flag = "--upstream"

    def __init__(self, message: str) -> None:
        super().__init__(errno.ELOOP, message)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone is not the address
    except ValueError:
        return None
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr


def _local(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``addr`` is one of this host's own (a socket can bind it)."""
    if addr.is_loopback or addr.is_unspecified:  # connecting to 0.0.0.0 reaches this host
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(addr), 0))
    except OSError:
        return False
    return True


def _reaches(
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, host: str, bound_port: int
) -> bool:
    """Whether a connection to ``addr:port`` lands on a socket bound to ``host:bound_port``."""
    if port != bound_port:
        return False
    if host in _WILDCARDS:
        # asyncio binds "::" IPv6-only (IPV6_V6ONLY): an IPv4 address at that port is
        # another socket (an inference server on 127.0.0.1 can share the port number).
        if (host == "0.0.0.0" and addr.version == 6) or (host == "::" and addr.version == 4):
            return False
        return _local(addr)
    bound = _ip(host)
    return bound is not None and (bound == addr or (bound.is_unspecified and _local(addr)))


async def loop_reason(
    upstream: str, bound: Iterable[tuple[Any, ...]], *, timeout: float = 2.0
) -> str | None:
    """Why ``upstream`` is this sidecar itself, or None. ``bound``: the proxy runner's
    socket addresses (``(host, port, ...)``). A name that does not resolve is not a loop
    (the proxy's 502s will say why it is unreachable)."""
    parts = urlsplit(upstream)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    listening = [(str(a[0]), int(a[1])) for a in bound]
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout
        )
    except (TimeoutError, OSError, UnicodeError):
        return None
    for info in infos:
        addr = _ip(str(info[4][0]))
        if addr is None:
            continue
        for bound_host, bound_port in listening:
            if _reaches(addr, port, bound_host, bound_port):
                where = (
                    f"[{bound_host}]:{bound_port}"
                    if ":" in bound_host
                    else f"{bound_host}:{bound_port}"
                )
                return (
                    f"--upstream {upstream} is this sidecar's own --listen address ({where}): every request "
                    "would be relayed back to the sidecar itself; give the inference server's address"
                )
    return None


def came_back(headers: Mapping[str, str]) -> bool:
    """Whether a request on the proxy port is this process's own, come back through a loop
    (it carries :data:`LOOP_TOKEN` in :data:`LOOP_HEADER`). The one loop check: the proxy
    app's entry answers such a request with :func:`loop_refusal`, and the relay's own
    way in (sidecar/relay/data/exchange.py) asks the same before it would send one upstream."""
    return headers.get(LOOP_HEADER) == LOOP_TOKEN


def loop_refusal() -> bytes:
    """The whole answer to a request that carries this process's :data:`LOOP_TOKEN` in
    :data:`LOOP_HEADER` on the proxy port (the relay asks before it sends anything
    upstream): the sidecar's own probe, come back, gets 508 at once, and the connection
    closes after it."""
    _log.debug("upstream_loop_cut")  # /readyz and the upstream watch say it, once per change
    return raw_error_response(LOOP_STATUS, "Loop Detected", "upstream_loop", LOOP_MESSAGE)
