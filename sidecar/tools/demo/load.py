"""The demo's load: concurrent clients joining one by one, each sending a mix of mostly
streamed chat, some completions and non-streamed requests, counting what it saw."""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["MODEL", "RAMP_SECONDS", "LoadStats", "client_loop"]

MODEL = "sim-llama-3-8b"
"""The model the demo's simulator serves and its clients ask for."""

RAMP_SECONDS = 2.0
"""Clients join one at a time, this far apart, so the curve fills in band by band."""


@dataclass
class LoadStats:
    """What the load generator saw (client side)."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    stopped: int = 0
    """Cut short when the demo stopped (the sidecar counts them as ``cancelled``)."""
    running: int = 0
    """Clients that have joined and not yet left: what the table shows while they ramp up."""


_PROMPTS = (
    "Explain time to first token in one paragraph.",
    "Write a haiku about tail latency.",
    "Summarise why p99 matters more than the mean for interactive chat.",
    "List three causes of slow prefill.",
    "hi",
)
_MAX_TOKENS = (16, 32, 64, 96, 128, 192)


def _request(rng: random.Random) -> tuple[str, dict[str, Any], bool]:
    """One request of the mix: mostly streamed chat, some completions and non-streamed."""
    roll = rng.random()
    chat = roll < 0.8
    stream = roll < 0.65 or 0.8 <= roll < 0.92
    prompt = rng.choice(_PROMPTS)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.choice(_MAX_TOKENS)}
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        path = "/v1/completions"
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    return path, body, stream


async def _one_request(session: aiohttp.ClientSession, base: str, rng: random.Random) -> bool:
    path, body, stream = _request(rng)
    async with session.post(base + path, json=body) as resp:
        if resp.status != 200:
            await resp.read()
            return False
        if not stream:
            doc = await resp.json()
            return isinstance(doc, dict) and "error" not in doc
        done = False
        async for line in resp.content:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b'data: {"error"'):
                return False
        return done  # no [DONE]: the stream was cut


async def client_loop(
    session: aiohttp.ClientSession,
    base: str,
    stats: LoadStats,
    stop: asyncio.Event,
    seed: int,
    delay: float = 0.0,
) -> None:
    rng = random.Random(seed)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), delay)  # join the ramp (or leave if stopped first)
    if stop.is_set():
        return
    stats.running += 1
    try:
        while not stop.is_set():
            stats.sent += 1
            try:
                ok = await _one_request(session, base, rng)
            except asyncio.CancelledError:
                stats.stopped += 1
                raise
            except (TimeoutError, aiohttp.ClientError, ValueError):
                ok = False
                await asyncio.sleep(0.05)  # do not spin if the sidecar is gone
            if ok:
                stats.ok += 1
            else:
                stats.errors += 1
    finally:
        stats.running -= 1
