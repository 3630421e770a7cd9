"""The real `openai` SDK streaming through the sidecar from the simulated vLLM server."""

from __future__ import annotations

import re

import openai
import pytest

from tests.support.samples import per_model
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ROUTE = "/v1/chat/completions"
_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


def _client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)


async def _raw_stream(base: str, **extra) -> bytes:
    async with _client(base) as client:
        async with client.chat.completions.with_streaming_response.create(
            model="sim-model",
            messages=[{"role": "user", "content": "Tell me a story"}],
            stream=True,
            extra_headers={"x-sim-ttft": "0.3", "x-sim-tpot": "0.03", "x-sim-tokens": "20"},
            **extra,
        ) as resp:
            return b"".join([chunk async for chunk in resp.iter_bytes()])


async def test_sdk_stream_through_sidecar_is_byte_identical_and_measured(
    simulator, sidecar_factory
):
    direct_url = await simulator(model="sim-model", seed=7)
    proxied_upstream = await simulator(model="sim-model", seed=7)
    sc = await sidecar_factory(proxied_upstream)

    direct = await _raw_stream(direct_url, stream_options={"include_usage": True})
    proxied = await _raw_stream(sc.url, stream_options={"include_usage": True})
    # Same seed, same request: the same bytes, except the per-request id and timestamp.
    assert _VOLATILE.sub(b"", proxied) == _VOLATILE.sub(b"", direct)
    assert proxied.endswith(b"data: [DONE]\n\n")

    labels = {"model": "sim-model", "route": ROUTE}
    await wait_for(lambda: sc.sample("llm_requests_total", code="200", outcome="ok", **labels) == 1)
    ttft = sc.sample("llm_time_to_first_token_seconds_sum", **per_model(labels))
    assert 0.29 <= ttft < 0.45, ttft
    assert sc.sample("llm_inter_token_latency_seconds_count", **per_model(labels)) == 19
    tpot = sc.sample("llm_time_per_output_token_seconds_sum", **per_model(labels))
    assert 0.025 <= tpot < 0.045, tpot
    tps = sc.sample("llm_output_tokens_per_second_sum", **per_model(labels))
    assert 20 <= tps <= 40, tps
    assert sc.sample("llm_tokens_total", type="output", **labels) == 20
    assert sc.sample("llm_tokens_total", type="input", **labels) > 0
    e2e = sc.sample("llm_request_duration_seconds_sum", outcome="ok", **per_model(labels))
    assert 0.3 + 19 * 0.03 - 0.02 <= e2e < 1.3


async def test_stream_without_usage_is_relayed_as_is_and_input_stays_unknown(
    simulator, sidecar_factory
):
    """The client did not ask for usage: the server is not asked either, the client gets the
    bytes a direct connection gives, output tokens come from the stream's own chunks and the
    input count, which only usage knows, is never invented."""
    direct_url = await simulator(model="sim-model", seed=9)
    sc = await sidecar_factory(await simulator(model="sim-model", seed=9))
    direct = await _raw_stream(direct_url)
    proxied = await _raw_stream(sc.url)
    assert b'"usage"' not in direct
    assert _VOLATILE.sub(b"", proxied) == _VOLATILE.sub(b"", direct)
    labels = {"model": "sim-model", "route": ROUTE}
    await wait_for(lambda: sc.sample("llm_requests_total", code="200", outcome="ok", **labels) == 1)
    assert sc.sample("llm_tokens_total", type="output", **labels) == 20
    assert not sc.sample("llm_tokens_total", type="input", **labels)  # only usage knows this


async def test_sdk_parsed_stream_and_counts_without_usage(simulator, sidecar_factory):
    sc = await sidecar_factory(await simulator(model="sim-model", seed=1))
    async with _client(sc.url) as client:
        stream = await client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_headers={"x-sim-ttft": "0.05", "x-sim-tpot": "0.01", "x-sim-tokens": "12"},
        )
        deltas = [
            c.choices[0].delta.content
            async for c in stream
            if c.choices and c.choices[0].delta.content
        ]
    assert len(deltas) == 12
    labels = {"model": "sim-model", "route": ROUTE}
    await wait_for(lambda: sc.sample("llm_requests_total", code="200", outcome="ok", **labels) == 1)
    # No usage in the stream: output tokens are counted from it, one per content delta.
    assert sc.sample("llm_tokens_total", type="output", **labels) == 12
    assert sc.sample("llm_tokens_total", type="input", **labels) is None


async def test_sdk_non_streaming_and_completions(simulator, sidecar_factory):
    sc = await sidecar_factory(await simulator(model="sim-model", seed=2))
    async with _client(sc.url) as client:
        chat = await client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-sim-tokens": "9", "x-sim-tpot": "0.001"},
        )
        comp = await client.completions.create(
            model="sim-model",
            prompt="Once",
            stream=True,
            extra_headers={"x-sim-tokens": "6", "x-sim-tpot": "0.001"},
        )
        texts = [c.choices[0].text async for c in comp if c.choices]
    assert chat.usage.completion_tokens == 9
    assert len([t for t in texts if t]) == 6
    await wait_for(
        lambda: (
            sc.sample(
                "llm_requests_total",
                model="sim-model",
                route="/v1/completions",
                code="200",
                outcome="ok",
            )
            == 1
        )
    )
    assert sc.sample("llm_tokens_total", model="sim-model", route=ROUTE, type="output") == 9
    assert (
        sc.sample("llm_tokens_total", model="sim-model", route="/v1/completions", type="output")
        == 6
    )


async def test_sdk_sees_clean_errors(simulator, sidecar_factory, refused_url):
    sc = await sidecar_factory(refused_url)
    async with _client(sc.url) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
    assert info.value.status_code == 502
    assert "unreachable" in str(info.value)

    sc = await sidecar_factory(await simulator(model="sim-model"))
    async with _client(sc.url) as client:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-sim-fail": "500"},
            )
        with pytest.raises(openai.APIError):
            stream = await client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_headers={"x-sim-fail": "drop", "x-sim-tokens": "20", "x-sim-tpot": "0.005"},
            )
            async for _ in stream:
                pass
    labels = {"model": "sim-model", "route": ROUTE}
    await wait_for(
        lambda: sc.sample("llm_requests_total", code="500", outcome="error", **labels) == 1
    )
    await wait_for(
        lambda: sc.sample("llm_requests_total", code="200", outcome="error", **labels) == 1
    )
