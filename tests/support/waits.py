"""Waiting on a condition instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def wait_for(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0) -> None:
    """Poll until ``predicate`` is true (finalisation happens just after the client sees EOF).
    The timeout is long so that a loaded machine is not a failure; a passing test never waits it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout:.1f} s")
        await asyncio.sleep(0.01)
