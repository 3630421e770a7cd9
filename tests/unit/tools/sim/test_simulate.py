"""The simulated vLLM server: wire shapes, timing, overrides, failures and cancellation."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from sidecar.tools.sim.core import SIM_STATS, SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app

MODEL = "sim-llama-3-8b"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# Fast and exact by default; tests that want jitter say so.
FAST = SimulatorConfig(ttft=0.005, tpot=0.001, jitter=0.0, tokens=8, tokens_spread=0.0, seed=7)
EXACT = {"x-sim-ttft": "0", "x-sim-tpot": "0"}


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello there!"}], **extra}


def completion_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", **extra}


def sse_events(raw: bytes) -> list[bytes]:
    """Split a complete SSE body into ``data:`` payloads, checking the framing."""
    assert raw.endswith(b"\n\n")
    out = []
    for part in raw.split(b"\n\n")[:-1]:
        assert part.startswith(b"data: "), part
        assert b"\n" not in part
        out.append(part[len(b"data: ") :])
    return out


def chunks(events: list[bytes]) -> list[dict[str, Any]]:
    assert events[-1] == b"[DONE]"
    assert b"[DONE]" not in events[:-1]
    parsed = []
    for ev in events[:-1]:
        obj = orjson.loads(ev)
        # compact JSON, raw UTF-8, exactly as pydantic writes it (key order preserved)
        assert orjson.dumps(obj) == ev
        parsed.append(obj)
    return parsed


def deltas(parsed: list[dict[str, Any]], key: str = "content") -> list[str]:
    """Token texts of one kind, skipping role-only chunks and the usage chunk."""
    out = []
    for c in parsed:
        delta = c["choices"][0]["delta"] if c["choices"] else {}
        if key in delta and "role" not in delta:
            out.append(delta[key])
    return out


async def make_client(aiohttp_client: Any, config: SimulatorConfig = FAST) -> Any:
    return await aiohttp_client(build_simulator_app(config))


async def post_stream(
    client: Any, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    resp = await client.post(path, json=body, headers=headers or {})
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    return chunks(sse_events(await resp.read()))


# ---------------------------------------------------------------- chat streaming


async def test_chat_stream_shape(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    parsed = await post_stream(client, CHAT, chat_body(stream=True), {**EXACT, "x-sim-tokens": "5"})

    first = parsed[0]
    assert list(first) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "prompt_token_ids",
        "prompt_text",
    ]
    assert first["prompt_token_ids"] is None and first["prompt_text"] is None  # vLLM 0.32
    assert first["id"].startswith("chatcmpl-") and len(first["id"]) == len("chatcmpl-") + 16
    assert first["object"] == "chat.completion.chunk"
    assert isinstance(first["created"], int)
    assert first["model"] == MODEL
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]

    tokens = parsed[1:]
    assert len(tokens) == 5
    assert all(c["id"] == first["id"] and c["created"] == first["created"] for c in tokens)
    assert all("usage" not in c for c in parsed)  # only with include_usage
    for c in tokens[:-1]:
        assert list(c) == ["id", "object", "created", "model", "choices"]
        assert list(c["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        assert list(c["choices"][0]["delta"]) == ["content"]
        assert c["choices"][0]["finish_reason"] is None
    last = tokens[-1]["choices"][0]
    assert list(last) == ["index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"]
    assert last["finish_reason"] == "stop" and last["stop_reason"] is None
    assert last["delta"]["content"]
    # Without include_usage the finishing chunk carries the fingerprint (vLLM 0.32).
    assert list(tokens[-1]) == ["id", "object", "created", "model", "choices", "system_fingerprint"]
    assert tokens[-1]["system_fingerprint"].startswith("vllm-0.32.0-")


async def test_chat_stream_include_usage(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    body = chat_body(stream=True, stream_options={"include_usage": True})
    parsed = await post_stream(client, CHAT, body, {**EXACT, "x-sim-tokens": "7"})

    *rest, usage_chunk = parsed
    assert all("usage" not in c for c in rest)  # current vLLM: exclude_unset, no usage key
    assert usage_chunk["choices"] == []
    assert list(usage_chunk) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
    ]
    assert all("system_fingerprint" not in c for c in rest)  # it moved to the usage chunk
    usage = usage_chunk["usage"]
    assert list(usage) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    content = deltas(parsed)
    assert usage["completion_tokens"] == len(content) == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7
    assert usage["prompt_tokens"] > 0

    # the prompt estimate is deterministic and grows with the prompt
    again = await post_stream(client, CHAT, body, {**EXACT, "x-sim-tokens": "7"})
    assert again[-1]["usage"]["prompt_tokens"] == usage["prompt_tokens"]
    longer = chat_body(
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "word " * 200}],
    )
    bigger = await post_stream(client, CHAT, longer, EXACT)
    assert bigger[-1]["usage"]["prompt_tokens"] > usage["prompt_tokens"] + 200


async def test_chat_stream_n2_interleaved(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    body = chat_body(stream=True, n=2, stream_options={"include_usage": True})
    parsed = await post_stream(client, CHAT, body, {**EXACT, "x-sim-tokens": "4"})

    indices = [c["choices"][0]["index"] for c in parsed[:-1]]
    assert indices == [0, 1] * 5  # a role chunk per choice, then tokens step by step
    for i in (0, 1):
        mine = [c["choices"][0] for c in parsed[:-1] if c["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert [m["finish_reason"] for m in mine[1:]] == [None, None, None, "stop"]
    assert parsed[-1]["usage"]["completion_tokens"] == 8


async def test_chat_stream_reasoning(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    body = chat_body(stream=True, stream_options={"include_usage": True})
    headers = {**EXACT, "x-sim-tokens": "4", "x-sim-reasoning": "3"}
    parsed = await post_stream(client, CHAT, body, headers)

    kinds = [list(c["choices"][0]["delta"]) for c in parsed[1:-1]]
    assert kinds == [["reasoning"]] * 3 + [["content"]] * 4  # vLLM 0.32 renamed reasoning_content
    assert parsed[-1]["usage"]["completion_tokens"] == 7

    # from the config as well, and per choice
    client = await make_client(
        aiohttp_client,
        SimulatorConfig(
            ttft=0.001, tpot=0.0, jitter=0, tokens=3, tokens_spread=0, reasoning_tokens=2
        ),
    )
    parsed = await post_stream(client, CHAT, chat_body(stream=True, n=2))
    for i in (0, 1):
        mine = [list(c["choices"][0]["delta"]) for c in parsed if c["choices"][0]["index"] == i]
        assert mine == [["role", "content"]] + [["reasoning"]] * 2 + [["content"]] * 3


async def test_max_tokens_caps_and_finish_length(aiohttp_client: Any) -> None:
    client = await make_client(
        aiohttp_client, SimulatorConfig(ttft=0.001, tpot=0.0, jitter=0, tokens=50, tokens_spread=0)
    )
    for key in ("max_tokens", "max_completion_tokens"):
        parsed = await post_stream(client, CHAT, chat_body(stream=True, **{key: 6}))
        assert len(deltas(parsed)) == 6
        assert parsed[-1]["choices"][0]["finish_reason"] == "length"
    parsed = await post_stream(client, COMPLETIONS, completion_body(stream=True, max_tokens=3))
    assert [c["choices"][0]["finish_reason"] for c in parsed] == [None, None, "length"]


# ---------------------------------------------------------------- completions


async def test_completions_stream_shape(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    body = completion_body(stream=True)
    parsed = await post_stream(client, COMPLETIONS, body, {**EXACT, "x-sim-tokens": "4"})

    assert len(parsed) == 4  # no role chunk
    for c in parsed:
        fingerprint = ["system_fingerprint"] if c is parsed[-1] else []  # on the finishing chunk
        assert list(c) == ["id", "object", "created", "model", "choices", *fingerprint]
        assert c["id"].startswith("cmpl-") and c["object"] == "text_completion"
        assert list(c["choices"][0]) == [
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "prompt_token_ids",
            "token_ids",
        ]
        assert c["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in parsed] == [None, None, None, "stop"]

    body = completion_body(stream=True, stream_options={"include_usage": True}, n=2)
    parsed = await post_stream(client, COMPLETIONS, body, {**EXACT, "x-sim-tokens": "3"})
    assert [c["choices"][0]["index"] for c in parsed[:-1]] == [0, 1] * 3
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 6


async def test_non_streaming_bodies(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    headers = {"x-sim-tokens": "5", "x-sim-reasoning": "2"}
    resp = await client.post(CHAT, json=chat_body(n=2), headers=headers)
    assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
    data = await resp.json()
    assert list(data) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    assert [c["index"] for c in data["choices"]] == [0, 1]
    msg = data["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"] and msg["reasoning"]
    assert "tool_calls" not in msg  # vLLM 0.32 leaves it out when there are none
    assert data["choices"][0]["finish_reason"] == "stop"
    usage = data["usage"]
    assert usage["completion_tokens"] == 2 * (5 + 2)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] is None and usage["completion_tokens_details"] is None

    resp = await client.post(COMPLETIONS, json=completion_body(max_tokens=4))
    data = await resp.json()
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert list(data["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
    ]
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 4


async def test_streamed_text_matches_non_streamed_text_for_same_seed(aiohttp_client: Any) -> None:
    a = await make_client(aiohttp_client)
    b = await make_client(aiohttp_client)
    streamed = await post_stream(a, CHAT, chat_body(stream=True))
    whole = await (await b.post(CHAT, json=chat_body())).json()
    assert "".join(deltas(streamed)) == whole["choices"][0]["message"]["content"]
    assert streamed[0]["id"] == whole["id"]


# ---------------------------------------------------------------- timing and overrides


async def test_header_overrides_exact_count_and_timing(aiohttp_client: Any) -> None:
    # the config is slow and jittery; the headers make this request exact
    slow = SimulatorConfig(ttft=5, tpot=1, jitter=0.5, tokens=99)
    client = await make_client(aiohttp_client, slow)
    headers = {"x-sim-ttft": "0.05", "x-sim-tpot": "0.01", "x-sim-tokens": "10"}
    start = time.monotonic()
    resp = await client.post(CHAT, json=chat_body(stream=True), headers=headers)
    arrivals: list[tuple[float, bytes]] = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            arrivals.append((time.monotonic() - start, line[6:].rstrip(b"\n")))
    tokens = [(t, ev) for t, ev in arrivals[1:] if ev != b"[DONE]"]
    assert len(tokens) == 10
    first, last = tokens[0][0], tokens[-1][0]
    assert 0.045 <= first < 0.05 + 0.04
    assert 0.135 <= last < 0.14 + 0.05  # ttft + 9 * tpot, no accumulated drift
    assert arrivals[0][0] >= 0.045  # the role chunk comes with the first token, after prefill


async def test_jitter_is_never_negative_and_spread_varies_lengths(aiohttp_client: Any) -> None:
    config = SimulatorConfig(
        ttft=0.002, tpot=0.0005, jitter=1.0, tokens=12, tokens_spread=0.8, seed=3
    )
    client = await make_client(aiohttp_client, config)
    lengths = set()
    for _ in range(12):
        data = await (await client.post(CHAT, json=chat_body(max_tokens=20))).json()
        n = data["usage"]["completion_tokens"]
        assert 1 <= n <= 20
        lengths.add(n)
    assert len(lengths) > 3


async def test_bad_override_header(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    for headers in ({"x-sim-ttft": "-1"}, {"x-sim-tokens": "zero"}, {"x-sim-fail": "maybe"}):
        resp = await client.post(CHAT, json=chat_body(), headers=headers)
        assert resp.status == 400
        assert list(headers)[0] in (await resp.json())["error"]["message"]


# ---------------------------------------------------------------- errors and failures


def assert_error(data: dict[str, Any], code: int, err_type: str) -> None:
    assert list(data) == ["error"]
    assert list(data["error"]) == ["message", "type", "param", "code"]
    assert data["error"]["type"] == err_type and data["error"]["code"] == code
    assert data["error"]["param"] is None and data["error"]["message"]


async def test_error_shapes(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    resp = await client.post(CHAT, data=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and resp.headers["Content-Type"] == "application/json"
    assert_error(await resp.json(), 400, "BadRequestError")

    resp = await client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 400
    assert_error(await resp.json(), 400, "BadRequestError")

    resp = await client.post(CHAT, json=chat_body(stream_options={"include_usage": True}))
    assert resp.status == 400

    resp = await client.post(COMPLETIONS, json={"model": MODEL})
    assert resp.status == 400

    for bad in ({"n": 0}, {"n": 10_000}, {"max_tokens": "many"}):
        resp = await client.post(CHAT, json=chat_body(**bad))
        assert resp.status == 400, bad

    resp = await client.post(CHAT, json=chat_body(model="gpt-9"))
    assert resp.status == 404
    data = await resp.json()
    assert_error(data, 404, "NotFoundError")
    assert data["error"]["message"] == "The model `gpt-9` does not exist."

    body = completion_body(stream=True)
    resp = await client.post(COMPLETIONS, json=body, headers={"x-sim-fail": "500"})
    assert resp.status == 500
    assert_error(await resp.json(), 500, "InternalServerError")
    assert client.app[SIM_STATS].failed == 1


async def test_fail_rate(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client, SimulatorConfig(ttft=0, tpot=0, fail_rate=1.0))
    resp = await client.post(CHAT, json=chat_body(stream=True))
    assert resp.status == 500
    # a scripted request is exempt from random failures
    resp = await client.post(CHAT, json=chat_body(stream=True), headers={"x-sim-tokens": "2"})
    assert resp.status == 200


async def read_until_cut(resp: aiohttp.ClientResponse) -> bytes:
    got = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async for data in resp.content.iter_any():
            got += data
    return got


async def test_drop_truncates_stream(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    headers = {**EXACT, "x-sim-fail": "drop", "x-sim-tokens": "10"}
    resp = await client.post(CHAT, json=chat_body(stream=True), headers=headers)
    assert resp.status == 200
    got = await read_until_cut(resp)
    assert b"[DONE]" not in got
    n_tokens = got.count(b'"content":"') - 1  # minus the role chunk
    assert 3 <= n_tokens <= 7
    stats = client.app[SIM_STATS]
    assert stats.dropped == 1 and stats.completed == 0

    client = await make_client(aiohttp_client, SimulatorConfig(ttft=0, tpot=0.001, drop_rate=1.0))
    resp = await client.post(COMPLETIONS, json=completion_body(stream=True))
    got = await read_until_cut(resp)
    assert b"[DONE]" not in got
    # drop_rate applies to streams only
    resp = await client.post(COMPLETIONS, json=completion_body(max_tokens=3))
    assert resp.status == 200


# ---------------------------------------------------------------- other endpoints


async def test_models_health_metrics(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    resp = await client.get("/v1/models")
    data = await resp.json()
    assert data["object"] == "list"
    card = data["data"][0]
    assert list(card) == [
        "id",
        "object",
        "created",
        "owned_by",
        "root",
        "parent",
        "max_model_len",
        "permission",
    ]
    assert card["id"] == card["root"] == MODEL and card["owned_by"] == "vllm"
    assert card["parent"] is None and card["max_model_len"] > 0
    assert card["permission"][0]["object"] == "model_permission"

    resp = await client.get("/health")
    assert resp.status == 200 and await resp.read() == b""

    await client.post(CHAT, json=chat_body())
    resp = await client.get("/metrics")
    assert resp.headers["Content-Type"].startswith("text/plain")
    text = await resp.text()
    assert f'vllm:request_success_total{{model_name="{MODEL}"}} 1.0' in text
    assert "vllm:generation_tokens_total" in text


# ---------------------------------------------------------------- determinism and text


async def test_seed_makes_runs_reproducible(aiohttp_client: Any) -> None:
    config = SimulatorConfig(
        ttft=0.002, tpot=0.0002, jitter=0.5, tokens=15, tokens_spread=0.5, seed=42
    )

    async def run(cfg: SimulatorConfig) -> list[Any]:
        client = await make_client(aiohttp_client, cfg)
        out = []
        for _ in range(3):
            data = await (await client.post(CHAT, json=chat_body())).json()
            data.pop("created")
            out.append(data)
        streamed = await post_stream(client, CHAT, chat_body(stream=True))
        out.append([c["choices"][0]["delta"] for c in streamed])
        return out

    first = await run(config)
    assert first == await run(config)
    other = await run(dataclasses.replace(config, seed=43))
    assert other != first


async def test_multibyte_utf8_in_long_stream(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    headers = {**EXACT, "x-sim-tokens": "300"}
    resp = await client.post(CHAT, json=chat_body(stream=True), headers=headers)
    raw = await resp.read()
    assert any(b >= 0x80 for b in raw)  # raw UTF-8 on the wire, not \u escapes
    assert b"\\u" not in raw
    text = "".join(deltas(chunks(sse_events(raw))))
    widths = {len(ch.encode()) for ch in text}
    assert {2, 3, 4} <= widths  # e.g. é, 日, 🚀


# ---------------------------------------------------------------- cancellation


async def wait_for(predicate: Any, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_client_disconnect_is_counted(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    headers = {"x-sim-ttft": "0.01", "x-sim-tpot": "0.01", "x-sim-tokens": "1000"}
    resp = await client.post(CHAT, json=chat_body(stream=True), headers=headers)
    await resp.content.readline()
    resp.close()
    stats = client.app[SIM_STATS]
    await wait_for(lambda: stats.cancelled == 1)
    assert stats.started == 1 and stats.completed == 0 and stats.in_flight == 0


async def test_client_disconnect_without_handler_cancellation() -> None:
    """Under a runner that does not cancel handlers, the next write (or poll) notices."""
    app = build_simulator_app(FAST)
    runner = web.AppRunner(app, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    stats = app[SIM_STATS]
    try:
        async with aiohttp.ClientSession() as session:
            for headers in (
                {"x-sim-ttft": "0", "x-sim-tpot": "0.01", "x-sim-tokens": "1000"},
                {"x-sim-ttft": "30", "x-sim-tokens": "5"},
            ):
                url = f"http://127.0.0.1:{port}{CHAT}"
                resp = await session.post(url, json=chat_body(stream=True), headers=headers)
                await asyncio.sleep(0.05)
                resp.close()
            await wait_for(lambda: stats.cancelled == 2)
        assert stats.completed == 0
    finally:
        await runner.cleanup()


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="ttft"):
        SimulatorConfig(ttft=-1)
    with pytest.raises(ValueError, match="fail_rate"):
        SimulatorConfig(fail_rate=1.5)
    with pytest.raises(ValueError, match="tokens"):
        SimulatorConfig(tokens=0)
