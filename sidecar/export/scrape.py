"""``/metrics`` rendered off the event loop, once per scrape burst.

The text exposition of a large registry takes long (a 9 MB page took 0.95 s), and on the
event loop that relays tokens it stalled every stream for that long: two clients scraping in
a loop pushed another client's request p50 from 1.6 ms to 1.8 s. Here the page is rendered in
a worker thread (the loop keeps running; it only shares the GIL, which Python hands over
every few milliseconds), concurrent scrapes of the same kind share one render (single
flight), and a page is reused for ``max_age`` seconds, so scrapers in a loop cost at most one
render per ``max_age``. The series budget is not counted here: it is counted from the
registry before a series is made (``SeriesGate``, sidecar/export/prometheus_internals.py).

Content negotiation (OpenMetrics for exemplars), ``name[]`` filters and gzip behave as
prometheus_client's own handler, through its public functions.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from aiohttp import hdrs, web
from prometheus_client import Metric
from prometheus_client.exposition import choose_encoder

__all__ = ["ScrapeRenderer"]


class Page(Protocol):
    """What is rendered: a registry, or a view of one (``WithoutCreated``), and its
    ``name[]``-filtered view."""

    def collect(self) -> Iterable[Metric]: ...

    def restricted_registry(self, names: Iterable[str]) -> object: ...


class ScrapeRenderer:
    def __init__(
        self,
        registry: Page,
        max_age: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._max_age = max_age
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-render")
        # (content type, names) -> (reuse until, page, type)
        self._pages: dict[tuple[str, tuple[str, ...]], tuple[float, bytes, str]] = {}
        self._rendering: dict[
            tuple[str, tuple[str, ...]], asyncio.Future[tuple[bytes, str, float]]
        ] = {}

    def _render(self, accept: str, names: tuple[str, ...]) -> tuple[bytes, str, float]:
        began = self._clock()
        encoder, content_type = choose_encoder(accept)
        registry = self._registry.restricted_registry(list(names)) if names else self._registry
        page = encoder(registry)  # type: ignore[arg-type]  # any collector: it calls collect()
        return page, content_type, self._clock() - began

    def _reuse_for(self, took: float) -> float:
        """How long a page may be served again: only a page that was costly to render (a
        small one is rendered fresh for every scrape), and never longer than ``max_age``."""
        return 0.0 if took < 0.01 else min(self._max_age, 5 * took)

    async def page(self, accept: str = "", names: tuple[str, ...] = ()) -> tuple[bytes, str]:
        key = (choose_encoder(accept)[1], names)
        cached = self._pages.get(key)
        if cached is not None and self._clock() < cached[0]:
            return cached[1], cached[2]
        running = self._rendering.get(key)
        if running is None:
            loop = asyncio.get_running_loop()
            running = self._rendering[key] = asyncio.ensure_future(
                loop.run_in_executor(self._pool, self._render, accept, names)
            )
            running.add_done_callback(lambda _f: self._rendering.pop(key, None))
        page, content_type, took = await asyncio.shield(running)
        self._pages[key] = (self._clock() + self._reuse_for(took), page, content_type)
        return page, content_type

    async def handler(self, request: web.Request) -> web.Response:
        accept = ",".join(request.headers.getall(hdrs.ACCEPT, []))
        names = tuple(request.query.getall("name[]", []))
        page, content_type = await self.page(accept, names)
        headers = {hdrs.CONTENT_TYPE: content_type}
        if "gzip" in request.headers.get(hdrs.ACCEPT_ENCODING, "") and len(page) > 1024:
            loop = asyncio.get_running_loop()
            page = await loop.run_in_executor(self._pool, gzip.compress, page, 1)
            headers[hdrs.CONTENT_ENCODING] = "gzip"
        return web.Response(body=page, headers=headers)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
