"""Over real sockets: ``llm_finish_reasons_total`` counts one reason per answer for servers
that send ``"finish_reason": ""`` on every unfinished chunk (Ollama's OpenAI-compatible
route, SGLang 0.4), in the bytes of tests/fixtures/streams/openai/ (their issues' shape);
the client gets those bytes unchanged. Counted as sent, each such answer was 16 ``other``
(the per-request cap) and its real ``stop`` was dropped.
"""

from __future__ import annotations

import aiohttp
import pytest

from tests.fixtures.streams.harness import load
from tests.support.sse import replaying
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ROUTE = "/v1/chat/completions"
ANSWERS = 3


@pytest.mark.parametrize(
    "name",
    ["ollama_openai_finish_reason_empty.txt", "sglang043_chat_finish_reason_empty.txt"],
    ids=["ollama", "sglang"],
)
async def test_one_finish_reason_per_answer(upstream, sidecar_factory, name):
    raw = load("openai", name)
    assert raw.count(b'"finish_reason":""') >= 3  # the shape under test
    up = await upstream.start(
        lambda app: app.router.add_post(ROUTE, replaying(raw, piece=97))  # splits mid-event
    )
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        for _ in range(ANSWERS):
            async with s.post(sc.url + ROUTE, json={"model": "m", "stream": True}) as r:
                assert r.status == 200
                assert await r.read() == raw
    labels = {"route": ROUTE}

    def reasons() -> dict[str, float]:
        out: dict[str, float] = {}
        for family in sc.registry.collect():
            for sample in family.samples:
                if sample.name == "llm_finish_reasons_total" and sample.value:
                    assert sample.labels["route"] == labels["route"]
                    reason = sample.labels["finish_reason"]
                    out[reason] = out.get(reason, 0) + sample.value
        return out

    await wait_for(lambda: sum(reasons().values()) >= ANSWERS)
    assert reasons() == {"stop": ANSWERS}
    ok = sc.sample("llm_requests_total", route=ROUTE, model="m", code="200", outcome="ok")
    assert ok == ANSWERS
