"""Over real sockets, for every dialect: a stream the upstream ends cleanly (chunked
terminator) but without its protocol's end marker is counted ``error`` /
``upstream_stream_truncated`` with the upstream's 200, logged at level error, marked on the
span; and the client receives exactly the upstream's bytes, no more, no less. The same
stream with its marker is ``ok``.
"""

from __future__ import annotations

import aiohttp
import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from sidecar.app import build_sidecar
from sidecar.base.outcomes import STREAM_TRUNCATED
from sidecar.base.routes import match_route
from sidecar.export import semconv as sc
from sidecar.streams.dialects import dialect_of
from tests.fixtures.streams.harness import END_MARKER_STREAMS as STREAMS, cut_before_marker, load
from tests.support.in_process import RunningSidecar, run_sidecar, sidecar_settings
from tests.support.sse import replaying
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

IDS = [f"{d}/{n}" for d, n, _, _ in STREAMS]


@pytest.fixture
async def rig(upstream):
    """Upstream answering ``path`` with given bytes, a traced and access-logged sidecar."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    started: list[RunningSidecar] = []

    async def make(
        path: str, raw: bytes, content_type: str
    ) -> tuple[RunningSidecar, InMemorySpanExporter]:
        if path.startswith("/v2/models/"):
            up = await upstream.start(
                lambda app: app.router.add_post(
                    "/v2/models/{m}/generate_stream",
                    replaying(raw, piece=64, content_type=content_type),
                )
            )
        else:
            up = await upstream.start(
                lambda app: app.router.add_post(
                    path, replaying(raw, piece=64, content_type=content_type)
                )
            )
        s = build_sidecar(
            sidecar_settings(up.url), CollectorRegistry(), access_log=True, tracer_provider=provider
        )
        started.append(running := await run_sidecar(s))
        return running, exporter

    yield make
    for running in started:
        await running.stop()
    provider.shutdown()


async def post(url: str) -> tuple[int, bytes]:
    body = {
        "model": "m1",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "prompt": "hi",
    }
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(url, json=body) as r:
            return r.status, await r.read()


async def finished(s: RunningSidecar, outcome: str) -> dict:
    def sample():
        for metric in s.registry.collect():
            if metric.name == "llm_requests":
                for smp in metric.samples:
                    if (
                        smp.name == "llm_requests_total"
                        and smp.labels["outcome"] == outcome
                        and smp.value == 1
                    ):
                        return smp.labels
        return None

    await wait_for(lambda: sample() is not None)
    return sample()


@pytest.mark.parametrize("where,name,path,ctype", STREAMS, ids=IDS)
async def test_truncated_stream_is_an_error_and_relayed_untouched(rig, where, name, path, ctype):
    cut = cut_before_marker(
        dialect_of(match_route(path)[0]).stream, load(where, name), ctype == "application/x-ndjson"
    )
    with structlog.testing.capture_logs() as logs:
        s, exporter = await rig(path, cut, ctype)
        status, body = await post(s.url + path)
        assert (status, body) == (200, cut)
        labels = await finished(s, "error")
    assert labels["code"] == "200"
    (line,) = [entry for entry in logs if entry.get("event") == "request"]
    assert (line["log_level"], line["outcome"], line["error"]) == (
        "error",
        "error",
        STREAM_TRUNCATED,
    )
    await wait_for(lambda: len(exporter.get_finished_spans()) == 1)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == STREAM_TRUNCATED


@pytest.mark.parametrize("where,name,path,ctype", STREAMS, ids=IDS)
async def test_complete_stream_is_ok(rig, where, name, path, ctype):
    raw = load(where, name)
    with structlog.testing.capture_logs() as logs:
        s, _ = await rig(path, raw, ctype)
        assert await post(s.url + path) == (200, raw)
        labels = await finished(s, "ok")
    assert labels["code"] == "200"
    (line,) = [entry for entry in logs if entry.get("event") == "request"]
    assert line["log_level"] == "info"


async def test_triton_stream_has_no_marker_and_stays_ok(rig):
    raw = load("triton", "trtllm_ensemble.txt")
    half = raw[: raw.index(b"\n\n", len(raw) // 2) + 2]
    s, _ = await rig(
        "/v2/models/ensemble/generate_stream", half, "text/event-stream; charset=utf-8"
    )
    assert await post(s.url + "/v2/models/ensemble/generate_stream") == (200, half)
    await finished(s, "ok")


async def test_non_streamed_json_is_ok_without_a_marker(rig):
    body = load("anthropic", "message.json")
    s, _ = await rig("/v1/messages", body, "application/json")
    assert await post(s.url + "/v1/messages") == (200, body)
    await finished(s, "ok")
