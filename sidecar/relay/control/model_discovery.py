"""Which models the upstream serves, asked of the upstream itself, in the background.

The ``model`` label admits only names the server vouches for (sidecar/base/labels.py), so
the sidecar asks the server what it serves: the OpenAI-compatible ``/v1/models`` (vLLM,
SGLang, llama.cpp, TGI, Ollama, LM Studio, LiteLLM, ``transformers serve``), else Ollama's
``/api/tags``, else TGI's ``/info``. Never on a request's path: a refresh task calls
:func:`served_models` every ``model_refresh_seconds``.

An answer is read whole, over as many reads as it arrives in (a vLLM listing with a
thousand LoRA adapters is half a megabyte; a single ``read(n)`` returns only what is
buffered, and a cut listing failed to parse, so the listing never became the authority), up
to :data:`MAX_LISTING_BYTES`, and at most ``limit`` names are taken in the server's order, so
a hostile or broken upstream cannot make the sidecar hold more. The poll asks for
``Accept-Encoding: identity`` (the session does not decompress, so that the relay's other
reads stay byte-exact), and a gateway that compresses anyway is undone here: gzip and
deflate, with the decompressed size bounded by the same limit (a small bomb cannot expand
into memory).
"""

from __future__ import annotations

import zlib

import aiohttp
import orjson

from .bounded_read import read_bounded

__all__ = [
    "served_models",
    "names_from_listing",
    "decoded_listing",
    "LISTING_PATHS",
    "MAX_LISTING_BYTES",
    "MAX_LISTED_NAMES",
    "USER_AGENT",
]

LISTING_PATHS = ("/v1/models", "/api/tags", "/info")
MAX_LISTING_BYTES = 2 << 20
"""Largest listing read or decompressed: a vLLM entry is about 460 bytes, so some 4,500
adapters; anything longer is not taken (the labels keep what they had)."""
USER_AGENT = "llm-sidecar model-discovery"
"""Sent with every listing request, so the server's access log (and a test) can tell the
sidecar's own requests from the clients' it relays."""
LISTING_HEADERS = {
    "User-Agent": USER_AGENT,
    "Accept-Encoding": "identity",
    "Accept": "application/json",
}


MAX_CODINGS = 2
"""Content codings undone at most (a server sends one): a listing under a thousand layers of
gzip, each within the size bound, held the event loop, and every stream it relays, for a
second per refresh."""


class _TooLarge(Exception):
    pass


def decoded_listing(body: bytes, encoding: str, limit: int = MAX_LISTING_BYTES) -> bytes | None:
    """``body`` without its ``Content-Encoding`` (identity, gzip, x-gzip, deflate, raw or
    zlib-wrapped); None for a coding not understood, a corrupt one, or more than ``limit``
    bytes once decompressed."""
    codings = [
        c.strip().lower()
        for c in encoding.split(",")
        if c.strip() and c.strip().lower() != "identity"
    ]
    if len(codings) > MAX_CODINGS:
        return None  # each layer is a pass over up to ``limit`` bytes, on the event loop
    try:
        for coding in reversed(codings):  # applied in the order listed: undone from the last
            if coding == "identity":
                continue
            if coding in ("gzip", "x-gzip"):
                body = _inflate(body, zlib.MAX_WBITS | 16, limit)
            elif coding == "deflate":
                try:
                    body = _inflate(body, zlib.MAX_WBITS, limit)  # as RFC 9110 says: zlib
                except zlib.error:
                    body = _inflate(body, -zlib.MAX_WBITS, limit)  # as many servers send: raw
            else:
                return None
    except (zlib.error, _TooLarge):
        return None
    return body


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    d = zlib.decompressobj(wbits)
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise _TooLarge
    out += d.flush()
    if len(out) > limit:
        raise _TooLarge
    if not d.eof:
        raise zlib.error("truncated")
    return out


MAX_LISTED_NAMES = 5000
"""Names taken from one listing, in its order (the labels give slots to the first ones)."""


def names_from_listing(path: str, doc: object, limit: int = MAX_LISTED_NAMES) -> list[str]:
    """The model names in one listing document, in its order, by the shape each path
    answers with."""
    names: dict[str, None] = {}
    if not isinstance(doc, dict):
        return []
    if path == "/v1/models":  # {"data": [{"id": ...}, ...]}; vLLM adds LoRA adapters as entries
        entries = doc.get("data")
        keys: tuple[str, ...] = ("id",)
    elif path == "/api/tags":  # Ollama: {"models": [{"name": "llama3:8b", "model": "llama3:8b"}]}
        entries = doc.get("models")
        keys = ("name", "model")
    else:  # TGI /info: {"model_id": "..."}
        entries = [doc]
        keys = ("model_id",)
    if not isinstance(entries, list):
        return []
    for entry in entries[:limit]:
        if isinstance(entry, dict):
            for key in keys:
                value = entry.get(key)
                if isinstance(value, str) and value:
                    names[value] = None
    return list(names)[:limit]


async def served_models(
    session: aiohttp.ClientSession,
    upstream: str,
    timeout: float = 5.0,
    limit: int = MAX_LISTED_NAMES,
) -> list[str] | None:
    """The names the upstream lists, from the first listing path that answers 2xx JSON with
    at least one name; None when none does (then names earn their label by an answer)."""
    for path in LISTING_PATHS:
        try:
            async with session.get(
                upstream + path,
                timeout=aiohttp.ClientTimeout(total=timeout),
                headers=LISTING_HEADERS,
            ) as resp:
                if not 200 <= resp.status < 300:
                    continue
                body = await read_bounded(resp.content, MAX_LISTING_BYTES)
                encoding = resp.headers.get("Content-Encoding", "")
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None  # the upstream is down or broken: keep what we had
        if body is None:
            continue
        body = decoded_listing(body, encoding)
        if body is None:
            continue
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            continue
        names = names_from_listing(path, doc, limit)
        if names:
            return names
    return None
