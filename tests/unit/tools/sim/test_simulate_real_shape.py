"""The simulator's vLLM output has the SHAPE of real vLLM 0.32's: the same keys in the same
order, null where vLLM sends null, ``system_fingerprint`` and ``stop_reason`` where vLLM puts
them, with and without include_usage, chat and completions, streamed or not.

The reference is the recordings of a real vLLM 0.32.0 (default flags) in
tests/fixtures/real/vllm-0.32.0/ (scripts/record-real-streams.py). Each recorded request is
replayed against ``llm-sidecar simulate``'s app with the same body; values are masked to
their JSON type, and a stream's run of same-shaped token chunks is collapsed to one, since
the simulator and the tiny model choose different numbers of tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.real.wire import json_events
from tests.support.paths import ROOT

RECORDED = ROOT / "tests" / "fixtures" / "real" / "vllm-0.32.0"
CASES = sorted(
    p
    for p in RECORDED.glob("*")
    if p.suffix in (".sse", ".json") and not p.name.endswith(".meta.json")
)
EXACT = {"x-sim-ttft": "0", "x-sim-tpot": "0", "x-sim-tokens": "5"}


def shape(value: Any) -> Any:
    """A JSON value with every scalar replaced by its type; key order kept."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(v) for v in value]
    if value is None:
        return None
    return (
        type(value).__name__
        if not isinstance(value, int | float) or isinstance(value, bool)
        else "number"
    )


def collapsed(events: list[dict]) -> list:
    """Event shapes, with consecutive repeats (the token chunks) reduced to one."""
    out: list = []
    for event in events:
        s = shape(event)
        if not out or out[-1] != s:
            out.append(s)
    return out


def body_shape(body: bytes, streamed: bool) -> list:
    tail = [b"[DONE]"] if streamed and body.rstrip().endswith(b"data: [DONE]") else []
    return collapsed(json_events(body, streamed)) + tail


@pytest.mark.parametrize("recording", CASES, ids=lambda p: p.name)
async def test_simulator_answers_with_real_vllm_shape(aiohttp_client, recording: Path):
    meta = json.loads(recording.with_name(recording.stem + ".meta.json").read_text())
    request = dict(meta["request"]["body"])
    request["max_tokens"] = 5
    client = await aiohttp_client(build_simulator_app(SimulatorConfig(model=request["model"])))
    resp = await client.post(meta["request"]["path"], json=request, headers=EXACT)
    body = await resp.read()

    assert resp.status == meta["response"]["status"]
    real_type = {k.lower(): v for k, v in meta["response"]["headers"].items()}["content-type"]
    assert resp.headers["Content-Type"] == real_type
    streamed = recording.suffix == ".sse"
    assert body_shape(body, streamed) == body_shape(recording.read_bytes(), streamed)
    if resp.status != 200:  # the error's wording too: clients match on it
        assert json.loads(body) == json.loads(recording.read_bytes())


async def test_the_shape_comparison_sees_a_moved_field(aiohttp_client):
    """The check above is not vacuous: moving system_fingerprint changes the shape."""
    recorded = (RECORDED / "chat-stream.sse").read_bytes()
    moved = recorded.replace(b',"system_fingerprint":', b',"system_fingerprint_":')
    assert body_shape(moved, True) != body_shape(recorded, True)
    assert body_shape(recorded.replace(b'"token_ids":null', b'"token_ids":[]'), True) != body_shape(
        recorded, True
    )
