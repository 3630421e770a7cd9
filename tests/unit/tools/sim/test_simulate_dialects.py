"""The simulator's other dialects: wire shapes, what the sidecar's own parsers read from
them, timing, the engine's timings, failures and request validation.

Every stream is also fed to the sidecar's dialect for its route, so the simulator and the
parsers are checked against each other (the parsers are checked against the documented
fixtures in their own tests).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from sidecar.streams.protocols.anthropic import AnthropicStreamDialect, parse_anthropic_response
from sidecar.streams.protocols.events import (
    EngineTimings,
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    TokenKind,
    Tokens,
    Usage,
)
from sidecar.streams.protocols.llamacpp import LlamaCppStreamDialect, parse_llamacpp_response
from sidecar.streams.protocols.ollama import OllamaStreamDialect, parse_ollama_response
from sidecar.streams.protocols.responses import ResponsesStreamDialect, parse_responses_response
from sidecar.streams.protocols.tgi import TGIStreamDialect, parse_tgi_response
from sidecar.streams.protocols.triton import TritonStreamDialect, parse_triton_response
from sidecar.tools.sim.core import SIM_STATS, SimulatorConfig
from sidecar.tools.sim.dialects import ENGINE_LOAD_SHARE, ENGINE_PREFILL_SHARE
from sidecar.tools.sim.server import build_simulator_app

MODEL = "sim-model"
FAST = SimulatorConfig(
    ttft=0.005, tpot=0.001, jitter=0.0, tokens=8, tokens_spread=0.0, seed=7, model=MODEL
)
EXACT = {"x-sim-ttft": "0", "x-sim-tpot": "0"}
MESSAGES = [{"role": "user", "content": "Hello there!"}]


@dataclass(frozen=True)
class Dialect:
    name: str
    path: str
    body: dict[str, Any]  # a streaming request
    content_type: str
    parser: Callable[[], Any]  # the sidecar's stream dialect for the route
    whole_path: str
    whole_body: dict[str, Any]
    whole_parser: Callable[[bytes], list]
    reasoning: bool = False


DIALECTS = [
    Dialect("responses", "/v1/responses", {"model": MODEL, "input": "Hello there!", "stream": True},
            "text/event-stream; charset=utf-8", ResponsesStreamDialect,
            "/v1/responses", {"model": MODEL, "input": "Hello there!"}, parse_responses_response, True),
    Dialect("anthropic", "/v1/messages", {"model": MODEL, "max_tokens": 100, "messages": MESSAGES, "stream": True},
            "text/event-stream; charset=utf-8", AnthropicStreamDialect,
            "/v1/messages", {"model": MODEL, "max_tokens": 100, "messages": MESSAGES}, parse_anthropic_response, True),
    Dialect("tgi", "/generate_stream", {"inputs": "Hello there!", "parameters": {"details": True}},
            "text/event-stream", TGIStreamDialect,
            "/generate", {"inputs": "Hello there!", "parameters": {"details": True}}, parse_tgi_response),
    Dialect("ollama_chat", "/api/chat", {"model": MODEL, "messages": MESSAGES},
            "application/x-ndjson", OllamaStreamDialect,
            "/api/chat", {"model": MODEL, "messages": MESSAGES, "stream": False}, parse_ollama_response, True),
    Dialect("ollama_generate", "/api/generate", {"model": MODEL, "prompt": "Hello there!"},
            "application/x-ndjson", OllamaStreamDialect,
            "/api/generate", {"model": MODEL, "prompt": "Hello there!", "stream": False}, parse_ollama_response, True),
    Dialect("llamacpp", "/completion", {"prompt": "Hello there!", "stream": True},
            "text/event-stream", LlamaCppStreamDialect,
            "/completion", {"prompt": "Hello there!"}, parse_llamacpp_response),
    Dialect("triton", f"/v2/models/{MODEL}/generate_stream", {"text_input": "Hello there!", "max_tokens": 100},
            "text/event-stream; charset=utf-8", lambda: TritonStreamDialect(model=MODEL),
            f"/v2/models/{MODEL}/generate", {"text_input": "Hello there!"}, parse_triton_response),
]  # fmt: skip
BY_NAME = {d.name: d for d in DIALECTS}
ids = [d.name for d in DIALECTS]


@dataclass
class Seen:
    """What the sidecar's dialect read from a stream."""

    tokens: Counter
    usage: Usage | None
    engine: EngineTimings | None
    finish: list[str]
    ends: int
    errors: list[StreamError]
    parse_errors: int


