"""The GenAI client metrics on bytes recorded from real servers (tests/fixtures/real/:
vLLM 0.32 with and without per-request metrics and forced usage, llama.cpp b11434): one
``time_per_output_chunk`` observation per event that carried generated text, after the
first, counted here independently of the sidecar's parsers (tests/real/wire.py); one
``time_to_first_chunk``; ``token.usage`` equal to what the server reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from sidecar.export import semconv as sc
from sidecar.export.spans import RequestTelemetry
from sidecar.measure.summary import summarize
from tests.real.wire import content_events, json_events, reported_usage
from tests.support.recordings import STREAMS, meta, replay
from tests.support.samples import metric_points


def sse_events(body: bytes) -> list[bytes]:
    """The recording cut into its events, each as the server flushed it."""
    return [
        block + b"\n\n" for block in body.replace(b"\r\n", b"\n").split(b"\n\n") if block.strip()
    ]


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_one_observation_per_chunk_after_the_first(path: Path):
    body = path.read_bytes()
    timeline, _ = replay(path, sse_events(body))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    RequestTelemetry("http://127.0.0.1:8000", meter_provider=meters).record(
        summarize(timeline, "tiny")
    )
    got = metric_points(reader)
    events = json_events(body, streamed=True)
    chunks = content_events(events)
    assert chunks >= 2, "every recording streams several chunks"
    (tpoc,) = got[sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK]
    assert tpoc.count == chunks - 1
    (ttfc,) = got[sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK]
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(timeline.ttft)
    (duration,) = got[sc.METRIC_CLIENT_OPERATION_DURATION]
    assert sc.ERROR_TYPE not in duration.attributes
    usage = reported_usage(events)
    tokens = {p.attributes[sc.GEN_AI_TOKEN_TYPE]: p.sum for p in got[sc.METRIC_CLIENT_TOKEN_USAGE]}
    if usage is not None:
        assert tokens == {"input": usage["input"], "output": usage["output"]}, meta(path)["server"]
    meters.shutdown()
