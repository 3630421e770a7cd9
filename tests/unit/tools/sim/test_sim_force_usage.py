"""``llm-sidecar simulate --enable-force-include-usage``: what real vLLM 0.32 sends with that
flag, recorded in tests/fixtures/real/vllm-0.32.0-force-include-usage/, whatever the client
asked: the running usage on every chunk, the usage chunk at the end. Shapes are compared as
in test_simulate_real_shape.py (keys, order, nulls; a run of token chunks collapsed to one);
the counts are checked by value, since the shape comparison masks them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import _build_parser
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.real.wire import json_events
from tests.support.paths import ROOT
from tests.unit.tools.sim.test_simulate_real_shape import EXACT, body_shape

REAL = ROOT / "tests" / "fixtures" / "real"
FORCED = REAL / "vllm-0.32.0-force-include-usage"
CASES = sorted(
    p
    for p in FORCED.glob("*")
    if p.suffix in (".sse", ".json") and not p.name.endswith(".meta.json")
)
MODEL = "sim-llama-3-8b"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _meta(recording: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(
        recording.with_name(recording.stem + ".meta.json").read_text()
    )
    return meta


def test_the_recordings_are_of_the_flag_and_cover_streams_without_usage_asked():
    assert {tuple(_meta(p)["server"]["flags"]) for p in CASES} == {
        ("--enable-force-include-usage",)
    }
    asked = {p.name: "stream_options" in _meta(p)["request"]["body"] for p in CASES}
    assert asked["chat-stream.sse"] is False and asked["completions-stream.sse"] is False


@pytest.mark.parametrize("recording", CASES, ids=lambda p: p.name)
async def test_forced_usage_has_the_recorded_shape(aiohttp_client, recording: Path):
    meta = _meta(recording)
    request = dict(meta["request"]["body"])
    request["max_tokens"] = 5
    config = SimulatorConfig(model=request["model"], force_include_usage=True)
    client = await aiohttp_client(build_simulator_app(config))
    resp = await client.post(meta["request"]["path"], json=request, headers=EXACT)
    body = await resp.read()
    assert resp.status == meta["response"]["status"]
    streamed = recording.suffix == ".sse"
    assert body_shape(body, streamed) == body_shape(recording.read_bytes(), streamed)


async def test_the_shape_differs_without_the_switch(aiohttp_client):
    """The comparison above sees the switch: the default simulator has no per-chunk usage
    and no usage chunk for a client that did not ask, unlike the recording."""
    meta = _meta(FORCED / "chat-stream.sse")
    request = dict(meta["request"]["body"], max_tokens=5)
    client = await aiohttp_client(build_simulator_app(SimulatorConfig(model=request["model"])))
    body = await (await client.post(CHAT, json=request, headers=EXACT)).read()
    assert body_shape(body, True) != body_shape((FORCED / "chat-stream.sse").read_bytes(), True)
    assert b'"usage"' not in body


async def _stream(client: Any, path: str, body: dict[str, Any], tokens: int) -> list[dict]:
    headers = {**EXACT, "x-sim-tokens": str(tokens)}
    resp = await client.post(path, json=body, headers=headers)
    assert resp.status == 200
    raw = await resp.read()
    assert raw.endswith(b"data: [DONE]\n\n")
    return json_events(raw, True)


@pytest.fixture
async def forced(aiohttp_client):
    return await aiohttp_client(
        build_simulator_app(SimulatorConfig(model=MODEL, force_include_usage=True))
    )


@pytest.mark.parametrize(
    "options",
    [None, {"include_usage": False}, {"include_usage": True}],
    ids=["not-asked", "refused", "asked"],
)
async def test_chat_counts_run_up_on_every_chunk_and_end_in_the_usage_chunk(forced, options):
    body: dict[str, Any] = {
        "model": MODEL,
        "stream": True,
        "messages": [{"role": "user", "content": "hello there"}],
    }
    if options is not None:
        body["stream_options"] = options
    events = await _stream(forced, CHAT, body, tokens=4)
    *chunks, last = events
    prompt = last["usage"]["prompt_tokens"]
    assert prompt > 0
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": prompt,
        "total_tokens": prompt + 4,
        "completion_tokens": 4,
    }
    assert [c["usage"]["completion_tokens"] for c in chunks] == [0, 1, 2, 3, 4]  # role first
    for c in chunks:
        assert c["usage"] == {
            "prompt_tokens": prompt,
            "total_tokens": prompt + c["usage"]["completion_tokens"],
            "completion_tokens": c["usage"]["completion_tokens"],
            "completion_tokens_details": None,
        }
    # the fingerprint rides on the usage chunk, as when the client asks for usage
    assert "system_fingerprint" in last and "system_fingerprint" not in chunks[-1]


async def test_completions_running_usage_has_no_details(forced):
    body = {"model": MODEL, "stream": True, "prompt": "count to three"}
    *chunks, last = await _stream(forced, COMPLETIONS, body, tokens=3)
    assert [c["usage"] for c in chunks] == [
        {"prompt_tokens": last["usage"]["prompt_tokens"], "total_tokens": last["usage"]["prompt_tokens"] + k, "completion_tokens": k}
        for k in (1, 2, 3)
    ]  # fmt: skip
    assert last["usage"]["completion_tokens"] == 3


async def test_each_choice_counts_its_own_tokens_and_the_usage_chunk_sums_them(forced):
    body = {"model": MODEL, "stream": True, "n": 2, "messages": [{"role": "user", "content": "x"}]}
    *chunks, last = await _stream(forced, CHAT, body, tokens=3)
    for i in (0, 1):
        mine = [c["usage"]["completion_tokens"] for c in chunks if c["choices"][0]["index"] == i]
        assert mine == [0, 1, 2, 3]
    assert last["usage"]["completion_tokens"] == 6


async def test_tool_call_chunks_carry_the_running_usage_too(forced):
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    resp = await forced.post(
        CHAT, json=body, headers={**EXACT, "x-sim-tokens": "4", "x-sim-tool-calls": "1"}
    )
    *chunks, last = json_events(await resp.read(), True)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 4
    assert any("tool_calls" in c["choices"][0]["delta"] for c in chunks)
    assert last["usage"]["completion_tokens"] == 4


async def test_non_streamed_bodies_are_unchanged_by_the_switch(aiohttp_client):
    """vLLM's non-streamed body always has usage; the recordings with and without the flag
    have the same shape, and so does the simulator's answer."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    shapes = []
    for force in (False, True):
        client = await aiohttp_client(
            build_simulator_app(SimulatorConfig(model=MODEL, force_include_usage=force))
        )
        resp = await client.post(CHAT, json=body, headers={**EXACT, "x-sim-tokens": "3"})
        shapes.append(body_shape(await resp.read(), False))
    assert shapes[0] == shapes[1]
    assert body_shape((REAL / "vllm-0.32.0" / "chat.json").read_bytes(), False) == body_shape(
        (FORCED / "chat.json").read_bytes(), False
    )


async def test_stream_options_without_stream_is_still_refused(forced):
    body = {"model": MODEL, "stream_options": {"include_usage": True}, "messages": []}
    resp = await forced.post(CHAT, json=body)
    assert resp.status == 400


def test_the_flag_is_named_after_vllms_and_reaches_the_config():
    sim = next(a for a in _build_parser()._actions if a.dest == "command").choices["simulate"]
    assert "--enable-force-include-usage" in sim.format_help()
    assert sim.parse_args([]).enable_force_include_usage is False
    assert sim.parse_args(["--enable-force-include-usage"]).enable_force_include_usage is True
    line = SimulatorConfig(force_include_usage=True).describe("127.0.0.1", 8000)
    assert line.endswith(", force-include-usage")
    assert "force-include-usage" not in SimulatorConfig().describe("127.0.0.1", 8000)