def read(parser: Any, raw: bytes) -> Seen:
    events = parser.feed(raw) + parser.close()
    tokens: Counter = Counter()
    seen = Seen(tokens, None, None, [], 0, [], 0)
    for ev in events:
        if type(ev) is Tokens:
            tokens[ev.kind] += ev.count
        elif type(ev) is Usage:
            seen.usage = ev
        elif type(ev) is EngineTimings:
            seen.engine = ev
        elif type(ev) is ResponseInfo:
            seen.finish.extend(ev.finish_reasons)
        elif type(ev) is StreamEnd:
            seen.ends += 1
        elif type(ev) is StreamError:
            seen.errors.append(ev)
        elif type(ev) is ParseError:
            seen.parse_errors += 1
    return seen


async def make_client(aiohttp_client: Any, config: SimulatorConfig = FAST) -> Any:
    return await aiohttp_client(build_simulator_app(config))


async def post(
    client: Any, d: Dialect, headers: dict[str, str] | None = None, **extra: Any
) -> tuple[int, str, bytes]:
    resp = await client.post(d.path, json={**d.body, **extra}, headers=headers or {})
    return resp.status, resp.headers["Content-Type"], await resp.read()


def answer_count(d: Dialect, n: int) -> int:
    """Stream-counted answer tokens for ``n`` generated ones: TGI's closing </s> is special."""
    return n - 1 if d.name == "tgi" else n


# ---------------------------------------------------------------- every dialect


@pytest.mark.parametrize("d", DIALECTS, ids=ids)
async def test_stream_is_read_exactly_by_the_sidecar(aiohttp_client: Any, d: Dialect) -> None:
    client = await make_client(aiohttp_client)
    status, ctype, raw = await post(client, d, {**EXACT, "x-sim-tokens": "6"})
    assert status == 200 and ctype == d.content_type
    seen = read(d.parser(), raw)
    assert seen.parse_errors == 0 and not seen.errors
    assert seen.tokens == {TokenKind.ANSWER: answer_count(d, 6)}
    if d.name == "triton":  # no usage, no end marker in the protocol
        assert seen.usage is None and seen.ends == 0
    else:
        assert seen.usage is not None and seen.usage.output_tokens == 6
        assert seen.usage.input_tokens and seen.usage.input_tokens > 0
        assert seen.ends == 1
    stats = client.app[SIM_STATS]
    assert stats.started == stats.completed == 1 and stats.completion_tokens == 6
    assert stats.prompt_tokens > 0 and stats.in_flight == 0


@pytest.mark.parametrize("d", DIALECTS, ids=ids)
async def test_whole_body_matches_the_stream(aiohttp_client: Any, d: Dialect) -> None:
    """Same seed, same request: the whole body holds the text the stream spelled out."""
    a, b = await make_client(aiohttp_client), await make_client(aiohttp_client)
    headers = {**EXACT, "x-sim-tokens": "5"}
    _, _, streamed = await post(a, d, headers)
    resp = await b.post(d.whole_path, json=d.whole_body, headers=headers)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    body = await resp.read()
    events = d.whole_parser(body)
    assert not [e for e in events if type(e) in (ParseError, StreamError)]
    usages = [e for e in events if type(e) is Usage]
    if d.name == "triton":
        assert usages == []
    else:
        assert usages[-1].output_tokens == 5
    assert stream_text(d, streamed) == whole_text(d, orjson.loads(body))
    assert b.app[SIM_STATS].completed == 1 and b.app[SIM_STATS].completion_tokens == 5


