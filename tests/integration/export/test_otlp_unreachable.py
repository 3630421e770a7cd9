"""An unreachable OTLP endpoint over a real ``serve`` subprocess: left alone, the SDK's raw
retry text fills the log (~15 lines in 40 s) and an idle SIGTERM waits 5-7 s for a flush
that cannot happen (``otel_flush_incomplete``). Instead: one
``otel_export_failed`` line per signal and minute, the count on /metrics, and an exit
within a second whatever the exporter is doing."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from tests.support.serve import ServeProcess
from tests.support.sse import chat_chunk, scripted

pytestmark = pytest.mark.integration

SDK_TEXT = ("Transient error", "Failed to export", "retrying in", "Exception while exporting")


def failures(text: str, signal_name: str) -> float | None:
    for line in text.splitlines():
        if (
            line.startswith("llm_sidecar_otlp_export_failures_total{")
            and f'signal="{signal_name}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_unreachable_collector_one_line_a_counter_and_a_prompt_exit(
    upstream, refused_url, protocol
):
    script = [
        (0.0, chat_chunk(role=True)),
        (0.0, chat_chunk("hi", finish="stop")),
        (0.0, b"data: [DONE]\n\n"),
    ]
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(script))
    )
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": refused_url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",  # seconds: the SDK's retries give up sooner than 10 s
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        "LLM_SIDECAR_OTEL_METRICS": "true",
    }
    sc = ServeProcess(up.url, "--drain-seconds", "30", clean_env=True, env=otel)
    try:
        await sc.wait_alive()
        page = ""
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # spans keep coming while the exports fail
                async with s.post(
                    sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
                ) as r:
                    await r.read()
                async with s.get(sc.admin_url + "/metrics") as r:
                    page = await r.text()
                if (failures(page, "traces") or 0) >= 2 and (failures(page, "metrics") or 0) >= 2:
                    break
                await asyncio.sleep(0.2)
        assert (failures(page, "traces") or 0) >= 2 and (failures(page, "metrics") or 0) >= 2, page[
            -2000:
        ]
        await asyncio.sleep(0.5)  # idle: nothing in flight, the exporters still failing
        assert sc.proc.poll() is None
        signalled = time.monotonic()
        sc.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(sc.proc.wait, 30) == 0
        took = time.monotonic() - signalled
    finally:
        sc.stop()
    log = "".join(sc.out + sc.err)
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    failed = [e for e in lines if e.get("event") == "otel_export_failed"]
    raw = [
        line
        for line in log.splitlines()
        if any(t in line for t in SDK_TEXT) and "otel_export_failed" not in line
    ]
    assert not raw, raw[:5]  # not the SDK's retry lines, several a batch
    assert sorted(e["signal"] for e in failed) == ["metrics", "traces"], (
        failed
    )  # one each: a minute apart
    for e in failed:
        assert e["endpoint"].startswith(refused_url) and e["failures"] == 1 and e["reason"], e
    # On main: 5 s (otel_flush_incomplete) and more. A loaded machine gets half a second more.
    assert took < 1.5, f"idle SIGTERM took {took:.2f} s"
