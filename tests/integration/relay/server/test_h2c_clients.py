"""Real clients that offer an upgrade to h2c on plain http://, through the sidecar to the
simulated server's chat route: `curl --http2` and Java's built-in ``HttpClient`` with its
defaults (HTTP/2 preferred: every request on a new connection carries ``Connection: Upgrade,
HTTP2-Settings`` and its body). Each gets the answer it gets from the server directly, in
about the same time: the offer is dropped as hop-by-hop and the request relayed with its
body (tests/real/test_h2c_clients_live.py does the same against real servers)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from tests.support.rig import CHAT

pytestmark = pytest.mark.integration

JAVA_CLIENT = Path(__file__).resolve().parents[3] / "support" / "java" / "DefaultClient.java"
MODEL = "sim-llama-3-8b"  # the simulator's own
# A streamed chat the simulator answers in ~0.3 s (20 tokens), the same on every run.
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True})
SLOWER_BY_AT_MOST = 1.0  # seconds: a relay adds milliseconds; the read timeout would add 60 s


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (make system-deps installs it)")
    return path


async def run(*argv: str, timeout: float = 90.0) -> tuple[str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")
    return out.decode(), time.monotonic() - started


async def curl_h2c(url: str) -> tuple[str, float]:
    """`curl --http2` on http:// offers h2c with the POST; the answer's body and status."""
    return await run(
        need("curl"),
        "--http2",
        "-sS",
        "--max-time",
        "60",
        "-H",
        "Content-Type: application/json",
        "-H",
        "x-sim-ttft: 0.1",
        "-H",
        "x-sim-tpot: 0.01",
        "--data",
        BODY,
        "-w",
        "\n%{http_code}",
        url + CHAT,
    )


async def test_curl_http2_gets_through_the_sidecar_what_it_gets_direct(rig_factory):
    rig = await rig_factory()
    direct, direct_took = await curl_h2c(f"http://127.0.0.1:{rig.sim_port}")
    via, via_took = await curl_h2c(rig.url)
    assert direct.endswith("\n200") and via.endswith("\n200"), (direct[-200:], via[-200:])
    assert "data: [DONE]" in direct and "data: [DONE]" in via
    assert via.count("data: ") == direct.count("data: ")
    assert via_took < direct_took + SLOWER_BY_AT_MOST, (via_took, direct_took)
    assert rig.sample("llm_requests_total", code="200", outcome="ok", model=MODEL, route=CHAT) == 1


async def test_javas_default_http_client_gets_through_the_sidecar_what_it_gets_direct(
    rig_factory,
):
    """JDK 17's ``HttpClient.newHttpClient()``: before the sidecar relayed an upgrade offer's
    body, every such request waited for the read timeout and got 504."""
    java = need("java")
    rig = await rig_factory()
    answers = {}
    for name, base in (("direct", f"http://127.0.0.1:{rig.sim_port}"), ("via", rig.url)):
        out, _ = await run(java, str(JAVA_CLIENT), base + CHAT, BODY, "3")
        lines = out.splitlines()
        answers[name] = ([line.split() for line in lines[:3]], "\n".join(lines[3:]))
    for name in ("direct", "via"):
        statuses = [(status, version) for status, version, _, _ in answers[name][0]]
        assert statuses == [("200", "HTTP_1_1")] * 3, (name, answers[name][0])
        assert "data: [DONE]" in answers[name][1]
    direct_ms = sum(int(ms) for _, _, ms, _ in answers["direct"][0][1:])  # the JIT's first aside
    via_ms = sum(int(ms) for _, _, ms, _ in answers["via"][0][1:])
    assert via_ms < direct_ms + 2 * SLOWER_BY_AT_MOST * 1000, (via_ms, direct_ms)
    assert rig.sample("llm_requests_total", code="200", outcome="ok", model=MODEL, route=CHAT) == 3
