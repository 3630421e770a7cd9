"""Every other dialect streamed through the sidecar by its real client library (or plain
aiohttp where there is no official async client), from the simulator.

Each test checks that the client received what a direct connection to an identically
seeded simulator gives (up to the clocks in the payload), then the registry: TTFT, the
number of inter-token gaps, tokens by type, the engine's own timings where the stream
carries them, and the outcome. Timings are exact through ``x-sim-*`` headers and small.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import aiohttp
import anthropic
import huggingface_hub
import ollama
import openai
import pytest
from huggingface_hub.errors import GenerationError

from sidecar.tools.sim.dialects import ENGINE_LOAD_SHARE, ENGINE_PREFILL_SHARE
from tests.support.in_process import RunningSidecar
from tests.support.samples import per_model
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

MODEL = "sim-model"
UNKNOWN = "unknown"  # the model label of requests that name no model (TGI, llama.cpp)
_CLOCKS = re.compile(rb'"(created|created_at|completed_at)":("[^"]*"|\d+)')


async def pair(simulator, sidecar_factory, seed: int) -> tuple[str, RunningSidecar]:
    """A direct simulator and a sidecar in front of an identically seeded one."""
    direct = await simulator(model=MODEL, seed=seed)
    sc = await sidecar_factory(await simulator(model=MODEL, seed=seed))
    return direct, sc


def timing(
    ttft: float, tpot: float, tokens: int, reasoning: int = 0, fail: str | None = None
) -> dict[str, str]:
    headers = {"x-sim-ttft": str(ttft), "x-sim-tpot": str(tpot), "x-sim-tokens": str(tokens)}
    if reasoning:
        headers["x-sim-reasoning"] = str(reasoning)
    if fail:
        headers["x-sim-fail"] = fail
    return headers


async def finished(
    sc: RunningSidecar, route: str, model: str, code: str = "200", outcome: str = "ok", n: int = 1
) -> None:
    await wait_for(
        lambda: (
            sc.sample("llm_requests_total", model=model, route=route, code=code, outcome=outcome)
            == n
        )
    )


async def answered_4xx(sc: RunningSidecar, route: str, model: str, code: str) -> None:
    """A 4xx was relayed and recorded. Its outcome is not asserted: metrics.py and the proxy
    call a 4xx ``ok``, but the route's JSON parser reads the error body as a StreamError,
    which turns the outcome into ``error`` (reported, not settled here)."""

    def total() -> float:
        return sum(
            sc.sample("llm_requests_total", model=model, route=route, code=code, outcome=o) or 0
            for o in ("ok", "error")
        )

    await wait_for(lambda: total() == 1)


def check_stream(
    sc: RunningSidecar,
    route: str,
    model: str,
    *,
    ttft: float,
    tpot: float,
    gaps: int,
    output: int,
    input_tokens: bool = True,
    reasoning: int | None = None,
    tpot_seen: float | None = None,
) -> None:
    """The registry after exactly one ok streamed request on (route, model).

    Lower bounds come from the simulator's schedule (no token can be seen before it is
    sent). Upper bounds come from the request's own end-to-end time, not from the schedule: a
    loaded machine delays tokens by a few hundred ms, but the tokens after the first still
    take at least their scheduled gaps before the end, so a TTFT read at a later token, or a
    TPOT that took in the TTFT, still fails."""
    labels = {"model": model, "route": route}
    e2e = sc.sample("llm_request_duration_seconds_sum", outcome="ok", **per_model(labels))
    expected = tpot if tpot_seen is None else tpot_seen
    later = gaps * expected * 0.8  # at least this long from the first token to the end
    first = sc.sample("llm_time_to_first_token_seconds_sum", **per_model(labels))
    assert ttft - 0.005 <= first <= e2e - later, (first, e2e)
    assert sc.sample("llm_time_to_first_token_seconds_count", **per_model(labels)) == 1
    assert sc.sample("llm_inter_token_latency_seconds_count", **per_model(labels)) == gaps
    per_token = sc.sample("llm_time_per_output_token_seconds_sum", **per_model(labels))
    assert expected * 0.8 <= per_token <= (e2e - ttft) / (output - 1), (per_token, e2e)
    assert sc.sample("llm_tokens_total", type="output", **labels) == output
    assert sc.sample("llm_request_tokens_count", type="output", **per_model(labels)) == 1
    if input_tokens:
        assert sc.sample("llm_tokens_total", type="input", **labels) > 0
    else:
        assert sc.sample("llm_tokens_total", type="input", **labels) is None
    assert sc.sample("llm_tokens_total", type="reasoning", **labels) == reasoning
    if reasoning:
        answer_at = sc.sample("llm_time_to_first_answer_token_seconds_sum", **per_model(labels))
        assert (
            ttft + reasoning * tpot - 0.005
            <= answer_at
            <= e2e - (gaps - reasoning) * expected * 0.8
        ), answer_at
    else:
        assert (
            sc.sample("llm_time_to_first_answer_token_seconds_count", **per_model(labels)) is None
        )
    assert sc.sample("llm_stream_parse_errors_total", route=route) is None


def check_engine(
    sc: RunningSidecar, route: str, model: str, *, load: float | None, prefill: float, decode: float
) -> None:
    labels = {"model": model}  # the engine's phases are per model
    for name, value in (("load", load), ("prefill", prefill), ("decode", decode)):
        seen = sc.sample(f"llm_upstream_{name}_seconds_sum", **labels)
        if value is None:
            assert seen is None, name
        else:
            assert seen == pytest.approx(value, abs=1e-6), name
            assert sc.sample(f"llm_upstream_{name}_seconds_count", **labels) == 1


# ---------------------------------------------------------------- OpenAI Responses


def _openai(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)


async def test_openai_responses_stream(simulator, sidecar_factory):
    direct, sc = await pair(simulator, sidecar_factory, seed=3)
    headers = timing(0.1, 0.01, 12, reasoning=3)

    async def raw(base: str) -> bytes:
        async with _openai(base) as client:
            async with client.responses.with_streaming_response.create(
                model=MODEL, input="Tell me a story", stream=True, extra_headers=headers
            ) as resp:
                return b"".join([chunk async for chunk in resp.iter_bytes()])

    want, got = await raw(direct), await raw(sc.url)
    assert _CLOCKS.sub(b"", got) == _CLOCKS.sub(b"", want)
    assert b"event: response.completed\n" in got
    route = "/v1/responses"
    await finished(sc, route, MODEL)
    check_stream(sc, route, MODEL, ttft=0.1, tpot=0.01, gaps=14, output=15, reasoning=3)

    # The SDK's own parsing, through the sidecar.
    async with _openai(sc.url) as client:
        stream = await client.responses.create(
            model=MODEL,
            input="Tell me a story",
            stream=True,
            extra_headers=timing(0.02, 0.002, 5, reasoning=2),
        )
        events = [event async for event in stream]
    assert [e.type for e in events if e.type.endswith(".delta")] == (
        ["response.reasoning_text.delta"] * 2 + ["response.output_text.delta"] * 5
    )
    completed = events[-1]
    assert completed.type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert completed.response.output_text == text
    assert completed.response.usage.output_tokens == 7
    assert completed.response.usage.output_tokens_details.reasoning_tokens == 2
    await finished(sc, route, MODEL, n=2)
    assert sc.sample("llm_tokens_total", model=MODEL, route=route, type="output") == 15 + 7
    assert sc.sample("llm_tokens_total", model=MODEL, route=route, type="reasoning") == 3 + 2


async def test_openai_responses_failed_whole_and_500(simulator, sidecar_factory):
    sc = await sidecar_factory(await simulator(model=MODEL, seed=4))
    route = "/v1/responses"
    async with _openai(sc.url) as client:
        stream = await client.responses.create(
            model=MODEL,
            input="hi",
            stream=True,
            extra_headers=timing(0.02, 0.002, 8, fail="stream"),
        )
        events = [event async for event in stream]
        assert events[-1].type == "response.failed"
        assert events[-1].response.error.code == "server_error"
        await finished(sc, route, MODEL, outcome="error")
        assert (
            sc.sample("llm_tokens_total", model=MODEL, route=route, type="output") == 4
        )  # counted from the stream

        whole = await client.responses.create(
            model=MODEL, input="hi", extra_headers=timing(0.01, 0.001, 6)
        )
        assert whole.status == "completed" and whole.usage.output_tokens == 6
        await finished(sc, route, MODEL)
        assert sc.sample("llm_tokens_total", model=MODEL, route=route, type="output") == 4 + 6
        assert sc.sample("llm_time_to_first_token_seconds_count", model=MODEL) == 1  # streams only

        with pytest.raises(openai.InternalServerError):
            await client.responses.create(
                model=MODEL, input="hi", extra_headers={"x-sim-fail": "500"}
            )
    await finished(sc, route, MODEL, code="500", outcome="error")


# ---------------------------------------------------------------- Anthropic Messages


def _anthropic(base: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)


MESSAGES: list[Any] = [{"role": "user", "content": "Tell me a story"}]


async def test_anthropic_messages_stream(simulator, sidecar_factory):
    direct, sc = await pair(simulator, sidecar_factory, seed=5)
    headers = timing(0.1, 0.01, 10, reasoning=4)

    async def raw(base: str) -> bytes:
        async with _anthropic(base) as client:
            async with client.messages.with_streaming_response.create(
                model=MODEL, max_tokens=1024, messages=MESSAGES, stream=True, extra_headers=headers
            ) as resp:
                return b"".join([chunk async for chunk in resp.iter_bytes()])

    want, got = await raw(direct), await raw(sc.url)
    assert got == want  # nothing in an Anthropic stream is a clock
    route = "/v1/messages"
    await finished(sc, route, MODEL)
    # Anthropic's usage has no reasoning count: the thinking deltas are counted.
    check_stream(sc, route, MODEL, ttft=0.1, tpot=0.01, gaps=13, output=14, reasoning=4)

    # The SDK's stream helper, through the sidecar.
    async with _anthropic(sc.url) as client:
        async with client.messages.stream(
            model=MODEL,
            max_tokens=1024,
            messages=MESSAGES,
            extra_headers=timing(0.02, 0.002, 5, reasoning=2),
        ) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[1].text == text and final.content[0].signature
    assert final.usage.output_tokens == 7 and final.usage.input_tokens > 0
    assert final.stop_reason == "end_turn"
    await finished(sc, route, MODEL, n=2)
    assert sc.sample("llm_tokens_total", model=MODEL, route=route, type="output") == 14 + 7


async def test_anthropic_errors(simulator, sidecar_factory):
    sc = await sidecar_factory(await simulator(model=MODEL, seed=6))
    route = "/v1/messages"
    async with _anthropic(sc.url) as client:
        with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
            async with client.messages.stream(
                model=MODEL,
                max_tokens=100,
                messages=MESSAGES,
                extra_headers=timing(0.02, 0.002, 8, fail="stream"),
            ) as stream:
                async for _ in stream.text_stream:
                    pass
        await finished(sc, route, MODEL, outcome="error")
        assert sc.sample("llm_tokens_total", model=MODEL, route=route, type="output") == 4
        assert (
            sc.sample("llm_tokens_total", model=MODEL, route=route, type="input") > 0
        )  # from message_start

        whole = await client.messages.create(
            model=MODEL, max_tokens=100, messages=MESSAGES, extra_headers=timing(0.01, 0.001, 6)
        )
        assert whole.usage.output_tokens == 6
        await finished(sc, route, MODEL)
        assert sc.sample("llm_tokens_total", model=MODEL, route=route, type="output") == 4 + 6

        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="claude-9", max_tokens=100, messages=MESSAGES)
    await answered_4xx(sc, route, "other", "404")  # a name answered 4xx never takes a label slot


# ---------------------------------------------------------------- Hugging Face TGI


def _hf(url: str, headers: dict[str, str]) -> huggingface_hub.AsyncInferenceClient:
    # A URL as the model: the client posts to it as is (see the TGI test for why the path).
    return huggingface_hub.AsyncInferenceClient(model=url, api_key="hf_test", headers=headers)


async def test_tgi_inference_client_stream(simulator, sidecar_factory):
    direct, sc = await pair(simulator, sidecar_factory, seed=7)
    headers = timing(0.1, 0.01, 12)

    async def outputs(base: str) -> list[dict[str, Any]]:
        # The path is explicit: a bare server URL makes the client post to TGI's "/" compat
        # route, which the sidecar relays but does not measure (routes.py has no "/").
        client = _hf(base + "/generate_stream", headers)
        stream = await client.text_generation("Tell me a story", stream=True, details=True)
        return [dataclasses.asdict(out) async for out in stream]

    want, got = await outputs(direct), await outputs(sc.url)
    assert got == want
    assert got[-1]["token"]["special"] and got[-1]["details"]["finish_reason"] == "eos_token"
    assert got[-1]["details"]["generated_tokens"] == 12
    route = "/generate_stream"
    await finished(sc, route, UNKNOWN)
    # 11 text tokens then the special </s>: the stream counts 11 (10 gaps), usage says 12,
    # so TPOT is (11 - 1) gaps spread over (12 - 1).
    check_stream(
        sc, route, UNKNOWN, ttft=0.1, tpot=0.01, gaps=10, output=12, tpot_seen=0.01 * 10 / 11
    )

    # Whole body, with details.
    whole = await _hf(sc.url + "/generate", timing(0.01, 0.001, 5)).text_generation(
        "Tell me a story", details=True, max_new_tokens=5
    )
    assert whole.details.generated_tokens == 5 and whole.details.finish_reason == "length"
    await finished(sc, "/generate", UNKNOWN)
    assert sc.sample("llm_tokens_total", model=UNKNOWN, route="/generate", type="output") == 5


async def test_tgi_generation_error(simulator, sidecar_factory):
    sc = await sidecar_factory(await simulator(model=MODEL, seed=8))
    client = _hf(sc.url + "/generate_stream", timing(0.02, 0.002, 8, fail="stream"))
    tokens = []
    with pytest.raises(GenerationError, match="Simulated engine failure"):
        async for token in await client.text_generation("hi", stream=True):
            tokens.append(token)
    assert len(tokens) == 4
    await finished(sc, "/generate_stream", UNKNOWN, outcome="error")
    assert (
        sc.sample("llm_tokens_total", model=UNKNOWN, route="/generate_stream", type="output") == 4
    )


# ---------------------------------------------------------------- Ollama


def _ollama(base: str, headers: dict[str, str]) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=base, headers=headers)


def _dump(part: Any) -> dict[str, Any]:
    data = part.model_dump(exclude_none=True)
    data.pop("created_at")
    return data


async def test_ollama_chat_and_generate_stream(simulator, sidecar_factory):
    direct, sc = await pair(simulator, sidecar_factory, seed=9)
    ttft, tpot = 0.1, 0.01
    headers = timing(ttft, tpot, 10, reasoning=3)

    async def chat(base: str) -> list[dict[str, Any]]:
        stream = await _ollama(base, headers).chat(model=MODEL, messages=MESSAGES, stream=True)
        return [_dump(part) async for part in stream]

    want, got = await chat(direct), await chat(sc.url)
    assert got == want
    assert [p["message"].get("thinking") is not None for p in got[:4]] == [True, True, True, False]
    final = got[-1]
    assert final["done"] and final["done_reason"] == "stop" and final["eval_count"] == 13
    route = "/api/chat"
    await finished(sc, route, MODEL)
    check_stream(sc, route, MODEL, ttft=ttft, tpot=tpot, gaps=12, output=13, reasoning=3)
    check_engine(
        sc,
        route,
        MODEL,
        load=ttft * ENGINE_LOAD_SHARE,
        prefill=ttft * ENGINE_PREFILL_SHARE,
        decode=12 * tpot,
    )
    # The engine's own prefill fits inside the TTFT the sidecar saw; the rest is overhead.
    assert sc.sample("llm_upstream_prefill_seconds_sum", model=MODEL) < sc.sample(
        "llm_time_to_first_token_seconds_sum", model=MODEL
    )

    # A fresh pair: the distributions are per model, and /api/chat's are in this page's.
    direct, sc = await pair(simulator, sidecar_factory, seed=9)

    async def generate(base: str) -> list[dict[str, Any]]:
        stream = await _ollama(base, timing(0.05, 0.005, 6)).generate(
            model=MODEL, prompt="Once upon", stream=True
        )
        return [_dump(part) async for part in stream]

    want, got = await generate(direct), await generate(sc.url)
    assert got == want
    assert "".join(p["response"] for p in got) and got[-1]["eval_count"] == 6
    route = "/api/generate"
    await finished(sc, route, MODEL)
    check_stream(sc, route, MODEL, ttft=0.05, tpot=0.005, gaps=5, output=6)
    check_engine(
        sc,
        route,
        MODEL,
        load=0.05 * ENGINE_LOAD_SHARE,
        prefill=0.05 * ENGINE_PREFILL_SHARE,
        decode=5 * 0.005,
    )


async def test_ollama_errors(simulator, sidecar_factory):
    sc = await sidecar_factory(await simulator(model=MODEL, seed=10))
    route = "/api/chat"
    parts = []
    with pytest.raises(ollama.ResponseError, match="Simulated engine failure"):
        stream = await _ollama(sc.url, timing(0.02, 0.002, 8, fail="stream")).chat(
            model=MODEL, messages=MESSAGES, stream=True
        )
        async for part in stream:
            parts.append(part)
    assert len(parts) == 4
    await finished(sc, route, MODEL, outcome="error")
    assert sc.sample("llm_tokens_total", model=MODEL, route=route, type="output") == 4
    assert sc.sample("llm_upstream_prefill_seconds_count", model=MODEL) is None  # no final line

    whole = await _ollama(sc.url, timing(0.01, 0.001, 5)).chat(
        model=MODEL, messages=MESSAGES, stream=False
    )
    assert whole.eval_count == 5 and whole.message.content
    await finished(sc, route, MODEL)
    assert sc.sample("llm_tokens_total", model=MODEL, route=route, type="output") == 4 + 5
    assert sc.sample("llm_upstream_prefill_seconds_count", model=MODEL) == 1

    with pytest.raises(ollama.ResponseError) as info:
        async for _ in await _ollama(sc.url, {}).chat(
            model="llama9", messages=MESSAGES, stream=True
        ):
            pass
    assert info.value.status_code == 404
    await answered_4xx(sc, route, "other", "404")  # a name answered 4xx never takes a label slot


# ---------------------------------------------------------------- llama.cpp and Triton (plain aiohttp)


async def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body, headers=headers) as resp:
            return resp.status, await resp.read()


async def test_llamacpp_completion_stream(simulator, sidecar_factory):
    direct, sc = await pair(simulator, sidecar_factory, seed=11)
    ttft, tpot = 0.1, 0.01
    headers = timing(ttft, tpot, 12)
    body = {"prompt": "The capital of France is", "n_predict": 64, "stream": True}
    want, got = (
        await _post(direct + "/completion", body, headers),
        await _post(sc.url + "/completion", body, headers),
    )
    assert got == want and got[0] == 200
    assert b'"stop":true' in got[1] and b'"timings":{' in got[1]
    route = "/completion"
    await finished(sc, route, UNKNOWN)
    check_stream(sc, route, UNKNOWN, ttft=ttft, tpot=tpot, gaps=11, output=12)
    check_engine(
        sc, route, UNKNOWN, load=None, prefill=ttft * ENGINE_PREFILL_SHARE, decode=11 * tpot
    )

    status, raw = await _post(sc.url + "/completion", body, timing(0.02, 0.002, 8, fail="stream"))
    assert status == 200 and raw.endswith(b'"type":"server_error"}}\n\n')
    await finished(sc, route, UNKNOWN, outcome="error")


async def test_triton_generate_stream(simulator, sidecar_factory):
    direct, sc = await pair(simulator, sidecar_factory, seed=12)
    headers = timing(0.1, 0.01, 12)
    path = f"/v2/models/{MODEL}/generate_stream"
    body = {"text_input": "What is machine learning?", "max_tokens": 64, "stream": True}
    want, got = await _post(direct + path, body, headers), await _post(sc.url + path, body, headers)
    assert got == want and got[0] == 200
    route = "/v2/models/{model}/generate_stream"
    await finished(sc, route, MODEL)  # the model label comes from the path
    # Triton reports no usage: output tokens are counted from the stream, input is unknown.
    check_stream(sc, route, MODEL, ttft=0.1, tpot=0.01, gaps=11, output=12, input_tokens=False)

    status, raw = await _post(sc.url + path, body, timing(0.02, 0.002, 8, fail="stream"))
    assert status == 200 and raw.count(b"text_output") == 4 and b'data: {"error":' in raw
    await finished(sc, route, MODEL, outcome="error")