def stream_objects(d: Dialect, raw: bytes) -> list[dict[str, Any]]:
    if d.content_type == "application/x-ndjson":
        return [orjson.loads(line) for line in raw.splitlines()]
    return [orjson.loads(m) for m in re.findall(rb"^data: ?(.*)$", raw, re.M)]


def stream_text(d: Dialect, raw: bytes) -> str:
    objs = stream_objects(d, raw)
    if d.name == "responses":
        return "".join(o["delta"] for o in objs if o["type"] == "response.output_text.delta")
    if d.name == "anthropic":
        return "".join(o["delta"]["text"] for o in objs if o["type"] == "content_block_delta")
    if d.name == "tgi":
        return "".join(o["token"]["text"] for o in objs if not o["token"]["special"])
    if d.name == "ollama_chat":
        return "".join(o["message"]["content"] for o in objs)
    if d.name == "ollama_generate":
        return "".join(o["response"] for o in objs)
    if d.name == "llamacpp":
        return "".join(o["content"] for o in objs)
    return "".join(o["text_output"] for o in objs)


def whole_text(d: Dialect, obj: dict[str, Any]) -> str:
    if d.name == "responses":
        return obj["output"][-1]["content"][0]["text"]
    if d.name == "anthropic":
        return obj["content"][-1]["text"]
    if d.name == "tgi":
        return obj["generated_text"]
    if d.name == "ollama_chat":
        return obj["message"]["content"]
    if d.name == "ollama_generate":
        return obj["response"]
    if d.name == "llamacpp":
        return obj["content"]
    return obj["text_output"]


@pytest.mark.parametrize("d", DIALECTS, ids=ids)
async def test_timing_follows_the_headers(aiohttp_client: Any, d: Dialect) -> None:
    slow = SimulatorConfig(ttft=5, tpot=1, jitter=0.5, tokens=99, model=MODEL)
    client = await make_client(aiohttp_client, slow)
    headers = {"x-sim-ttft": "0.04", "x-sim-tpot": "0.01", "x-sim-tokens": "6"}
    start = time.monotonic()
    resp = await client.post(d.path, json=d.body, headers=headers)
    arrivals = []
    parser = d.parser()
    async for chunk in resp.content.iter_any():
        now = time.monotonic() - start
        arrivals += [now for ev in parser.feed(chunk) if type(ev) is Tokens]
    n = answer_count(d, 6)
    assert len(arrivals) == n
    assert 0.035 <= arrivals[0] < 0.04 + 0.04
    last = 0.04 + (n - 1) * 0.01
    assert last - 0.005 <= arrivals[-1] < last + 0.05  # no drift accumulates


@pytest.mark.parametrize("d", DIALECTS, ids=ids)
async def test_in_stream_error_and_drop(aiohttp_client: Any, d: Dialect) -> None:
    client = await make_client(aiohttp_client)
    status, _, raw = await post(client, d, {**EXACT, "x-sim-tokens": "10", "x-sim-fail": "stream"})
    assert status == 200
    seen = read(d.parser(), raw)
    assert len(seen.errors) == 1 and seen.parse_errors == 0
    assert sum(seen.tokens.values()) == 5  # the error comes about halfway
    assert seen.usage is None or seen.usage.output_tokens is None
    stats = client.app[SIM_STATS]
    assert stats.stream_errors == 1 and stats.completed == 0 and stats.in_flight == 0

    resp = await client.post(
        d.path, json=d.body, headers={**EXACT, "x-sim-tokens": "10", "x-sim-fail": "drop"}
    )
    got = b""
    with pytest.raises(aiohttp.ClientPayloadError):  # the connection was cut
        async for data in resp.content.iter_any():
            got += data
    seen = read(d.parser(), got)
    assert sum(seen.tokens.values()) == 5 and seen.ends == 0
    assert seen.usage is None or seen.usage.output_tokens is None  # Anthropic: input usage only
    assert stats.dropped == 1


