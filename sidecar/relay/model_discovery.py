"""Which models the upstream serves, asked of the upstream itself, in the background.

The ``model`` label admits only names the server vouches for (sidecar/base/labels.py), so
the sidecar asks the server what it serves: the OpenAI-compatible ``/v1/models`` (vLLM,
SGLang, llama.cpp, TGI, Ollama, LM Studio, LiteLLM, ``transformers serve``), else Ollama's
``/api/tags``, else TGI's ``/info``. Never on a request's path: a refresh task calls
:func:`served_models` every ``model_refresh_seconds``. An answer is read up to
:data:`MAX_LISTING_BYTES` and at most ``limit`` names are taken, so a hostile or broken
upstream cannot make the sidecar hold more.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

__all__ = ["served_models", "names_from_listing", "LISTING_PATHS", "MAX_LISTING_BYTES", "USER_AGENT"]

LISTING_PATHS = ("/v1/models", "/api/tags", "/info")
MAX_LISTING_BYTES = 1 << 20
USER_AGENT = "llm-sidecar model-discovery"
"""Sent with every listing request, so the server's access log (and a test) can tell the
sidecar's own requests from the clients' it relays."""


def names_from_listing(path: str, doc: object, limit: int = 1000) -> list[str]:
    """The model names in one listing document, by the shape each path answers with."""
    names: list[str] = []
    if not isinstance(doc, dict):
        return names
    if path == "/v1/models":  # {"data": [{"id": ...}, ...]}; vLLM adds LoRA adapters as entries
        entries = doc.get("data")
        keys = ("id",)
    elif path == "/api/tags":  # Ollama: {"models": [{"name": "llama3:8b", "model": "llama3:8b"}]}
        entries = doc.get("models")
        keys = ("name", "model")
    else:  # TGI /info: {"model_id": "..."}
        entries = [doc]
        keys = ("model_id",)
    if not isinstance(entries, list):
        return names
    for entry in entries[:limit]:
        if isinstance(entry, dict):
            for key in keys:
                value = entry.get(key)
                if isinstance(value, str) and value and value not in names:
                    names.append(value)
    return names[:limit]


async def served_models(
    session: aiohttp.ClientSession, upstream: str, timeout: float = 5.0, limit: int = 1000
) -> list[str] | None:
    """The names the upstream lists, from the first listing path that answers 2xx JSON with
    at least one name; None when none does (then names earn their label by an answer)."""
    for path in LISTING_PATHS:
        try:
            async with session.get(
                upstream + path, timeout=aiohttp.ClientTimeout(total=timeout), headers={"User-Agent": USER_AGENT}
            ) as resp:
                if not 200 <= resp.status < 300:
                    continue
                body = await resp.content.read(MAX_LISTING_BYTES + 1)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None  # the upstream is down or broken: keep what we had
        if len(body) > MAX_LISTING_BYTES:
            continue
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            continue
        names = names_from_listing(path, doc, limit)
        if names:
            return names
    return None
