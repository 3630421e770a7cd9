"""TTFT by prefix-cache class against a real vLLM 0.32 on CPU with prefix caching.

vLLM started with ``--enable-prefix-caching --enable-prompt-tokens-details`` reports, in a
streamed chat's usage chunk, ``prompt_tokens_details.cached_tokens``: 0 for a prompt it has
not seen, whole 16-token blocks of it for a prompt that shares a prefix with an earlier one
(REAL-PARTS.md). Through the sidecar, with the real openai SDK as the client: each prompt's
first request is filed under ``cache="none"``, its repeat under ``cache="most"``, and each
class's TTFT sum is the client's own TTFTs for those requests less the way back to the client.

Whether the repeats also start faster is vLLM's business, not the sidecar's, and with a tiny
model it is not reliably true: a 470-token prefill costs a few milliseconds on CPU, as much as
the scheduler's jitter (CI once measured hits 24-29 ms, misses 24-29 ms).

``RECORD_PREFIX_CACHE=DIR`` also writes the raw bytes of a cached answer there (how
``tests/fixtures/streams/openai/vllm032_chat_prefix_cached.txt`` was recorded).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tests.real.servers import ServerKind, serving
from tests.support.waits import wait_for

pytestmark = [pytest.mark.real, pytest.mark.integration]

openai = pytest.importorskip("openai")

PREFIX_CACHE = ServerKind(
    "vllm-prefix-cache",
    "vllm",
    ("--enable-prefix-caching", "--enable-prompt-tokens-details"),
    variant="-prefix-cache",
)
ROUTE = "/v1/chat/completions"
LICENCES = Path("/usr/share/common-licenses")
PROMPT_TOKENS = (380, 470)  # long enough for several 16-token blocks, within --max-model-len 512


@pytest.fixture(scope="module")
def vllm_prefix_cache():
    with serving(PREFIX_CACHE) as server:
        yield server


def _count(server, text: str) -> int:
    body = json.dumps(
        {"model": PREFIX_CACHE.model, "messages": [{"role": "user", "content": text}]}
    ).encode()
    request = urllib.request.Request(
        f"{server.url}/tokenize", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return int(json.loads(resp.read())["count"])


def _prompt(server, source: str) -> str:
    """A prompt of PROMPT_TOKENS tokens from a licence text (the tiny model's BPE was trained
    on these texts, so the count is found by asking the server's own tokenizer)."""
    words = (LICENCES / source).read_text(errors="replace").split()
    low, high = 1, len(words)
    while low < high:  # the longest prefix of words within the upper bound
        mid = (low + high + 1) // 2
        if _count(server, " ".join(words[:mid])) <= PROMPT_TOKENS[1]:
            low = mid
        else:
            high = mid - 1
    text = " ".join(words[:low])
    assert _count(server, text) >= PROMPT_TOKENS[0]
    return text


async def _ask(client, text: str) -> tuple[float, int | None]:
    """One streamed chat through the sidecar: the client's own TTFT and the cached count."""
    began = time.perf_counter()
    ttft = None
    cached = None
    stream = await client.chat.completions.create(
        model=PREFIX_CACHE.model,
        messages=[{"role": "user", "content": text}],
        max_tokens=4,
        temperature=0,
        seed=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if (
            ttft is None
            and chunk.choices
            and chunk.choices[0].delta.content is not None
            and chunk.choices[0].delta.content != ""
        ):
            ttft = time.perf_counter() - began
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    assert ttft is not None
    return ttft, cached


async def test_cached_prompts_are_filed_by_cache_class_with_the_clients_ttft(
    vllm_prefix_cache, sidecar_factory
):
    server = vllm_prefix_cache
    sidecar = await sidecar_factory(server.url)
    client = openai.AsyncOpenAI(base_url=f"{sidecar.url}/v1", api_key="none", max_retries=0)
    try:
        warm_up, _ = await _ask(
            client, "Warm up."
        )  # the first request after start pays one-off costs
        misses, hits = [warm_up], []
        for source in ("GPL-3", "Apache-2.0"):
            text = _prompt(server, source)
            ttft, cached = await _ask(client, text)
            assert cached == 0
            misses.append(ttft)
            ttft, cached = await _ask(client, text)
            assert cached is not None and cached >= PROMPT_TOKENS[0] // 2, (
                cached
            )  # whole blocks of the prefix
            hits.append(ttft)
    finally:
        await client.close()

    def count(cache: str) -> float | None:
        return sidecar.sample(
            "llm_time_to_first_token_by_cache_seconds_count", model="tiny", cache=cache
        )

    await wait_for(lambda: (count("none") or 0) + (count("most") or 0) >= 4)
    assert count("most") == 2
    assert count("none") == 3  # the warm-up's short prompt had nothing cached either
    assert count("partial") is None and count("unknown") is None
    for cache, client_ttfts in (("most", hits), ("none", misses)):
        sidecar_sum = sidecar.sample(
            "llm_time_to_first_token_by_cache_seconds_sum", model="tiny", cache=cache
        )
        # the sidecar sees each first token before the client does, and not long before
        assert 0.5 * sum(client_ttfts) < sidecar_sum <= sum(client_ttfts), (
            cache,
            sidecar_sum,
            client_ttfts,
        )

    record = os.environ.get("RECORD_PREFIX_CACHE")
    if record:
        text = _prompt(server, "GPL-3")
        body = {
            "model": PREFIX_CACHE.model, "messages": [{"role": "user", "content": text}], "max_tokens": 4,
            "temperature": 0, "seed": 7, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{server.url}{ROUTE}", json=body) as resp:
                raw = await resp.read()
        Path(record).mkdir(parents=True, exist_ok=True)
        (Path(record) / "vllm032_chat_prefix_cached.txt").write_bytes(raw)
