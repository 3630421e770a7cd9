"""Token counts through a real sidecar over real sockets, read only from what the response
carries: client-asked usage, usage the server sends anyway, per-chunk usage, ``"usage":
null`` on every chunk, llama.cpp ``timings``, and nothing at all (estimated, input unknown).

Each case checks the three places a count goes: Prometheus (``llm_tokens_total`` and
``llm_token_count_source_total``), the span (``gen_ai.usage.*`` and the source attributes),
and that the request the server received is the client's, byte for byte.
"""

from __future__ import annotations

import json
from functools import partial

import openai
import pytest
from aiohttp import web

from sidecar.export import semconv as sc
from tests.fixtures.streams.harness import load
from tests.support.in_process import RunningSidecar
from tests.support.spans import one_span
from tests.support.sse import replaying
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# The recording in small pieces, 2 ms apart; the request body is kept where asked.
replay = partial(replaying, piece=97, pause=0.002)


async def counted(s: RunningSidecar, model: str, route: str, source: str) -> None:
    labels = {"model": model, "route": route}
    await wait_for(lambda: s.sample("llm_token_count_source_total", source=source, **labels) == 1)
    others = {"usage", "engine", "estimated", "none"} - {source}
    assert all(s.sample("llm_token_count_source_total", source=o, **labels) is None for o in others)


def tokens(s: RunningSidecar, model: str, route: str, kind: str) -> float | None:
    return s.sample("llm_tokens_total", model=model, route=route, type=kind)


def sdk(s: RunningSidecar) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="sk-test", max_retries=0)


async def test_client_asked_usage_through_the_openai_sdk(upstream, traced, spans):
    _, exporter = spans
    received: list[bytes] = []
    up = await upstream.start(
        lambda app: app.router.add_post(
            CHAT, replay(load("openai", "vllm032_chat_include_usage.txt"), received=received)
        )
    )
    s = await traced(up.url)
    async with sdk(s) as client:
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert json.loads(received[0])["stream_options"] == {
        "include_usage": True
    }  # as the client sent it
    await counted(s, "tiny", CHAT, "usage")
    assert tokens(s, "tiny", CHAT, "output") == 4 and tokens(s, "tiny", CHAT, "input") == 17
    span = await one_span(exporter)
    assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 17
    assert span.attributes[sc.LLM_SIDECAR_TOKEN_COUNT_SOURCE] == "usage"
    assert span.attributes[sc.LLM_SIDECAR_OUTPUT_TOKENS_ESTIMATED] is False


async def test_force_included_usage_the_client_did_not_ask_for(upstream, traced, spans):
    """vLLM --enable-force-include-usage: the usage chunk reaches every client; the sidecar
    reads it and never adds stream_options to the request."""
    _, exporter = spans
    raw = load("openai", "vllm032_chat_force_usage.txt")
    received: list[bytes] = []
    up = await upstream.start(lambda app: app.router.add_post(CHAT, replay(raw, received=received)))
    s = await traced(up.url)
    async with sdk(s) as client:
        async with client.chat.completions.with_streaming_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
        ) as resp:  # fmt: skip
            body = b"".join([c async for c in resp.iter_bytes()])
    assert body == raw
    assert "stream_options" not in json.loads(received[0])
    await counted(s, "tiny", CHAT, "usage")
    assert tokens(s, "tiny", CHAT, "output") == 4 and tokens(s, "tiny", CHAT, "input") == 17
    # usage on every chunk grew by one each time: 4 tokens, 3 gaps, not 4 x 4
    assert s.sample("llm_inter_token_latency_seconds_count", model="tiny") == 3
    assert s.sample("llm_upstream_prefill_seconds_count", model="tiny") == 1  # vLLM metrics
    span = await one_span(exporter)
    assert span.attributes[sc.LLM_SIDECAR_TOKEN_COUNT_SOURCE] == "usage"
    assert span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 17


async def test_per_chunk_usage_on_completions(upstream, traced, spans):
    _, exporter = spans
    raw = load("openai", "vllm032_completions_force_usage.txt")
    up = await upstream.start(lambda app: app.router.add_post(COMPLETIONS, replay(raw)))
    s = await traced(up.url)
    async with sdk(s) as client:
        stream = await client.completions.create(model="tiny", prompt="count", stream=True)
        texts = [c.choices[0].text async for c in stream if c.choices]
    assert texts == [" w", "a", "MPL", "MPL"]
    await counted(s, "tiny", COMPLETIONS, "usage")
    assert tokens(s, "tiny", COMPLETIONS, "output") == 4  # the last cumulative count, not a sum
    assert tokens(s, "tiny", COMPLETIONS, "input") == 5
    span = await one_span(exporter)
    assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4


