"""Per-request objectives over real sockets: a client sends a mix of streamed requests, some
with ``x-slo-ttft-ms`` / ``x-slo-tpot-ms`` and some without, fast and slow (the simulator's
per-request ``x-sim-ttft`` / ``x-sim-tpot`` delays), and a few with absurd values. The
sidecar's met/missed counts must equal what the client measured itself against the same
objectives (its own TTFT and TPOT, the header's value or the sidecar's default), the bad
values must be counted and ignored, and the simulator must receive every request's bytes and
objective headers exactly as the client sent them."""

from __future__ import annotations

import re
import time

import aiohttp
import orjson
import pytest
from aiohttp import web

from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.support.in_process import start_app
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ROUTE = "/v1/chat/completions"
MODEL = "sim-model"
# Defaults: TTFT from --slo-ttft-seconds; TPOT from the model's own objective
# (--slo-model-objectives), which replaces a far stricter --slo-tpot-seconds.
DEFAULT_TTFT, GLOBAL_TPOT, MODEL_TPOT = 2.0, 0.025, 0.1
TOKENS = 6

# (model, sim ttft, sim tpot, objective headers): objectives sit far from the delays (x3 or
# more), so the client's view and the sidecar's (a hop earlier) cannot disagree by timing.
CASES = [
    (MODEL, 0.02, 0.005, {"x-slo-ttft-ms": "300", "x-slo-tpot-ms": "50"}),  # both met
    (MODEL, 0.6, 0.005, {"x-slo-ttft-ms": "150"}),  # ttft missed; tpot by default, met
    (MODEL, 0.02, 0.06, {"x-slo-tpot-ms": "15"}),  # tpot missed
    (MODEL, 0.9, 0.3, {"x-slo-ttft-ms": "200", "x-slo-tpot-ms": "40"}),  # both missed
    (MODEL, 0.02, 0.005, {}),  # defaults: met
    (MODEL, 0.02, 0.4, {}),  # defaults: tpot missed (0.4 > 0.1)
    (
        MODEL,
        0.02,
        0.03,
        {},
    ),  # the model's tpot objective (0.1): met; the global one (0.025) would miss
    (MODEL, 0.02, 0.005, {"x-slo-ttft-ms": "abc"}),  # ignored and counted: default, met
    (
        MODEL,
        0.6,
        0.005,
        {"x-slo-ttft-ms": "0", "x-slo-tpot-ms": "1e3"},
    ),  # both ignored: default 2 s, met
    (MODEL, 0.02, 0.005, {"x-slo-ttft-ms": "-40"}),  # ignored
    (MODEL, 0.3, 0.005, {"x-slo-ttft-ms": "90000000"}),  # more than a day: ignored
    # llm-d's spelling, alone and beside the first one (which it beats)
    (MODEL, 0.6, 0.005, {"x-llm-d-slo-ttft-ms": "150"}),  # ttft missed
    (MODEL, 0.02, 0.06, {"x-llm-d-slo-tpot-ms": "15"}),  # tpot missed
    (MODEL, 0.3, 0.005, {"x-llm-d-slo-ttft-ms": "900", "x-slo-ttft-ms": "100"}),  # met
    (MODEL, 0.02, 0.06, {"x-llm-d-slo-tpot-ms": "15", "x-slo-tpot-ms": "500"}),  # missed
    # Padding other than space and tab is not HTTP's whitespace: the value is invalid, and
    # the default (2 s) judges, where a 5 ms objective would be missed
    (MODEL, 0.3, 0.005, {"x-slo-ttft-ms": "\u00a05"}),  # NBSP
    (MODEL, 0.3, 0.005, {"x-llm-d-slo-ttft-ms": "\u30005"}),  # ideographic space
    (MODEL, 0.3, 0.005, {"x-slo-ttft-ms": "\u00855"}),  # NEL
    (MODEL, 0.02, 0.005, {"x-slo-ttft-ms": " \t300\t "}),  # HTTP's whitespace: 300 ms, met
]


