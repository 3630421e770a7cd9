"""`curl --http2` and Java's built-in ``HttpClient`` with its defaults (both offer an
upgrade to h2c on http://, the request's body with the offer) through the sidecar to real
servers' chat route: each gets what it gets from the server directly, in about the same time
(a relay that sent the offer's head without its body left the server waiting for it, and the
client got 504 after the read timeout). The same clients against the simulator, with exact
timing, are tests/integration/relay/server/test_h2c_clients.py."""

from __future__ import annotations

import json

import pytest

from tests.integration.relay.server.test_h2c_clients import JAVA_CLIENT, need, run
from tests.real.conftest import LIVE_KINDS
from tests.real.servers import VLLM, ServerKind

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"
SLOWER_BY_AT_MOST = 2.0  # seconds: a relay adds milliseconds; the read timeout would add minutes
KINDS = [
    pytest.param(kind, id=kind.name) for kind in LIVE_KINDS if kind is VLLM or kind.engine != "vllm"
]


def body(kind: ServerKind) -> str:
    return json.dumps(
        {
            "model": kind.model,
            "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 8,
            "stream": True,
        }
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_h2c_offering_clients_get_through_the_sidecar_what_they_get_direct(
    live_servers, sidecar_factory, kind: ServerKind
):
    server = live_servers.get(kind)
    running = await sidecar_factory(server.url)
    curl, java = need("curl"), need("java")
    for base in (server.url, running.url):  # warm both paths (the first request compiles)
        await run(
            curl,
            "--http2",
            "-sS",
            "-H",
            "Content-Type: application/json",
            "--data",
            body(kind),
            base + CHAT,
        )
    took = {}
    for name, base in (("direct", server.url), ("via", running.url)):
        out, took[name] = await run(
            curl, "--http2", "-sS", "--max-time", "120", "-H", "Content-Type: application/json",
            "--data", body(kind), "-w", "\n%{http_code}", base + CHAT,
        )  # fmt: skip
        assert out.endswith("\n200") and "data: " in out, (name, out[-300:])
    assert took["via"] < took["direct"] + SLOWER_BY_AT_MOST, took
    for name, base in (("direct", server.url), ("via", running.url)):
        out, took[name] = await run(java, str(JAVA_CLIENT), base + CHAT, body(kind), "2")
        statuses = [line.split()[:2] for line in out.splitlines()[:2]]
        assert statuses == [["200", "HTTP_1_1"]] * 2, (name, out[-300:])
    assert took["via"] < took["direct"] + SLOWER_BY_AT_MOST, took
