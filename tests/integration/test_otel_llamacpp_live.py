"""The GenAI client metrics against a real llama.cpp server, read by the real OpenAI SDK:
the number of ``time_per_output_chunk`` observations is the number of content chunks the
client received, less the first; ``time_to_first_chunk`` is the span's
``gen_ai.response.time_to_first_chunk``; ``token.usage`` output is llama.cpp's own count.

Marked ``real`` (deselected by default). The server and model are the ones the ``real``
work installs under ``.tools/`` (``scripts/install-llamacpp.sh``); ``TOOLS_DIR`` points
elsewhere. Skipped when missing locally, failed under CI=true.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prometheus_client import CollectorRegistry

from sidecar import semconv as sc
from sidecar.app import RUNNER_KWARGS, build_sidecar
from sidecar.config import Settings
from tests.conftest import IN_CI, RunningSidecar, free_port, start_app, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.real]

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("TOOLS_DIR", ROOT / ".tools"))
LLAMA_SERVER = TOOLS / "llama.cpp" / "bin" / "llama-server"
GGUF_MODEL = TOOLS / "models" / "tiny-llama.gguf"


@pytest.fixture
async def llama_server(tmp_path):
    for path in (LLAMA_SERVER, GGUF_MODEL):
        if not path.exists():
            message = f"{path} is missing (scripts/install-llamacpp.sh, or TOOLS_DIR)"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
    port = free_port()
    log = (tmp_path / "llama.log").open("wb")
    proc = subprocess.Popen(
        [str(LLAMA_SERVER), "-m", str(GGUF_MODEL), "--alias", "tiny", "--host", "127.0.0.1", "--port", str(port),
         "-c", "2048", "-t", "1", "--no-webui"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        import aiohttp

        async def healthy() -> bool:
            try:
                async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(healthy, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture
async def traced_sidecar_factory():
    runners = []

    async def make(upstream_url: str, *, tracer_provider=None, meter_provider=None) -> RunningSidecar:
        registry = CollectorRegistry()
        s = build_sidecar(
            Settings(upstream=upstream_url), registry, access_log=False,
            tracer_provider=tracer_provider, meter_provider=meter_provider,
        )  # fmt: skip
        proxy_runner, port = await start_app(s.proxy_app, shutdown_timeout=1.0, **RUNNER_KWARGS)
        admin_runner, admin_port = await start_app(s.admin_app, **RUNNER_KWARGS)
        runners.extend([proxy_runner, admin_runner])
        return RunningSidecar(s, registry, port, admin_port)

    yield make
    for runner in runners:
        await runner.cleanup()


async def test_client_metrics_match_what_the_openai_sdk_received(llama_server, traced_sidecar_factory):
    from openai import AsyncOpenAI

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    s = await traced_sidecar_factory(llama_server, tracer_provider=tracer, meter_provider=meters)
    client = AsyncOpenAI(base_url=s.url + "/v1", api_key="unused")
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Count to ten."}], max_tokens=24,
        temperature=0, seed=1, stream=True,
    )  # fmt: skip
    content_chunks = 0
    async for event in stream:
        if event.choices and event.choices[0].delta.content:
            content_chunks += 1
    await client.close()
    assert content_chunks >= 2, "the tiny model should stream several chunks"
    await wait_for(lambda: len(exporter.get_finished_spans()) == 1)
    (span,) = exporter.get_finished_spans()
    points = {m.name: m.data.data_points for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}  # fmt: skip
    (tpoc,) = points[sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK]
    assert tpoc.count == content_chunks - 1
    (ttfc,) = points[sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK]
    assert ttfc.count == 1 and ttfc.sum == span.attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
    usage = {p.attributes[sc.GEN_AI_TOKEN_TYPE]: p for p in points[sc.METRIC_CLIENT_TOKEN_USAGE]}
    # llama.cpp's own count (its timings), which the span reports as the engine's.
    assert span.attributes[sc.LLM_SIDECAR_TOKEN_COUNT_SOURCE] == "engine"
    assert usage["output"].sum == span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert dict(tpoc.attributes)[sc.GEN_AI_REQUEST_MODEL] == "tiny"
    assert dict(tpoc.attributes)[sc.SERVER_PORT] == int(llama_server.rsplit(":", 1)[1])
    meters.shutdown()
    tracer.shutdown()
