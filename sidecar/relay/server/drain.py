"""Shutdown that loses no request: follow the upstream down, then refuse cleanly.

Kubernetes removes a terminating pod from its Service's endpoints a few seconds after it
starts stopping the pod's containers, so new requests keep arriving for a while. Which
container hears SIGTERM first depends on how the sidecar runs (README "Kubernetes"):

- native sidecar: the model server first (after its preStop), the sidecar only once the
  model server has exited;
- regular container: both at once (each after its own preStop), so the sidecar hears
  SIGTERM while the model server still sleeps in its preStop and still answers.

Closing the listener on SIGTERM (what aiohttp does) turned every request of those seconds
into a connection error. Instead, on SIGTERM the sidecar:

1. turns ``/readyz`` to 503 and keeps relaying, new requests included, for as long as the
   upstream answers its health path on a new connection (asked every :data:`POLL_SECONDS`),
   each response closing its connection so pooled clients reconnect elsewhere;
2. once the upstream is gone, answers each new request with 503, a JSON error body and
   ``Retry-After`` (never a 502: it knows why), while in-flight streams finish;
3. closes when nothing is in flight.

``drain_seconds`` bounds all three, counted from SIGTERM. Step 1 is for a pod: it covers
the seconds until the endpoints drop the pod, which only Kubernetes has. Outside Kubernetes
(no ``KUBERNETES_SERVICE_HOST``: Ctrl-C on ``serve``, ``docker stop``, systemd) nobody
routes by endpoints, so the drain is just the in-flight requests: a process with nothing in
flight when the signal comes exits at once (:func:`needs_full_drain`), one with streams in
flight exits as soon as the last has ended, new requests meanwhile being relayed (or
refused, step 2) as in a pod. Waiting on for the upstream there would hold a Ctrl-C'd
``serve`` for the whole ``drain_seconds`` (30 s) after its one stream ended.

The drain says what it waits for: one ``draining`` line at the start (what, how long at
most, and that a second SIGTERM/SIGINT exits now), a ``still_draining`` line every
:data:`PROGRESS_SECONDS`, and ``drained`` when it ends early. A second signal during a drain
forces the exit (``forced_exit``, sidecar/app.py). A request refused in step 2 never
reached the upstream and is not an LLM request: it is logged, not counted in
``llm_requests_total``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
import structlog

from .errors import raw_error_response

__all__ = [
    "POLL_SECONDS",
    "PROGRESS_SECONDS",
    "RETRY_AFTER_SECONDS",
    "Drain",
    "in_kubernetes",
    "needs_full_drain",
]

_log = structlog.get_logger("sidecar.drain")

POLL_SECONDS = 0.25
"""How often a draining sidecar asks whether the upstream still answers: the longest a new
request can meet a stopped upstream (and get its 502) before refusals start."""

RETRY_AFTER_SECONDS = 1
"""What a refused client is told to wait: by then the pod has left the endpoints, so its
retry lands on another pod."""


PROGRESS_SECONDS = 5.0
"""How often a drain that is still waiting says so (``still_draining``)."""

EXIT_NOW = "send SIGTERM or SIGINT (Ctrl-C) again to exit now"


def in_kubernetes(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs in a Kubernetes container (the kubelet sets
    ``KUBERNETES_SERVICE_HOST`` in every one), where requests keep arriving for a few seconds
    after SIGTERM, until the endpoints drop the pod."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("KUBERNETES_SERVICE_HOST"))


def needs_full_drain(in_flight: int, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a stop signal starts a drain or an immediate exit.

    A drain when streams are live, or inside Kubernetes (:func:`in_kubernetes`), where
    requests keep arriving even when none is in flight at that instant. Elsewhere an idle
    process has nothing to wait for."""
    return in_flight > 0 or in_kubernetes(environ)


class Drain:
    """The shutdown state of one sidecar and the steps above, for :func:`sidecar.app.serve`.

    ``upstream_up`` asks the upstream's health path once (True: a 2xx); ``in_flight`` reads
    the proxy's count of requests being relayed. Both are injected so tests can drive it.
    ``pod``: whether step 1 waits for the upstream to go (in Kubernetes, the default there:
    :func:`in_kubernetes`) or only for the requests in flight.
    """

    def __init__(
        self,
        upstream_up: Callable[[], Awaitable[bool]],
        in_flight: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
        pod: bool | None = None,
    ) -> None:
        self._upstream_up = upstream_up
        self._in_flight = in_flight
        self._clock = clock
        self.pod = in_kubernetes() if pod is None else pod
        self.draining = False
        self.refusing = False  # step 2: the upstream is gone
        self._said_at = 0.0

    def refusal(self, method: str, peer: str | None) -> bytes:
        """In step 2 (``refusing``), a new request's whole answer: 503 + Retry-After, and the
        connection closes after it (the relay asks before relaying)."""
        _log.info("refused_draining", method=method, peer=peer)
        return raw_error_response(
            503, "Service Unavailable", "draining",
            "this pod is shutting down and its inference server has stopped; retry",
            b"Retry-After: %d\r\n" % RETRY_AFTER_SECONDS,
        )  # fmt: skip

    async def run(self, drain_seconds: float) -> None:
        """Steps 1 to 3; returns when the proxy may close (``drain_seconds`` at the latest)."""
        self.draining = True
        start = self._clock()
        deadline = start + drain_seconds
        self._said_at = start
        _log.info(
            "draining",
            in_flight=self._in_flight(),
            waits_for=self._waits_for(),
            drain_seconds=drain_seconds,
            exit_now=EXIT_NOW,
        )
        while self._clock() < deadline:
            if not self.pod and self._in_flight() == 0:  # nobody routes by endpoints here
                _log.info("drained", seconds=round(self._clock() - start, 2))
                return
            if not await self._still_up(deadline):
                break
            self._progress(deadline)
            await asyncio.sleep(min(POLL_SECONDS, max(0.0, deadline - self._clock())))
        self.refusing = True
        if self._clock() < deadline:  # the upstream went away (not merely the time ran out)
            _log.info("upstream_gone_refusing_new", in_flight=self._in_flight())
        while self._in_flight() > 0 and self._clock() < deadline:
            self._progress(deadline)
            await asyncio.sleep(0.05)
        if self._clock() < deadline:
            _log.info("drained", seconds=round(self._clock() - start, 2))

    def _waits_for(self) -> str:
        n = self._in_flight()
        streams = f"{n} request{'' if n == 1 else 's'} in flight to end"
        if self.pod and not self.refusing:
            return f"{streams}, and the inference server to stop (Kubernetes still routes requests here until the endpoints drop this pod)"
        return streams

    def _progress(self, deadline: float) -> None:
        """A ``still_draining`` line every :data:`PROGRESS_SECONDS`."""
        now = self._clock()
        if now - self._said_at >= PROGRESS_SECONDS:
            self._said_at = now
            _log.info(
                "still_draining",
                in_flight=self._in_flight(),
                waits_for=self._waits_for(),
                seconds_left=round(max(0.0, deadline - now), 1),
                exit_now=EXIT_NOW,
            )

    async def _still_up(self, deadline: float) -> bool:
        try:
            return await asyncio.wait_for(
                self._upstream_up(), timeout=max(0.05, deadline - self._clock())
            )
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