@pytest.mark.parametrize("d", DIALECTS, ids=ids)
async def test_http_500_in_the_dialects_error_shape(aiohttp_client: Any, d: Dialect) -> None:
    client = await make_client(aiohttp_client)
    for path, body in ((d.path, d.body), (d.whole_path, d.whole_body)):
        for fail in ("500", "stream"):  # a whole body cannot carry an in-stream error
            if fail == "stream" and path == d.path and body is d.body:
                continue
            resp = await client.post(path, json=body, headers={"x-sim-fail": fail})
            assert resp.status == 500
            assert resp.headers["Content-Type"].startswith("application/json")
            events = d.whole_parser(await resp.read())
            assert [type(e) for e in events] == [StreamError], events
            assert "Simulated engine failure" in events[0].message
    stats = client.app[SIM_STATS]
    assert stats.failed == 3 and stats.in_flight == 0


# ---------------------------------------------------------------- reasoning


@pytest.mark.parametrize(
    "d", [d for d in DIALECTS if d.reasoning], ids=[d.name for d in DIALECTS if d.reasoning]
)
async def test_reasoning_comes_first_and_is_counted(aiohttp_client: Any, d: Dialect) -> None:
    client = await make_client(aiohttp_client)
    _, _, raw = await post(client, d, {**EXACT, "x-sim-tokens": "4", "x-sim-reasoning": "3"})
    parser = d.parser()
    kinds = [ev.kind for ev in parser.feed(raw) + parser.close() if type(ev) is Tokens]
    assert kinds == [TokenKind.REASONING] * 3 + [TokenKind.ANSWER] * 4
    seen = read(d.parser(), raw)
    assert seen.usage.output_tokens == 7
    if d.name == "responses":
        assert seen.usage.reasoning_tokens == 3

    # from the config too
    config = SimulatorConfig(
        ttft=0, tpot=0, jitter=0, tokens=2, tokens_spread=0, reasoning_tokens=2, model=MODEL
    )
    client = await make_client(aiohttp_client, config)
    _, _, raw = await post(client, d)
    assert read(d.parser(), raw).tokens == {TokenKind.REASONING: 2, TokenKind.ANSWER: 2}


async def test_responses_stream_layout(aiohttp_client: Any) -> None:
    d = BY_NAME["responses"]
    client = await make_client(aiohttp_client)
    _, _, raw = await post(client, d, {**EXACT, "x-sim-tokens": "2", "x-sim-reasoning": "1"})
    blocks = raw.split(b"\n\n")
    assert blocks[-1] == b""
    types = []
    for i, block in enumerate(blocks[:-1]):
        event, data = block.split(b"\n")
        assert event.startswith(b"event: ") and data.startswith(b"data: ")
        obj = orjson.loads(data[6:])
        assert orjson.dumps(obj) == data[6:]  # compact
        assert list(obj)[0] == "type" and list(obj)[-1] == "sequence_number"
        assert obj["type"] == event[7:].decode() and obj["sequence_number"] == i
        types.append(obj["type"])
    assert types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    done = orjson.loads(blocks[-2].split(b"\n")[1][6:])["response"]
    assert done["status"] == "completed" and done["model"] == MODEL
    assert [item["type"] for item in done["output"]] == ["reasoning", "message"]
    assert done["usage"] == {"input_tokens": done["usage"]["input_tokens"], "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 1},
                             "total_tokens": done["usage"]["input_tokens"] + 3}  # fmt: skip

    # max_output_tokens reached: response.incomplete
    _, _, raw = await post(client, d, EXACT, max_output_tokens=3)
    seen = read(d.parser(), raw)
    assert seen.finish == ["max_output_tokens"] and seen.usage.output_tokens == 3


