"""`llm-sidecar serve` as a real subprocess: start-up errors, request logs, SIGTERM drain."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp import web

from tests.support.serve import ServeProcess
from tests.support.sse import USAGE, chat_chunk, scripted
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def serve_processes(serve_process):
    return serve_process


def test_bad_setting_exits_with_one_line_naming_it():
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--upstream", "http://127.0.0.1:1", "--read-timeout", "soon"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "read_timeout" in lines[0] and "--read-timeout" in lines[0]

    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "LLM_SIDECAR_UPSTREAM": "http://127.0.0.1:1", "LLM_SIDECAR_MAX_MODELS": "0"},
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "LLM_SIDECAR_MAX_MODELS" in r.stderr


def test_config_file_and_precedence(tmp_path):
    from sidecar.config import ConfigError, load_settings

    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        "upstream: http://file:1\nread-timeout: 30\nmax_models: 7\nmodel_allowlist: [a, b]\n"
    )
    s = load_settings(
        {"read_timeout": None, "max_models": "9"},
        environ={"LLM_SIDECAR_READ_TIMEOUT": "45"},
        config_file=str(cfg),
    )
    assert (s.upstream, s.read_timeout, s.max_models, s.model_allowlist) == (
        "http://file:1",
        45.0,
        9,
        ["a", "b"],
    )
    cfg.write_text("upstream: http://file:1\nbogus: 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        load_settings({}, environ={}, config_file=str(cfg))
    with pytest.raises(ConfigError, match="no_such_file"):
        load_settings({}, environ={}, config_file=str(tmp_path / "no_such_file.yaml"))


async def test_request_log_line_has_figures_and_no_secrets(upstream):
    script = [
        (0.0, chat_chunk(role=True)),
        (0.05, chat_chunk("COMPLETION-SECRET")),
        (0.02, chat_chunk("x", finish="stop")),
        (0.0, USAGE),
        (0.0, b"data: [DONE]\n\n"),
    ]
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(script))
    )
    sc = ServeProcess(up.url)
    try:
        await sc.wait_alive()
        async with aiohttp.ClientSession() as s:
            async with s.post(
                sc.url + "/v1/chat/completions?api-key=QUERY-SECRET",
                json={
                    "model": "m1",
                    "stream": True,
                    "messages": [{"role": "user", "content": "PROMPT-SECRET"}],
                },
                headers={
                    "Authorization": "Bearer sk-AUTH-SECRET",
                    "api-key": "HEADER-SECRET",
                    "Cookie": "s=COOKIE-SECRET",
                },
            ) as r:
                assert b"COMPLETION-SECRET" in await r.read()
        await wait_for(
            lambda: any('"request"' in line for line in sc.out), timeout=30
        )  # logged after EOF
        sc.proc.send_signal(signal.SIGTERM)
        sc.proc.wait(timeout=10)
    finally:
        out, err = sc.stop()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    requests = [line for line in lines if line.get("event") == "request"]
    assert len(requests) == 1, out
    rec = requests[0]
    assert rec["route"] == "/v1/chat/completions" and rec["model"] == "m1"
    assert rec["status"] == 200 and rec["outcome"] == "ok" and rec["method"] == "POST"
    assert rec["output_tokens"] == 5 and rec["input_tokens"] == 7
    assert 40 <= rec["ttft_ms"] < 10_000 and rec["duration_ms"] >= rec["ttft_ms"]
    for secret in (
        "COMPLETION-SECRET",
        "PROMPT-SECRET",
        "AUTH-SECRET",
        "HEADER-SECRET",
        "COOKIE-SECRET",
        "QUERY-SECRET",
    ):
        assert secret not in out and secret not in err


async def test_sigterm_keeps_relaying_while_the_upstream_answers_then_refuses_with_503(upstream):
    """The drain of sidecar/relay/server/drain.py over real sockets: after SIGTERM, new requests are still
    relayed while the upstream's health path answers; once it stops, they get 503 JSON with
    Retry-After (not a 502, not a refused connection); the in-flight stream finishes whole
    and the process exits 0 as soon as it has, well before drain_seconds."""
    checked = asyncio.Event()  # the stream stays in flight until the checks below are done
    script = [
        (0.0, chat_chunk(role=True)),
        (0.15, chat_chunk("t0")),
        (0.15, chat_chunk("t1")),
        (checked, b""),
    ]
    script += [(0.15, chat_chunk(f"t{i}")) for i in range(2, 12)] + [(0.0, b"data: [DONE]\n\n")]
    health = {"status": 200}

    async def models(request):
        return web.json_response({"data": [{"id": "m1"}]})

    async def health_check(request):
        return web.json_response({}, status=health["status"])

    def routes(app):
        app.router.add_post("/v1/chat/completions", scripted(script))
        app.router.add_get("/v1/models", models)
        app.router.add_get("/health", health_check)

    up = await upstream.start(routes)
    sc = ServeProcess(up.url, "--drain-seconds", "60")
    try:
        await sc.wait_alive()
        received = b""
        seen: dict[str, object] = {}
        async with aiohttp.ClientSession() as s:
            async with s.post(
                sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
            ) as r:
                async for chunk in r.content.iter_any():
                    received += chunk
                    if b"t1" in received and "signalled" not in seen:
                        sc.proc.send_signal(signal.SIGTERM)
                        seen["signalled"] = True
                        async with aiohttp.ClientSession() as s2:

                            async def not_ready() -> bool:  # the signal is handled
                                async with s2.get(
                                    f"http://127.0.0.1:{sc.admin_port}/readyz"
                                ) as ready:
                                    seen["readyz"] = ready.status
                                    return ready.status == 503

                            await wait_for(not_ready, timeout=30)
                            async with s2.get(sc.url + "/v1/models") as new:
                                seen["while_up"] = (new.status, await new.json())
                                seen["connection"] = new.headers.get("Connection")
                            health["status"] = 503  # the upstream is going away
                            statuses = []

                            async def refused(statuses: list[int] = statuses) -> bool:
                                # once the drain's health poll sees it
                                async with s2.get(sc.url + "/v1/models") as gone:
                                    statuses.append(gone.status)
                                    seen["gone"] = (
                                        gone.status,
                                        gone.headers.get("Retry-After"),
                                        await gone.json(),
                                    )
                                    return gone.status != 200

                            await wait_for(refused, timeout=30)
                            assert set(statuses) <= {200, 503}, (
                                statuses
                            )  # relayed or refused, nothing else
                        checked.set()
            stream_end = time.monotonic()
        assert seen["while_up"] == (200, {"data": [{"id": "m1"}]})
        assert seen["connection"] == "close", (
            "pooled clients reconnect, through the Service, elsewhere"
        )
        assert seen["readyz"] == 503
        status, retry_after, body = seen["gone"]
        assert (status, retry_after) == (503, "1")
        assert body["error"]["type"] == "draining"
        assert received.endswith(b"data: [DONE]\n\n")  # the in-flight stream finished whole
        assert sc.proc.wait(timeout=45) == 0
        assert time.monotonic() - stream_end < 30, (
            "exits once nothing is in flight, not at drain_seconds (60)"
        )
    finally:
        sc.stop()


async def test_drain_time_bounds_shutdown(upstream):
    script = [(0.0, chat_chunk(role=True))] + [
        (0.2, chat_chunk(f"t{i}")) for i in range(300)
    ]  # 60 s
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(script))
    )
    sc = ServeProcess(up.url, "--drain-seconds", "1")
    try:
        await sc.wait_alive()
        async with aiohttp.ClientSession() as s:
            async with s.post(
                sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
            ) as r:
                await r.content.readany()
                t0 = time.perf_counter()
                sc.proc.send_signal(signal.SIGTERM)
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()
        assert sc.proc.wait(timeout=45) == 0
        assert time.perf_counter() - t0 < 30, (
            "cut at drain_seconds (1), not at the stream's end (60 s)"
        )
    finally:
        sc.stop()


async def test_started_line_reports_the_ports_bound_for_port_0(upstream):
    """``--listen 127.0.0.1:0``: the kernel picks the ports, and the ``started`` line says which
    (beside the addresses as configured), so a caller needs no port probe that could race."""
    up = await upstream.start(lambda app: None)
    sc = ServeProcess(up.url)
    try:
        await sc.wait_started()
        started = next(json.loads(line) for line in sc.out if '"started"' in line)
        assert (started["listen"], started["metrics_listen"]) == ("127.0.0.1:0", "127.0.0.1:0")
        assert started["bound"] == [f"127.0.0.1:{sc.port}"] and started["metrics_bound"] == [
            f"127.0.0.1:{sc.admin_port}"
        ]
        assert 0 not in (sc.port, sc.admin_port) and sc.port != sc.admin_port
        async with aiohttp.ClientSession() as s:
            async with s.get(sc.admin_url + "/metrics") as r:
                assert r.status == 200
    finally:
        sc.stop()