async def test_usage_null_on_every_chunk_is_estimated_not_zero(upstream, traced, spans):
    _, exporter = spans
    raw = load("openai", "usage_null.txt")
    up = await upstream.start(lambda app: app.router.add_post(CHAT, replay(raw)))
    s = await traced(up.url)
    async with sdk(s) as client:
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert [c.usage async for c in stream] == [None] * 4
    await counted(s, "gpt-4o-mini", CHAT, "estimated")
    assert tokens(s, "gpt-4o-mini", CHAT, "output") == 2
    assert tokens(s, "gpt-4o-mini", CHAT, "input") is None  # unknown, never invented
    assert s.sample("llm_request_tokens_count", model="gpt-4o-mini", type="input") is None
    span = await one_span(exporter)
    assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert sc.GEN_AI_USAGE_INPUT_TOKENS not in span.attributes
    assert span.attributes[sc.LLM_SIDECAR_TOKEN_COUNT_SOURCE] == "estimated"
    assert span.attributes[sc.LLM_SIDECAR_OUTPUT_TOKENS_ESTIMATED] is True


@pytest.mark.parametrize(
    "name,source",
    [("llamacpp_chat_timings.txt", "engine"), ("llamacpp_chat_include_usage.txt", "usage")],
)
async def test_llamacpp_timings(upstream, traced, spans, name, source):
    _, exporter = spans
    raw = load("openai", name)
    up = await upstream.start(lambda app: app.router.add_post(CHAT, replay(raw)))
    s = await traced(up.url)
    async with sdk(s) as client:
        async with client.chat.completions.with_streaming_response.create(
            model="tiny-llama", messages=[{"role": "user", "content": "hi"}], stream=True,
        ) as resp:  # fmt: skip
            assert b"".join([c async for c in resp.iter_bytes()]) == raw
    await counted(s, "tiny-llama", CHAT, source)
    for kind, value in (("output", 3), ("input", 9), ("cached_input", 4)):
        assert tokens(s, "tiny-llama", CHAT, kind) == value, kind
    assert s.sample("llm_upstream_prefill_seconds_count", model="tiny-llama") == 1
    span = await one_span(exporter)
    assert span.attributes[sc.LLM_SIDECAR_TOKEN_COUNT_SOURCE] == source
    assert span.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 4


async def test_no_usage_at_all_is_estimated_with_input_unknown(upstream, traced, spans):
    """A server that sends neither usage nor its own counts: one token per content event."""
    _, exporter = spans
    raw = load("openai", "vllm032_chat_no_usage.txt")  # vLLM without usage: no usage key at all
    up = await upstream.start(lambda app: app.router.add_post(CHAT, replay(raw)))
    s = await traced(up.url)
    async with sdk(s) as client:
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert (
            "".join([c.choices[0].delta.content or "" async for c in stream])
            == "ditions included included defini"
        )
    await counted(s, "tiny", CHAT, "estimated")
    assert tokens(s, "tiny", CHAT, "output") == 4 and tokens(s, "tiny", CHAT, "input") is None
    assert s.sample("llm_time_per_output_token_seconds_count", model="tiny") == 1
    span = await one_span(exporter)
    assert sc.GEN_AI_USAGE_INPUT_TOKENS not in span.attributes
    assert span.attributes[sc.LLM_SIDECAR_OUTPUT_TOKENS_ESTIMATED] is True


async def test_non_api_route_counts_no_source(upstream, traced):
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    up = await upstream.start(lambda app: app.router.add_get("/health", health))
    s = await traced(up.url)
    async with openai.AsyncOpenAI(base_url=s.url, api_key="x", max_retries=0) as client:
        await client.get("/health", cast_to=object)
    await wait_for(
        lambda: s.sample("llm_non_api_requests_total", method="GET", code="200", outcome="ok") == 1
    )
    assert (
        s.sample("llm_token_count_source_total", model="unknown", route="other", source="none")
        is None
    )