async def test_anthropic_stream_layout(aiohttp_client: Any) -> None:
    d = BY_NAME["anthropic"]
    client = await make_client(aiohttp_client)
    _, _, raw = await post(client, d, {**EXACT, "x-sim-tokens": "2", "x-sim-reasoning": "1"})
    names = re.findall(rb"^event: (\S+)$", raw, re.M)
    assert [n.decode() for n in names] == [
        "message_start", "content_block_start", "ping", "content_block_delta",
        "content_block_delta", "content_block_stop", "content_block_start",
        "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert b'event: ping\ndata: {"type": "ping"}\n\n' in raw  # spaced, as the API sends it
    objs = stream_objects(d, raw)
    assert objs[0]["message"]["usage"]["output_tokens"] == 1
    assert objs[4]["delta"]["type"] == "signature_delta"
    assert objs[-2] == {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                        "usage": {"output_tokens": 3}}  # fmt: skip

    _, _, raw = await post(client, d, EXACT, max_tokens=3)
    assert read(d.parser(), raw).finish == ["max_tokens"]

    resp = await client.post(
        "/v1/messages", json={**d.whole_body}, headers={"x-sim-tokens": "2", "x-sim-reasoning": "1"}
    )
    msg = await resp.json()
    assert [b["type"] for b in msg["content"]] == ["thinking", "text"]
    assert msg["content"][0]["signature"] and msg["stop_reason"] == "end_turn"


# ---------------------------------------------------------------- TGI


async def test_tgi_end_of_sequence_details_and_compat_route(aiohttp_client: Any) -> None:
    d = BY_NAME["tgi"]
    client = await make_client(aiohttp_client)
    _, _, raw = await post(client, d, {**EXACT, "x-sim-tokens": "3"})
    assert raw.startswith(b"data:{") and b"data: " not in raw  # axum: no space after data:
    objs = stream_objects(d, raw)
    assert [o["index"] for o in objs] == [1, 2, 3]
    assert objs[-1]["token"] == {"id": 2, "text": "</s>", "logprob": -0.06982422, "special": True}
    assert objs[-1]["generated_text"] == objs[0]["token"]["text"] + objs[1]["token"]["text"]
    assert objs[-1]["details"] == {"finish_reason": "eos_token", "generated_tokens": 3, "seed": None,
                                   "input_length": objs[-1]["details"]["input_length"]}  # fmt: skip
    assert all(o["generated_text"] is None and o["details"] is None for o in objs[:-1])

    # max_new_tokens reached: no </s>, finish "length"; without details, "details": null
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}
    raw = await (await client.post("/generate_stream", json=body, headers=EXACT)).read()
    objs = stream_objects(d, raw)
    assert [o["token"]["special"] for o in objs] == [False, False] and objs[-1]["details"] is None

    # TGI's "/" answers streams or, in a one-element list, whole bodies
    raw = await (await client.post("/", json={**d.body, "stream": True}, headers=EXACT)).read()
    assert read(TGIStreamDialect(), raw).usage.output_tokens == 8
    resp = await client.post(
        "/", json={"inputs": "Hi", "parameters": {"return_full_text": True}}, headers=EXACT
    )
    data = await resp.json()
    assert isinstance(data, list) and data[0]["generated_text"].startswith("Hi")
    assert parse_tgi_response(orjson.dumps(data)) == []  # no details were asked for


# ---------------------------------------------------------------- Ollama


