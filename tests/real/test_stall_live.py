"""A hung engine, for real: a real inference server on CPU, the sidecar in front of it (a
subprocess, ``python -m sidecar serve`` with ``--stall-seconds 3 --stall-probe-seconds 6``)
and Debian's Prometheus scraping the sidecar and evaluating the shipped rules every second.

Two long streams run; then the engine is stopped with SIGSTOP, in the two ways hangs look
from outside:

- vLLM 0.32 with only its engine core process stopped, as the hangs users report: the API
  process keeps answering ``/health`` 200 (asserted), the streams stay open, no token comes;
- llama.cpp's ``llama-server`` stopped whole (one process): its own ``/health`` stops
  answering (asserted), so its own probe would see this one, but nothing in the API says why.

Either way the sidecar must see it: its ``llm_streams_stalled`` goes up, the
LLMStreamsStalled alert's expression (rendered from deploy/slo/default.yaml) returns the pod
and the rule as shipped fires after its ``for`` in the real Prometheus, and the opt-in
``/stallz`` turns 503. After SIGCONT the streams finish whole, and all of it clears.

vLLM, llama.cpp and the tiny model come from ``scripts/install-vllm.sh`` and
``scripts/install-llamacpp.sh`` (``make test-real``) under ``.tools/``; missing, the test
skips locally and fails in CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.tools.slo import load_spec
from sidecar.tools.slo.stall import ALERT_STREAMS_STALLED, stall_group
from tests.real.servers import LLAMACPP, MODEL, VLLM, RealServer, ServerKind, start
from tests.support.live_stack import query, sidecar_and_prometheus, until
from tests.support.skips import IN_CI

pytestmark = [pytest.mark.real, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
STALL, PROBE = 3, 6
STREAMS = 2
NAMESPACE = "llm"


def engine_cores(server: RealServer) -> list[int]:
    """vLLM's engine core processes under its API process (``VLLM::EngineCore``)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            names[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(server.process.pid, []))
    while todo:
        pid = todo.pop()
        if "EngineCore" in names.get(pid, ""):
            out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def whole_server(server: RealServer) -> list[int]:
    return [server.process.pid]


@dataclass(frozen=True)
class Hang:
    """An engine and how it hangs: the processes stopped, and whether its own ``/health``
    still answers 200 meanwhile; ``max_tokens`` keeps both streams generating until the stop,
    within the server's context (vLLM's --max-model-len is 512 a stream; llama.cpp's -c 2048
    is shared by its slots)."""

    kind: ServerKind
    stopped: Callable[[RealServer], list[int]]
    health_answers: bool
    max_tokens: int


HANGS = {
    "vllm-engine-core-stopped": Hang(VLLM, engine_cores, health_answers=True, max_tokens=400),
    "llama.cpp-stopped-whole": Hang(LLAMACPP, whole_server, health_answers=False, max_tokens=900),
}


@pytest.fixture(scope="module", params=list(HANGS.values()), ids=list(HANGS))
def stack(request, tmp_path_factory):
    """(hang, the ready server, the live stack in front of it)."""
    hang: Hang = request.param
    why = hang.kind.missing()
    if why is not None:
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("stall")
    server = start(hang.kind, log_path=tmp / f"{hang.kind.name}.log")
    try:
        with sidecar_and_prometheus(
            server.url,
            tmp,
            "--stall-seconds", str(STALL), "--stall-probe-seconds", str(PROBE),
            labels={"namespace": NAMESPACE},
        ) as live:  # fmt: skip
            server.wait_ready()
            yield hang, server, live
    finally:
        server.stop()


