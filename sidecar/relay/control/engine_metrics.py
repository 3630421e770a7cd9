"""``GET /metrics/engine`` on the admin port: the inference server's own ``/metrics``, relayed.

vLLM, SGLang and TGI export their queue, KV-cache and phase metrics on ``/metrics``, but in
the chart's pod the server listens on loopback, where Prometheus cannot reach it. Scraping
it through the proxy port would work, yet every scrape would then be relayed and counted as
a request (``route="other"``). So the admin port fetches it on each scrape and relays the
answer as it is: status, body, ``Content-Type`` and ``Content-Encoding`` (the session does
not decompress), with the scraper's ``Accept`` and ``Accept-Encoding``. Prometheus adds the
pod's labels as for any target.

Failures are the scraper's to see, never a traceback: an unreachable server is a 502 and a
slow one a 504, each with a JSON body, so ``up`` of the engine job goes to 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal

import aiohttp
from aiohttp import web

from ..server.errors import error_response
from .bounded_read import read_bounded

__all__ = ["MAX_ENGINE_METRICS_BYTES", "engine_metrics_handler", "scrape_timeout"]

MAX_ENGINE_METRICS_BYTES = 32 << 20
"""A vLLM exposition is a few hundred kB; more than this is not a metrics page."""

_FORWARDED_REQUEST = ("Accept", "Accept-Encoding")
_RELAYED_RESPONSE = ("Content-Type", "Content-Encoding")
_SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"

Fetched = tuple[Literal["ok"], int, bytes, dict[str, str]] | tuple[Literal["error"], int, str, str]
"""``_fetch``'s answer: ("ok", status, body bytes, relayed headers) or ("error", status,
kind, text)."""


def scrape_timeout(headers: Mapping[str, str], configured: float) -> float:
    """The configured timeout, shortened to stay inside the scraper's own (Prometheus sends
    it in a header), so the scraper gets our 504 instead of its own timeout."""
    try:
        theirs = float(headers.get(_SCRAPE_TIMEOUT_HEADER, ""))
    except ValueError:
        return configured
    return max(0.1, min(configured, theirs - 0.5)) if theirs > 0 else configured


async def _fetch(
    client: aiohttp.ClientSession, url: str, headers: dict[str, str], timeout: float
) -> Fetched:
    """One upstream scrape: ("ok", status, body, relayed headers) or ("error", status, kind, text)."""
    try:
        async with client.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as upstream:
            body = await read_bounded(upstream.content, MAX_ENGINE_METRICS_BYTES)
            if body is None:
                return (
                    "error",
                    502,
                    "engine_metrics_too_large",
                    "the inference server's metrics page is too large",
                )
            relayed = {
                name: upstream.headers[name]
                for name in _RELAYED_RESPONSE
                if name in upstream.headers
            }
            return ("ok", upstream.status, body, relayed)
    except TimeoutError:
        return (
            "error",
            504,
            "upstream_timeout",
            "the inference server's metrics did not answer in time",
        )
    except aiohttp.ClientError:
        return (
            "error",
            502,
            "upstream_unreachable",
            "the inference server's metrics are unreachable",
        )


def engine_metrics_handler(
    session: Callable[[], aiohttp.ClientSession | None], url: str, timeout: float
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler for the engine's metrics at ``url``, each scrape given at most
    ``timeout`` seconds; ``session`` returns the sidecar's client session once started.

    Single-flight: concurrent scrapes with the same forwarded headers
    share one upstream fetch, so 300 scrapes at once open one upstream connection, not 300.
    Each scraper still waits no longer than its own timeout; a scraper that leaves does not
    cancel the fetch the others wait for."""
    configured_timeout = timeout
    in_flight: dict[tuple[str, ...], asyncio.Task[Fetched]] = {}

    async def engine_metrics(request: web.Request) -> web.StreamResponse:
        client = session()
        if client is None:
            return error_response(503, "starting", "the sidecar has not started yet")
        timeout = scrape_timeout(request.headers, configured_timeout)
        headers = {k: request.headers[k] for k in _FORWARDED_REQUEST if k in request.headers}
        key = tuple(headers.get(k, "") for k in _FORWARDED_REQUEST)
        task = in_flight.get(key)
        if task is None:
            task = asyncio.ensure_future(_fetch(client, url, headers, timeout))
            in_flight[key] = task

            def forget(t: asyncio.Task[Fetched], key: tuple[str, ...] = key) -> None:
                if in_flight.get(key) is t:
                    in_flight.pop(key, None)

            task.add_done_callback(forget)
        try:
            result = await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            result = (
                "error",
                504,
                "upstream_timeout",
                "the inference server's metrics did not answer in time",
            )
        if result[0] == "error":
            return error_response(result[1], result[2], result[3])
        response = web.Response(status=result[1], body=result[2])
        for name, value in result[3].items():
            response.headers[name] = value
        return response

    return engine_metrics