@pytest.mark.parametrize("name", ["ollama_chat", "ollama_generate"])
async def test_ollama_final_line_and_engine_timings(aiohttp_client: Any, name: str) -> None:
    d = BY_NAME[name]
    client = await make_client(aiohttp_client)
    headers = {"x-sim-ttft": "0.02", "x-sim-tpot": "0.005", "x-sim-tokens": "5"}
    _, _, raw = await post(client, d, headers)
    assert raw.endswith(b"\n") and b"\r" not in raw
    objs = stream_objects(d, raw)
    final = objs[-1]
    assert [o["done"] for o in objs] == [False] * 5 + [True]
    keys = (
        ["model", "created_at", "message", "done_reason", "done"]
        if name == "ollama_chat"
        else ["model", "created_at", "response", "done", "done_reason", "context"]
    )
    assert list(final) == keys + ["total_duration", "load_duration", "prompt_eval_count",
                                  "prompt_eval_duration", "eval_count", "eval_duration"]  # fmt: skip
    assert final["done_reason"] == "stop" and final["eval_count"] == 5
    assert final["load_duration"] == round(0.02 * ENGINE_LOAD_SHARE * 1e9)
    assert final["prompt_eval_duration"] == round(0.02 * ENGINE_PREFILL_SHARE * 1e9)
    assert final["eval_duration"] == round(4 * 0.005 * 1e9)
    assert final["total_duration"] == round((0.02 + 4 * 0.005) * 1e9)
    assert all(
        re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z", o["created_at"]) for o in objs
    )
    engine = read(d.parser(), raw).engine
    assert engine == EngineTimings(0.02 * ENGINE_LOAD_SHARE, 0.02 * ENGINE_PREFILL_SHARE, 4 * 0.005)

    # num_predict reached: "length"; exact zero durations are left out (Go omitempty)
    _, _, raw = await post(client, d, EXACT, options={"num_predict": 3})
    final = stream_objects(d, raw)[-1]
    assert final["done_reason"] == "length" and final["eval_count"] == 3
    assert "load_duration" not in final and "eval_duration" not in final


async def test_ollama_escapes_like_go_and_echoes_the_model(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    body = {"model": f"{MODEL}:latest", "prompt": "a <b> & c", "stream": False}
    resp = await client.post("/api/generate", json=body, headers=EXACT)
    assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
    data = await resp.json()
    assert data["model"] == f"{MODEL}:latest"

    from sidecar.tools.sim.dialects import _go_json

    assert _go_json({"t": "<a & b>\u2028"}) == b'{"t":"\\u003ca \\u0026 b\\u003e\\u2028"}'


# ---------------------------------------------------------------- llama.cpp and Triton


async def test_llamacpp_final_timings(aiohttp_client: Any) -> None:
    d = BY_NAME["llamacpp"]
    client = await make_client(aiohttp_client)
    headers = {"x-sim-ttft": "0.02", "x-sim-tpot": "0.004", "x-sim-tokens": "4"}
    _, _, raw = await post(client, d, headers, n_predict=4)
    objs = stream_objects(d, raw)
    assert [o["stop"] for o in objs] == [False] * 4 + [True]
    assert [o["tokens_predicted"] for o in objs[:4]] == [1, 2, 3, 4]
    final = objs[-1]
    assert final["content"] == "" and final["stop_type"] == "limit" and final["model"] == MODEL
    timings = final["timings"]
    assert timings["prompt_ms"] == round(20 * ENGINE_PREFILL_SHARE, 3)
    assert timings["predicted_ms"] == pytest.approx(12.0) and timings["predicted_n"] == 4
    assert timings["prompt_n"] == final["tokens_evaluated"]
    seen = read(d.parser(), raw)
    assert seen.engine.prefill_seconds == pytest.approx(0.02 * ENGINE_PREFILL_SHARE)
    assert seen.engine.decode_seconds == pytest.approx(0.012)
    assert seen.finish == ["limit"]
    assert read(d.parser(), (await post(client, d, EXACT))[2]).finish == ["eos"]


async def test_triton_versions_and_events(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    path = f"/v2/models/{MODEL}/versions/3/generate_stream"
    raw = await (
        await client.post(path, json={"text_input": "Hi"}, headers={**EXACT, "x-sim-tokens": "3"})
    ).read()
    objs = stream_objects(BY_NAME["triton"], raw)
    assert [o["output_log_probs"] for o in objs] == [0.0, [0.0, 0.0], [0.0, 0.0, 0.0]]
    assert all(list(o) == sorted(o) and o["model_version"] == "3" for o in objs)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/responses", {"model": MODEL}, 400, b"input"),
        ("/v1/responses", {"model": "gpt-9", "input": "x"}, 404, b"gpt-9"),
        ("/v1/messages", {"model": MODEL, "messages": MESSAGES}, 400, b"max_tokens"),
        ("/v1/messages", {"model": "claude-9", "max_tokens": 5, "messages": MESSAGES}, 404, b"not_found_error"),
        ("/generate_stream", {"inputs": ""}, 422, b"validation"),
        ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 0}}, 422, b"max_new_tokens"),
        ("/api/chat", {"messages": MESSAGES}, 400, b"model is required"),
        ("/api/generate", {"model": "llama9", "prompt": "x"}, 404, b'model \\"llama9\\" not found'),
        ("/completion", {"n_predict": 3}, 400, b"prompt"),
        ("/v2/models/missing/generate_stream", {"text_input": "x"}, 400, b"unknown model: 'missing'"),
        ("/v2/models/sim-model/generate", {}, 400, b"text_input"),
    ],
)  # fmt: skip
async def test_bad_requests(
    aiohttp_client: Any, path: str, body: dict, status: int, needle: bytes
) -> None:
    client = await make_client(aiohttp_client)
    resp = await client.post(path, json=body)
    assert resp.status == status
    assert needle in await resp.read()
    assert client.app[SIM_STATS].started == 0
    resp = await client.post(path, data=b"{nope", headers={"Content-Type": "application/json"})
    assert resp.status == 400
    resp = await client.post(path, json=body, headers={"x-sim-fail": "maybe"})
    assert resp.status in (400, 404, 422)


