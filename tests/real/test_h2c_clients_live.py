"""`curl --http2` and Java's built-in ``HttpClient`` with its defaults (both offer an
upgrade to h2c on http://, the request's body with the offer) through the sidecar to real
servers' chat route: each gets the answer the same client gets without the offer (plain
HTTP/1.1) from the server directly, in about the same time. (A relay that sent the offer's
head without its body left the server waiting for it: the client got 504 after the read
timeout.) What the server itself answers the offer is printed, not asserted: vLLM's uvicorn
answered an offer with a body 400 ("body: Field required") on 0.32, so there the sidecar,
which drops the offer, serves such a client better than the server does. The same clients
against the simulator, with exact timing: tests/integration/relay/server/test_h2c_clients.py."""

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

    async def by_curl(base: str, *offer: str) -> tuple[str, float]:
        return await run(
            curl, *offer, "-sS", "--max-time", "120", "-H", "Content-Type: application/json",
            "--data", body(kind), "-w", "\n%{http_code}", base + CHAT,
        )  # fmt: skip

    await by_curl(server.url)  # warm the server (its first request compiles)
    plain, plain_took = await by_curl(server.url)
    offered_direct, _ = await by_curl(server.url, "--http2")
    via, via_took = await by_curl(running.url, "--http2")
    print(f"{kind.name}: curl --http2 direct answered {offered_direct[-3:]}")
    assert plain.endswith("\n200") and "data: " in plain, plain[-300:]
    assert via.endswith("\n200") and "data: " in via, via[-300:]
    assert via_took < plain_took + SLOWER_BY_AT_MOST, (via_took, plain_took)

    plain, _ = await run(java, str(JAVA_CLIENT), server.url + CHAT, body(kind), "2", "1.1")
    offered_direct, _ = await run(java, str(JAVA_CLIENT), server.url + CHAT, body(kind), "2")
    via, _ = await run(java, str(JAVA_CLIENT), running.url + CHAT, body(kind), "2")
    print(f"{kind.name}: Java's default client direct: {offered_direct.splitlines()[:2]}")
    took = []
    for out in (plain, via):
        answers = [line.split() for line in out.splitlines()[:2]]
        assert [a[:2] for a in answers] == [["200", "HTTP_1_1"]] * 2, out[-300:]
        took.append(sum(int(a[2]) for a in answers) / 1000)  # the client's own timing, no JVM start
    assert took[1] < took[0] + SLOWER_BY_AT_MOST, took
