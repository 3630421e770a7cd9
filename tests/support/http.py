"""Polling an HTTP endpoint until it answers a status: for servers started in another process
(a pod, a container) whose start-up the test waits out."""

from __future__ import annotations

import asyncio
import time

import aiohttp


async def status(url: str) -> int | None:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            async with s.get(url) as r:
                await r.read()
                return r.status
    except (TimeoutError, aiohttp.ClientError):
        return None


async def wait_status(url: str, want: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await status(url)
        if last == want:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"{url}: {last}, not {want}, after {timeout} s")