def objective(headers: dict[str, str], name: str, model: str) -> float:
    """The objective the client holds the answer to: its header when sane, else the default."""
    raw = headers.get(f"x-llm-d-slo-{name}-ms", headers.get(f"x-slo-{name}-ms"))
    if raw is not None:
        raw = raw.strip(" \t")
        if re.fullmatch("[0-9]+", raw) and 0 < int(raw) <= 86_400_000:
            return int(raw) / 1000
    return DEFAULT_TTFT if name == "ttft" else MODEL_TPOT


async def measure(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[float, float]:
    """The client's own TTFT and TPOT: the first and last content chunk it read."""
    began = time.perf_counter()
    times: list[float] = []
    async with session.post(
        url, data=body, headers={"Content-Type": "application/json", **headers}
    ) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {"):
                obj = orjson.loads(line[6:])
                if any(c.get("delta", {}).get("content") for c in obj.get("choices", [])):
                    times.append(time.perf_counter())
    assert len(times) == TOKENS
    return times[0] - began, (times[-1] - times[0]) / (len(times) - 1)


async def test_met_and_missed_counts_equal_what_the_client_measured(sidecar_factory):
    received: list[tuple[bytes, dict[str, str]]] = []

    @web.middleware
    async def tap(request: web.Request, handler):
        body = await request.read()
        received.append(
            (
                body,
                {
                    k.lower(): v
                    for k, v in request.headers.items()
                    if k.lower().startswith(("x-slo-", "x-llm-d-slo-"))
                },
            )
        )
        return await handler(request)

    sim = build_simulator_app(SimulatorConfig(model=MODEL, jitter=0.0, seed=5))
    sim.middlewares.append(tap)
    runner, port = await start_app(sim, handler_cancellation=True)
    try:
        s = await sidecar_factory(
            f"http://127.0.0.1:{port}",
            slo_ttft_seconds=DEFAULT_TTFT,
            slo_tpot_seconds=GLOBAL_TPOT,
            slo_model_objectives={MODEL: {"tpot_seconds": MODEL_TPOT}},
            model_allowlist=[MODEL],
        )
        want: dict[tuple[str, str, str], int] = {}
        sent: list[tuple[bytes, dict[str, str]]] = []
        async with aiohttp.ClientSession() as session:
            for i, (model, sim_ttft, sim_tpot, slo) in enumerate(CASES):
                body = orjson.dumps(
                    {
                        "model": model,
                        "stream": True,
                        "messages": [{"role": "user", "content": f"case {i}"}],
                    }
                )
                delays = {
                    "x-sim-ttft": str(sim_ttft),
                    "x-sim-tpot": str(sim_tpot),
                    "x-sim-tokens": str(TOKENS),
                }
                ttft, tpot = await measure(session, s.url + ROUTE, body, {**delays, **slo})
                # A field value's leading and trailing space and tab are not part of it
                # (RFC 9110, 5.5): every HTTP parser drops them.
                sent.append((body, {k: v.strip(" \t") for k, v in slo.items()}))
                met_ttft = ttft <= objective(slo, "ttft", model)
                met_tpot = tpot <= objective(slo, "tpot", model)
                for name, met in (
                    ("ttft", met_ttft),
                    ("tpot", met_tpot),
                    ("all", met_ttft and met_tpot),
                ):
                    key = (model, name, "met" if met else "missed")
                    want[key] = want.get(key, 0) + 1

        def got() -> dict[tuple[str, str, str], int]:
            out = {}
            for family in s.registry.collect():
                if family.name == "llm_request_objectives":
                    for sample in family.samples:
                        if sample.name == "llm_request_objectives_total" and sample.value:
                            labels = sample.labels
                            out[(labels["model"], labels["objective"], labels["result"])] = int(
                                sample.value
                            )
            return out

        await wait_for(lambda: sum(v for (_, o, _), v in got().items() if o == "all") == len(CASES))
        assert got() == want
        # Every case lands on both sides of the line somewhere: the comparison proves something.
        assert {r for (_, _, r) in want} == {"met", "missed"}

        invalid = {
            name: s.sample("llm_request_objective_invalid_total", route=ROUTE, objective=name)
            for name in ("ttft", "tpot")
        }
        assert invalid == {"ttft": 7, "tpot": 1}
        # The server got each request as sent: body bytes and objective headers, bad ones too.
        assert received == sent
    finally:
        await runner.cleanup()