async def _all_stopped(pids: list[int]) -> bool:
    """Every thread of every pid stopped (``T``): a signal takes effect a moment after
    ``kill`` returns, and a thread still running meanwhile can answer one more request."""
    states = [
        (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        for pid in pids
        for task in Path(f"/proc/{pid}/task").iterdir()
    ]
    return all(state == "T" for state in states)


async def _stalled(session: aiohttp.ClientSession, admin: str) -> dict[str, float]:
    """{phase: llm_streams_stalled} from the sidecar's /metrics."""
    async with session.get(f"{admin}/metrics") as r:
        text = await r.text()
    return {
        s.labels["phase"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "llm_streams_stalled"
        for s in f.samples
    }


async def _assert_health(session: aiohttp.ClientSession, server: RealServer, answers: bool):
    """The engine's own /health: 200 if ``answers``, else no answer at all within 3 s (the
    kernel still accepts the connection; the stopped process never reads it)."""
    if answers:
        async with session.get(f"{server.url}/health") as h:
            assert h.status == 200
        return
    with pytest.raises(TimeoutError):
        async with session.get(f"{server.url}/health", timeout=aiohttp.ClientTimeout(total=3)):
            pass


async def test_a_hung_engine_is_seen_alerted_and_probed_and_everything_clears(stack):
    hang, server, live = stack
    proxy, admin, prom = live.proxy_url, live.admin_url, live.prometheus_url
    pids = hang.stopped(server)
    assert pids, f"nothing to stop in {hang.kind.name}"
    (rule,) = stall_group(load_spec(str(ROOT / "deploy" / "slo" / "default.yaml"))).rules
    assert rule.for_ is not None
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": hang.max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        await _assert_health(s, server, answers=True)
        responses = [
            await s.post(f"{proxy}/v1/chat/completions", json=body) for _ in range(STREAMS)
        ]
        try:
            for r in responses:
                assert r.status == 200
                while b'"content"' not in await r.content.readline():
                    pass  # until a token
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                await until(lambda: _all_stopped(pids), 10, "SIGSTOP taking effect")
                await _assert_health(s, server, hang.health_answers)

                async def stalled_now() -> dict[str, float] | None:
                    got = await _stalled(s, admin)
                    return got if sum(got.values()) >= STREAMS else None  # both stopped

                stalled = await until(stalled_now, STALL + 15, "llm_streams_stalled")
                assert sum(stalled.values()) == STREAMS and set(stalled) == {"decode"}
                fired = await until(lambda: query(s, prom, rule.expr), 30, "the alert expression")
                assert fired[0]["metric"]["namespace"] == NAMESPACE
                assert float(fired[0]["value"][1]) >= 1

                async def probe_failing() -> dict | None:
                    async with s.get(f"{admin}/stallz") as p:
                        return await p.json() if p.status == 503 else None

                doc = await until(probe_failing, PROBE + 15, "/stallz 503")
                assert doc["stalled_engine"] is True and doc["in_flight"] == STREAMS
                # The rule as shipped (deploy/prometheus/), loaded by Prometheus: firing after
                # its `for`.
                firing = f'ALERTS{{alertname="{ALERT_STREAMS_STALLED}",alertstate="firing"}}'
                alerts = await until(
                    lambda: query(s, prom, firing), rule.for_ + 30, "the alert firing"
                )
                assert alerts[0]["metric"]["namespace"] == NAMESPACE
                await _assert_health(s, server, hang.health_answers)
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            for r in responses:  # the streams finish
                rest = await asyncio.wait_for(r.content.read(), 300)
                assert rest.rstrip().endswith(b"data: [DONE]"), rest[-200:]
        finally:
            for r in responses:
                r.release()

        async def cleared() -> bool:
            if any((await _stalled(s, admin)).values()):
                return False
            async with s.get(f"{admin}/stallz") as p:
                if p.status != 200 or (await p.json())["in_flight"]:
                    return False
            return not await query(s, prom, rule.expr)

        await until(cleared, 30, "everything cleared")
        await _assert_health(s, server, answers=True)
        async with s.get(f"{admin}/metrics") as r:  # both streams counted as whole answers
            page = await r.text()
        ok = [
            sample.value
            for f in text_string_to_metric_families(page)
            if f.name == "llm_requests"
            for sample in f.samples
            if sample.name == "llm_requests_total" and sample.labels.get("outcome") == "ok"
        ]
        assert sum(ok) == STREAMS, json.dumps(ok)