# ---------------------------------------------------------------- determinism, vLLM, cancellation


async def test_seeded_runs_repeat_byte_for_byte_but_for_clocks(aiohttp_client: Any) -> None:
    config = SimulatorConfig(
        ttft=0.001, tpot=0.0002, jitter=0.5, tokens=6, tokens_spread=0.5, seed=11, model=MODEL
    )
    clocks = re.compile(rb'"(created_at|completed_at)":("[^"]*"|\d+)')

    async def run() -> list[bytes]:
        client = await make_client(aiohttp_client, config)
        return [clocks.sub(b"", (await post(client, d))[2]) for d in DIALECTS]

    assert await run() == await run()


async def test_vllm_routes_have_an_in_stream_error_too(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    resp = await client.post(
        "/v1/chat/completions",
        json=body,
        headers={**EXACT, "x-sim-tokens": "6", "x-sim-fail": "stream"},
    )
    raw = await resp.read()
    assert raw.endswith(
        b'data: {"error":{"message":"Simulated engine failure","type":"InternalServerError",'
        b'"param":null,"code":500}}\n\ndata: [DONE]\n\n'
    )
    assert raw.count(b'"content":"') == 1 + 3  # the role chunk, then half the tokens
    resp = await client.post(
        "/v1/chat/completions", json={**body, "stream": False}, headers={"x-sim-fail": "stream"}
    )
    assert resp.status == 500
    stats = client.app[SIM_STATS]
    assert stats.stream_errors == 1 and stats.failed == 1 and stats.in_flight == 0


async def test_client_disconnect_is_counted(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client)
    d = BY_NAME["anthropic"]
    resp = await client.post(
        d.path,
        json=d.body,
        headers={"x-sim-ttft": "0.01", "x-sim-tpot": "0.01", "x-sim-tokens": "1000"},
    )
    await resp.content.readline()
    resp.close()
    stats = client.app[SIM_STATS]
    deadline = time.monotonic() + 2
    while stats.cancelled != 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    assert stats.completed == 0 and stats.in_flight == 0
