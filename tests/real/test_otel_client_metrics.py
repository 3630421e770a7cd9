"""The GenAI client metrics against a real llama.cpp server, read by the real OpenAI SDK:
the number of ``time_per_output_chunk`` observations is the number of content chunks the
client received, less the first; ``time_to_first_chunk`` is the span's
``gen_ai.response.time_to_first_chunk``; ``token.usage`` output is llama.cpp's own count.

Marked ``real`` (deselected by default; ``make test-real``). Starts its own llama.cpp from
tests/real/servers.py (only that one: the session's ``live_servers`` would start vLLM too).
Skipped when the install is missing locally, failed under CI=true.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from sidecar.app import build_sidecar
from sidecar.export import semconv as sc
from tests.real.servers import LLAMACPP, MODEL, serving
from tests.support.in_process import RunningSidecar, run_sidecar, sidecar_settings
from tests.support.waits import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.real]


@pytest.fixture(scope="module")
def llama_server():
    with serving(LLAMACPP) as server:
        yield server.url


@pytest.fixture
async def traced_sidecar_factory():
    started: list[RunningSidecar] = []

    async def make(
        upstream_url: str, *, tracer_provider=None, meter_provider=None
    ) -> RunningSidecar:
        s = build_sidecar(
            sidecar_settings(upstream_url), CollectorRegistry(), access_log=False,
            tracer_provider=tracer_provider, meter_provider=meter_provider,
        )  # fmt: skip
        started.append(running := await run_sidecar(s))
        return running

    yield make
    for running in started:
        await running.stop()


async def test_client_metrics_match_what_the_openai_sdk_received(
    llama_server, traced_sidecar_factory
):
    from openai import AsyncOpenAI

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    s = await traced_sidecar_factory(llama_server, tracer_provider=tracer, meter_provider=meters)
    client = AsyncOpenAI(base_url=s.url + "/v1", api_key="unused")
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to ten."}], max_tokens=24,
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
    assert dict(tpoc.attributes)[sc.GEN_AI_REQUEST_MODEL] == MODEL
    assert dict(tpoc.attributes)[sc.SERVER_PORT] == int(llama_server.rsplit(":", 1)[1])
    meters.shutdown()
    tracer.shutdown()
