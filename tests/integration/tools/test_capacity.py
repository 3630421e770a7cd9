"""The throughput-latency curve end to end: the batching simulator behind a real
sidecar, closed-loop load at 1, 2, 4 and 8 streams. The simulator's model is the truth:
per band, the mean gap within 20 % of tpot(n), tokens/s within 25 % of n / tpot(n), and the
by-concurrency counts add up to the plain ITL histogram's count."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from sidecar.measure.concurrency import BANDS, band
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.support.in_process import start_app
from tests.support.waits import wait_for

ROUTE = "/v1/chat/completions"
SIM = SimulatorConfig(
    model="m", ttft=0.01, tpot=0.02, jitter=0, tokens=30, tokens_spread=0, batch_alpha=0.25, seed=3
)
REQUESTS_PER_STREAM = 3


async def closed_loop(session: aiohttp.ClientSession, url: str, streams: int) -> None:
    async def worker() -> None:
        for _ in range(REQUESTS_PER_STREAM):
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(url + ROUTE, json=body) as resp:
                assert resp.status == 200
                await resp.read()

    await asyncio.gather(*(worker() for _ in range(streams)))


def by_band(sc, name: str) -> dict[str, float]:
    return {b: sc.sample(name, model="m", concurrency=b) or 0.0 for b in BANDS}


async def test_per_band_latency_and_throughput_follow_the_simulators_batching_model(
    sidecar_factory,
):
    runner, port = await start_app(build_simulator_app(SIM), handler_cancellation=True)
    try:
        sc = await sidecar_factory(f"http://127.0.0.1:{port}")
        done = 0
        async with aiohttp.ClientSession() as session:
            for n in (1, 2, 4, 8):
                before = {
                    k: by_band(sc, k)
                    for k in (
                        "llm_inter_token_latency_by_concurrency_seconds_count",
                        "llm_inter_token_latency_by_concurrency_seconds_sum",
                        "llm_decode_seconds_by_concurrency_total",
                    )
                }
                await closed_loop(session, sc.url, n)
                done += n * REQUESTS_PER_STREAM
                await wait_for(
                    lambda done=done: (
                        sc.sample(
                            "llm_requests_total", model="m", route=ROUTE, code="200", outcome="ok"
                        )
                        == done
                    )
                )
                b = band(n)
                delta = {k: by_band(sc, k)[b] - v[b] for k, v in before.items()}
                expected_gap = SIM.tpot * SIM.batch_factor(n)
                mean_gap = (
                    delta["llm_inter_token_latency_by_concurrency_seconds_sum"]
                    / delta["llm_inter_token_latency_by_concurrency_seconds_count"]
                )
                assert mean_gap == pytest.approx(expected_gap, rel=0.2), (n, mean_gap, expected_gap)
                throughput = (  # decode tokens: one gap per token after a stream's first
                    delta["llm_inter_token_latency_by_concurrency_seconds_count"]
                    / delta["llm_decode_seconds_by_concurrency_total"]
                )
                assert throughput == pytest.approx(n / expected_gap, rel=0.25), (n, throughput)
        plain = sc.sample("llm_inter_token_latency_seconds_count", model="m")
        total = sum(by_band(sc, "llm_inter_token_latency_by_concurrency_seconds_count").values())
        assert plain == total == done * (SIM.tokens - 1)
    finally:
        await runner.cleanup()


def test_batching_model_linear_and_knee():
    linear = SimulatorConfig(tpot=0.02, batch_alpha=0.25)
    assert [linear.batch_factor(n) for n in (1, 2, 4)] == [1.0, 1.25, 1.75]
    knee = SimulatorConfig(tpot=0.02, batch_alpha=0.25, batch_knee=4, batch_knee_factor=4.0)
    assert knee.batch_factor(4) == 1.75 and knee.batch_factor(6) == 1.75 + 0.25 * 8
    assert SimulatorConfig().batch_factor(64) == 1.0  # off by default: the old simulator
    with pytest.raises(ValueError):
        SimulatorConfig(batch_alpha=-1)
