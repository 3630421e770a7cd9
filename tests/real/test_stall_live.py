"""A hung engine, for real: a real vLLM 0.32 on CPU, the sidecar in front of it (a subprocess,
``python -m sidecar serve`` with ``--stall-seconds 3 --stall-probe-seconds 6``) and Debian's
Prometheus scraping the sidecar every second.

Two long streams run; then vLLM's engine core process is stopped with SIGSTOP, which is how
the hangs users report look from outside: the API process keeps answering ``/health`` 200
(asserted), the streams stay open and no token comes. The sidecar must see it: its
``llm_streams_stalled`` goes up, the LLMStreamsStalled alert's expression (rendered from
deploy/slo/default.yaml) returns the pod in the real Prometheus, and the opt-in ``/stallz``
turns 503. After SIGCONT the streams finish, and all of it clears.

vLLM and the tiny model come from ``scripts/install-vllm.sh`` (``make test-real``) under
``.tools/``; missing, the test skips locally and fails in CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sidecar.tools.slo import load_spec
from sidecar.tools.slo.stall import stall_group
from tests.support.ports import free_port
from tests.support.processes import stop_process
from tests.support.skips import IN_CI
from tests.support.tools import require_tool

pytestmark = [pytest.mark.real, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("TOOLS_DIR", ROOT / ".tools"))
if not TOOLS.is_absolute():
    TOOLS = ROOT / TOOLS
VLLM_PYTHON = TOOLS / "vllm-venv" / "bin" / "python"
HF_MODEL = TOOLS / "models" / "tiny-llama"
READY_TIMEOUT = float(os.environ.get("REAL_SERVER_READY_TIMEOUT", "600"))
MODEL = "tiny"
STALL, PROBE = 3, 6
STREAMS = 2


def _missing() -> str | None:
    if not VLLM_PYTHON.exists():
        return f"vLLM is not installed ({VLLM_PYTHON}; run scripts/install-vllm.sh)"
    if not (HF_MODEL / "config.json").exists():
        return f"the tiny model is missing ({HF_MODEL}; run scripts/install-vllm.sh)"
    return None


def _wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"{url}: exited {proc.returncode}\n{log.read_text(errors='replace')[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(
        f"{url} not ready in {timeout} s\n{log.read_text(errors='replace')[-3000:]}"
    )


def engine_cores(api_pid: int) -> list[int]:
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
    out, todo = [], list(children.get(api_pid, []))
    while todo:
        pid = todo.pop()
        if "EngineCore" in names.get(pid, ""):
            out.append(pid)
        todo.extend(children.get(pid, []))
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(proxy URL, admin URL, vLLM URL, Prometheus URL, vLLM process)."""
    why = _missing()
    if why is not None:
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)
    prometheus = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("stall")
    procs: list[subprocess.Popen] = []
    try:
        vllm_port, proxy_port, admin_port, prom_port = (free_port() for _ in range(4))
        vllm_log = tmp / "vllm.log"
        env = dict(
            os.environ,
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            HF_HUB_OFFLINE="1",
        )
        with vllm_log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        str(VLLM_PYTHON),
                        "-m",
                        "vllm.entrypoints.openai.api_server",
                        "--model",
                        str(HF_MODEL),
                        "--served-model-name",
                        MODEL,
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(vllm_port),
                        "--dtype",
                        "float32",
                        "--max-model-len",
                        "512",
                        "--max-num-seqs",
                        "8",
                    ],  # fmt: skip
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        sidecar_log = tmp / "sidecar.log"
        with sidecar_log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "sidecar",
                        "serve",
                        "--upstream",
                        f"http://127.0.0.1:{vllm_port}",
                        "--listen",
                        f"127.0.0.1:{proxy_port}",
                        "--metrics-listen",
                        f"127.0.0.1:{admin_port}",
                        "--stall-seconds",
                        str(STALL),
                        "--stall-probe-seconds",
                        str(PROBE),
                    ],  # fmt: skip
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "llm-sidecar",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{admin_port}"], "labels": {"namespace": "llm"}}
                    ],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        prom_log = tmp / "prometheus.log"
        with prom_log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={tmp / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp / 'data'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                        "--log.level=warn",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        _wait_http(f"http://127.0.0.1:{prom_port}/-/ready", procs[2], 60, prom_log)
        _wait_http(f"http://127.0.0.1:{admin_port}/healthz", procs[1], 60, sidecar_log)
        _wait_http(f"http://127.0.0.1:{vllm_port}/health", procs[0], READY_TIMEOUT, vllm_log)
        yield (
            f"http://127.0.0.1:{proxy_port}",
            f"http://127.0.0.1:{admin_port}",
            f"http://127.0.0.1:{vllm_port}",
            f"http://127.0.0.1:{prom_port}",
            procs[0],
        )
    finally:
        for proc in reversed(procs):
            stop_process(proc, timeout=30)


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


async def _query(session: aiohttp.ClientSession, prom: str, expr: str) -> list[dict]:
    async with session.get(f"{prom}/api/v1/query", params={"query": expr}) as r:
        data = await r.json()
    assert data["status"] == "success", data
    return data["data"]["result"]


async def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.5)


async def test_a_stopped_vllm_engine_core_is_seen_alerted_and_probed_and_everything_clears(stack):
    proxy, admin, vllm, prom, api = stack
    cores = engine_cores(api.pid)
    assert cores, "no VLLM::EngineCore process under the API server"
    (rule,) = stall_group(load_spec(str(ROOT / "deploy" / "slo" / "default.yaml"))).rules
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 400,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        responses = [
            await s.post(f"{proxy}/v1/chat/completions", json=body) for _ in range(STREAMS)
        ]
        try:
            for r in responses:
                assert r.status == 200
                while b'"content"' not in await r.content.readline():
                    pass  # until a token
            for pid in cores:
                os.kill(pid, signal.SIGSTOP)
            try:
                async with s.get(f"{vllm}/health") as h:  # the API process still says healthy
                    assert h.status == 200

                async def stalled_now() -> dict[str, float] | None:
                    got = await _stalled(s, admin)
                    return got if sum(got.values()) >= STREAMS else None  # both stopped

                stalled = await _until(stalled_now, STALL + 15, "llm_streams_stalled")
                assert sum(stalled.values()) == STREAMS and set(stalled) == {"decode"}
                fired = await _until(lambda: _query(s, prom, rule.expr), 30, "the alert expression")
                assert fired[0]["metric"]["namespace"] == "llm"
                assert float(fired[0]["value"][1]) >= 1

                async def probe_failing() -> dict | None:
                    async with s.get(f"{admin}/stallz") as p:
                        return await p.json() if p.status == 503 else None

                doc = await _until(probe_failing, PROBE + 15, "/stallz 503")
                assert doc["stalled_engine"] is True and doc["in_flight"] == STREAMS
                async with s.get(f"{vllm}/health") as h:
                    assert h.status == 200
            finally:
                for pid in cores:
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
            return not await _query(s, prom, rule.expr)

        await _until(cleared, 30, "everything cleared")
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
