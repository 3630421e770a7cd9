"""A hostile upstream's model listing under many layers of content coding (the listing's
rules: bounded in bytes and in time). Each layer stayed within the size bound, so a
listing gzipped a thousand times over (its ``Content-Encoding`` fits aiohttp's header limit)
was undone layer by layer on the event loop, holding every stream it relays for most of a
second at each refresh. At most two codings are undone now; one is what servers send."""

from __future__ import annotations

import gzip

import aiohttp
import orjson
import pytest
from aiohttp import web

from sidecar.relay.control.model_discovery import LISTING_HEADERS, MAX_CODINGS, served_models

pytestmark = pytest.mark.integration

LAYERS = 300


def _layered(doc: bytes, layers: int) -> bytes:
    for _ in range(layers):
        doc = gzip.compress(doc, compresslevel=1)
    return doc


async def test_a_listing_under_many_codings_is_not_undone_and_two_still_are(upstream):
    listing = orjson.dumps({"object": "list", "data": [{"id": "served-model"}]})
    layers = {"/v1/models": LAYERS}

    async def models(request: web.Request) -> web.Response:
        assert request.headers.get("Accept-Encoding") == LISTING_HEADERS["Accept-Encoding"]
        n = layers["/v1/models"]
        return web.Response(
            body=_layered(listing, n),
            headers={
                "Content-Type": "application/json",
                "Content-Encoding": ", ".join(["gzip"] * n),
            },
        )

    up = await upstream.start(lambda app: app.router.add_get("/v1/models", models))
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        # Not taken (the other listing paths answer 404 here): the labels keep what they had.
        assert await served_models(session, up.url) is None
        layers["/v1/models"] = MAX_CODINGS
        assert await served_models(session, up.url) == ["served-model"]
