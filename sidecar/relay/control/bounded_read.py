"""A whole upstream body read into memory, but never more than a bound: for the sidecar's own
requests to the server (the model listing, the engine's metrics page), never a client's
stream, which is relayed, not read whole."""

from __future__ import annotations

import aiohttp

__all__ = ["read_bounded"]


async def read_bounded(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The whole body, over as many reads as it takes (``read(n)`` returns only what is
    buffered); None once it passes ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
