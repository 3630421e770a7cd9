"""The simulator as a newcomer meets it: one line at start, honest ``--help`` (defaults,
the ``x-sim-*`` headers), ``--tokens-spread 0`` meaning exactly ``--tokens``, and a body
cap above the sidecar's own so the sidecar's limits can be tried through it."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from sidecar.cli import _build_parser
from sidecar.config import Settings
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app

MODEL = "sim-llama-3-8b"


def _simulate_help() -> str:
    parser = _build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["simulate"].format_help()


def test_simulate_help_shows_defaults_and_the_per_request_headers():
    text = _simulate_help()
    assert "(default: 64)" in text and "(default: 0.5)" in text and "(default: 0.2)" in text
    assert "--tokens-spread" in text and "--max-body-bytes" in text
    for header in (
        "x-sim-ttft",
        "x-sim-tpot",
        "x-sim-tokens",
        "x-sim-reasoning",
        "x-sim-fail",
        "x-sim-line-bytes",
        "x-sim-tool-calls",
        "x-sim-cached-tokens",
    ):
        assert f"\n  {header}:" in text  # the epilog table kept one header per line


def test_simulate_prints_one_line_at_start_with_address_model_and_timing():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sidecar",
            "simulate",
            "--listen",
            "127.0.0.1:0",
            "--ttft",
            "0.3",
            "--tokens",
            "7",
            "--tokens-spread",
            "0",
            "--model",
            "m-x",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        port = int(
            re.search(r"http://127\.0\.0\.1:(\d+)", line)[1]
        )  # port 0: the one the kernel picked
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert port != 0 and "'m-x'" in line
    assert "ttft 0.3s" in line and "7 tokens (exactly)" in line
    assert out == "" and err == ""  # one line, nothing after it (a clean SIGTERM)


def test_spread_flag_reaches_the_config():
    args = _build_parser().parse_args(
        ["simulate", "--tokens-spread", "0", "--max-body-bytes", "1000"]
    )
    assert args.tokens_spread == 0.0 and args.max_body_bytes == 1000


async def test_zero_spread_and_zero_jitter_give_exactly_tokens(aiohttp_client: Any):
    config = SimulatorConfig(ttft=0.001, tpot=0.0, tokens=9, tokens_spread=0.0, jitter=0.0, seed=1)
    client = await aiohttp_client(build_simulator_app(config))
    counts = set()
    for _ in range(20):
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        counts.add((await resp.json())["usage"]["completion_tokens"])
    assert counts == {9}


def test_the_default_body_cap_is_above_the_sidecar_default():
    assert (
        SimulatorConfig().max_body_bytes > Settings.model_fields["max_request_body_bytes"].default
    )


@pytest.mark.parametrize(("cap", "status"), [(None, 200), (1 << 20, 413)])
async def test_a_body_over_one_mib_reaches_the_handler_unless_capped(
    aiohttp_client: Any, cap, status
):
    config = SimulatorConfig(ttft=0.001, tpot=0.0, tokens=1, tokens_spread=0.0, jitter=0.0)
    if cap is not None:
        config = SimulatorConfig(
            ttft=0.001, tpot=0.0, tokens=1, tokens_spread=0.0, jitter=0.0, max_body_bytes=cap
        )
    client = await aiohttp_client(build_simulator_app(config))
    big = "a" * (2 << 20)
    resp = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": big}]},
    )
    assert resp.status == status, (await resp.text())[:200]


def test_max_body_bytes_must_be_positive():
    with pytest.raises(ValueError, match="max_body_bytes"):
        SimulatorConfig(max_body_bytes=0)
