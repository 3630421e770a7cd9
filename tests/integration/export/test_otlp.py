"""The sidecar as a user runs it (``python -m sidecar serve`` with OTEL_* variables) exporting
to real OTLP receivers started here: gRPC (grpcio serving the collector's TraceService and
MetricsService) and HTTP/protobuf (aiohttp accepting POST /v1/traces and /v1/metrics).
The receivers decode the protobuf with opentelemetry-proto, so what is checked is exactly
what a Collector would get."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import sys
import threading
from concurrent import futures
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sidecar.export import semconv as sc
from tests.support.in_process import start_app
from tests.support.serve import bound_ports
from tests.support.sse import chat_chunk
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
ROUTE = "/v1/chat/completions"


chunk = partial(chat_chunk, id="chatcmpl-9", created=None, logprobs=False, spaced=True)


STREAM = [
    (0.0, chunk(role=True)),
    (0.05, chunk("one")),
    (0.01, chunk("two")),
    (0.01, chunk("three", finish="stop")),
    (
        0.0,
        b'data: {"id":"chatcmpl-9","model":"m1","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}\n\n',
    ),
    (0.0, b"data: [DONE]\n\n"),
]


# -- receivers -----------------------------------------------------------------------------------


@dataclass
class Received:
    traces: list = field(default_factory=list)  # ExportTraceServiceRequest
    metrics: list = field(default_factory=list)  # ExportMetricsServiceRequest
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, message) -> None:
        with self.lock:
            getattr(self, kind).append(message)

    def spans(self) -> list[tuple[dict, str, Span]]:
        """(resource attributes, scope name, span) for every span received."""
        out = []
        with self.lock:
            for req in self.traces:
                for rs in req.resource_spans:
                    resource = attributes(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        out.extend((resource, ss.scope.name, span) for span in ss.spans)
        return out

    def metric_points(self) -> dict[str, list]:
        out: dict[str, list] = {}
        with self.lock:
            for req in self.metrics:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            kind = m.WhichOneof("data")
                            if kind == "histogram":
                                out.setdefault(m.name, []).extend(m.histogram.data_points)
                            elif kind == "sum":  # counters: only monotonic cumulative ones are sent
                                assert m.sum.is_monotonic, m.name
                                out.setdefault(m.name, []).extend(m.sum.data_points)
        return out

    def metric_units(self) -> dict[str, set[str]]:
        """Every unit each metric name was exported with."""
        out: dict[str, set[str]] = {}
        with self.lock:
            for req in self.metrics:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            out.setdefault(m.name, set()).add(m.unit)
        return out


def value(v: AnyValue):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def attributes(kvs) -> dict:
    return {kv.key: value(kv.value) for kv in kvs}


class GrpcReceiver(
    trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer
):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request, context):  # noqa: N802 - both services name it Export
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self.received.add("traces", request)
            return trace_service_pb2.ExportTraceServiceResponse()
        self.received.add("metrics", request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def grpc_receiver():
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = GrpcReceiver(received)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield received, f"http://127.0.0.1:{port}"
    server.stop(0)


@pytest.fixture
async def http_receiver():
    received = Received()

    def handler(kind: str, request_type, response_type):
        async def handle(request: web.Request) -> web.Response:
            assert request.content_type == "application/x-protobuf"
            body = await request.read()
            if body[:2] == b"\x1f\x8b":
                body = gzip.decompress(body)
            message = request_type()
            message.ParseFromString(body)
            received.add(kind, message)
            return web.Response(
                body=response_type().SerializeToString(), content_type="application/x-protobuf"
            )

        return handle

    app = web.Application()
    app.router.add_post(
        "/v1/traces",
        handler(
            "traces",
            trace_service_pb2.ExportTraceServiceRequest,
            trace_service_pb2.ExportTraceServiceResponse,
        ),
    )
    app.router.add_post(
        "/v1/metrics",
        handler(
            "metrics",
            metrics_service_pb2.ExportMetricsServiceRequest,
            metrics_service_pb2.ExportMetricsServiceResponse,
        ),
    )
    runner, port = await start_app(app)
    yield received, f"http://127.0.0.1:{port}"
    await runner.cleanup()


# -- the sidecar as a subprocess -------------------------------------------------------------------


async def run_sidecar(upstream_url: str, otel_env: dict[str, str], log: Path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "K8S_", "LLM_SIDECAR_"))
    }
    env.update(
        {
            "LLM_SIDECAR_UPSTREAM": upstream_url,
            "LLM_SIDECAR_LISTEN": "127.0.0.1:0",  # the ports it bound are in its started line
            "LLM_SIDECAR_METRICS_LISTEN": "127.0.0.1:0",
            "LLM_SIDECAR_DRAIN_SECONDS": "1",
            "OTEL_SERVICE_NAME": "sidecar-under-test",
            "K8S_POD_NAME": "vllm-0",
            "K8S_NAMESPACE_NAME": "inference",
            **otel_env,
        }
    )
    out = log.open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        "serve",
        env=env,
        stdout=out,
        stderr=asyncio.subprocess.STDOUT,
    )

    ports: list[int] = []

    async def ready() -> bool:
        if proc.returncode is not None:
            raise AssertionError(f"sidecar exited {proc.returncode}: {log.read_text()}")
        if not ports:
            ports.extend(bound_ports(log.read_text()) or ())
            if not ports:
                return False
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{ports[1]}/healthz") as r:
                    return r.status == 200
        except aiohttp.ClientError:
            return False

    await wait_for(ready, timeout=30)
    return proc, f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}", out


async def stream(seen: list, request: web.Request) -> web.StreamResponse:
    """The upstream: STREAM, with the traceparent each request came with in ``seen``."""
    await request.read()
    seen.append(request.headers.get("traceparent"))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for delay, data in STREAM:
        await asyncio.sleep(delay)
        await resp.write(data)
    await resp.write_eof()
    return resp


async def exercise(
    upstream, received: Received, otel_env: dict[str, str], tmp_path: Path, *, latest: bool = False
) -> None:
    seen: list = []
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, partial(stream, seen)))
    proc, url, admin, out = await run_sidecar(up.url, otel_env, tmp_path / "sidecar.log")
    try:
        async with aiohttp.ClientSession() as s:
            headers = {
                "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
                "Authorization": "Bearer SECRET",
            }
            body = {
                "model": "m1",
                "stream": True,
                "messages": [{"role": "user", "content": "SECRET prompt"}],
            }
            async with s.post(url + ROUTE, json=body, headers=headers) as r:
                assert r.status == 200
                await r.read()

            async def scraped() -> str | None:
                accept = {"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"}
                async with s.get(admin + "/metrics", headers=accept) as r:
                    text = await r.text()
                return text if 'llm_requests_total{code="200"' in text else None

            await wait_for(scraped)
            exposition = await scraped()
    finally:
        proc.send_signal(signal.SIGTERM)  # serve() drains, then flushes the exporters
        await asyncio.wait_for(proc.wait(), timeout=15)
        out.close()
    assert proc.returncode == 0, (tmp_path / "sidecar.log").read_text()

    # The span: GenAI conventions, in the client's trace, with the resource from the env.
    found = [(res, scope, span) for res, scope, span in received.spans() if span.name == "chat m1"]
    assert len(found) == 1, (received.spans(), (tmp_path / "sidecar.log").read_text())
    resource, scope, span = found[0]
    assert resource["service.name"] == "sidecar-under-test"
    assert resource["k8s.pod.name"] == "vllm-0" and resource["k8s.namespace.name"] == "inference"
    assert scope == sc.INSTRUMENTATION_SCOPE
    assert span.kind == Span.SpanKind.SPAN_KIND_CLIENT
    assert span.trace_id.hex() == CLIENT_TRACE
    assert span.parent_span_id.hex() == CLIENT_SPAN
    attrs = attributes(span.attributes)
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert attrs[sc.GEN_AI_PROVIDER_NAME] == "openai"
    assert attrs[sc.GEN_AI_REQUEST_MODEL] == "m1"
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (4, 3)
    assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert [e.name for e in span.events] == [sc.EVENT_FIRST_TOKEN]
    assert 0.04 <= attrs[sc.LLM_SIDECAR_TTFT] < 0.5
    assert "SECRET" not in repr(span) and "SECRET" not in repr(resource)

    # The upstream saw the same trace, with this span as its parent.
    (traceparent,) = seen
    assert traceparent.split("-")[1:3] == [CLIENT_TRACE, span.span_id.hex()]

    # The Prometheus TTFT bucket links to the trace (OpenMetrics exemplar).
    ttft = [
        ln
        for ln in exposition.splitlines()
        if ln.startswith("llm_time_to_first_token_seconds_bucket{")
    ]
    assert any(f'# {{trace_id="{CLIENT_TRACE}"}}' in ln for ln in ttft), ttft

    # The opt-in GenAI client metrics (semantic-conventions-genai, see sidecar/export/semconv.py):
    # names, units, advised bucket boundaries and the required attributes, as the receiver
    # decoded them. Cumulative temporality: the last export holds the whole run.
    points = received.metric_points()
    units = received.metric_units()
    assert not [n for n in points if n.startswith("gen_ai.server.")], sorted(points)
    required = {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_PROVIDER_NAME: "openai",
        sc.GEN_AI_REQUEST_MODEL: "m1",
        sc.GEN_AI_RESPONSE_MODEL: "m1",
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: up.port,
    }
    if latest:  # OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental
        duration, first, per_chunk = (
            sc.METRIC_CLIENT_INFERENCE_DURATION,
            sc.METRIC_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK,
            sc.METRIC_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK,
        )
    else:
        duration, first, per_chunk = (
            sc.METRIC_CLIENT_OPERATION_DURATION,
            sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK,
            sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK,
        )
    expected = {
        # name: (unit, buckets, count, extra attributes)
        duration: ("s", sc.BUCKETS_CLIENT_SECONDS, 1, {}),
        first: ("s", sc.BUCKETS_CLIENT_SECONDS, 1, {}),
        # three content chunks: one observation for each after the first
        per_chunk: ("s", sc.BUCKETS_CLIENT_SECONDS, 2, {}),
    }
    for name, (unit, buckets, count, extra) in expected.items():
        assert points.get(name), (name, sorted(points))
        assert units[name] == {unit}, name
        point = points[name][-1]
        assert tuple(point.explicit_bounds) == buckets, name
        assert attributes(point.attributes) == {**required, **extra}, name
        assert point.count == count, name
    if latest:
        assert not [n for n in points if n.startswith("gen_ai.client.operation.")], sorted(points)
        assert sc.METRIC_CLIENT_TOKEN_USAGE not in points, sorted(points)
        for name, total in (
            (sc.METRIC_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS, 4),
            (sc.METRIC_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS, 3),
        ):
            point = points[name][-1]
            assert units[name] == {"{token}"}, name
            assert (point.count, point.sum) == (1, total), name
            assert tuple(point.explicit_bounds) == sc.BUCKETS_TOKEN_USAGE, name
            assert attributes(point.attributes) == required, name
        counted = {**required, sc.GEN_AI_TOKEN_MODALITY: "unknown"}
        for name, total in (
            (sc.METRIC_CLIENT_INFERENCE_USAGE_INPUT_TOKENS, 4),
            (sc.METRIC_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS, 3),
        ):
            point = points[name][-1]  # a monotonic cumulative Sum: the last export holds the run
            assert units[name] == {"{token}"}, name
            assert point.as_int == total, name
            assert attributes(point.attributes) == counted, name
        # the stream reported no cached or reasoning tokens: nothing recorded
        assert sc.METRIC_CLIENT_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS not in points
        (ttfc,) = {p.sum for p in points[first]}
        assert ttfc == attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
        return
    assert not [n for n in points if n.startswith("gen_ai.client.inference.")], sorted(points)
    (ttfc,) = {p.sum for p in points[sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK]}
    assert ttfc == attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
    assert attrs[sc.GEN_AI_REQUEST_STREAM] is True


async def test_otlp_grpc_traces_and_metrics(upstream, grpc_receiver, tmp_path):
    received, endpoint = grpc_receiver
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "LLM_SIDECAR_OTEL_METRICS": "true",
    }
    await exercise(upstream, received, env, tmp_path)


async def test_otlp_http_protobuf_traces_and_metrics(upstream, http_receiver, tmp_path):
    received, base = http_receiver
    env = {
        # Per-signal endpoints are used as given (no /v1/... appended); protocol defaults to http/protobuf.
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": base + "/v1/traces",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": base + "/v1/metrics",
        "LLM_SIDECAR_OTEL_METRICS": "true",
    }
    await exercise(upstream, received, env, tmp_path)


async def test_otlp_latest_genai_metric_names_behind_opt_in(upstream, http_receiver, tmp_path):
    """OTEL_SEMCONV_STABILITY_OPT_IN (a comma list) with gen_ai_latest_experimental: the
    current semantic-conventions-genai names reach the receiver, the released ones do not."""
    received, base = http_receiver
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": base + "/v1/traces",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": base + "/v1/metrics",
        "LLM_SIDECAR_OTEL_METRICS": "true",
        "OTEL_SEMCONV_STABILITY_OPT_IN": "http, gen_ai_latest_experimental",
    }
    await exercise(upstream, received, env, tmp_path, latest=True)


async def test_every_worker_of_a_pod_exports_under_the_pods_resource(
    upstream, http_receiver, tmp_path
):
    """``--workers 2``: spans and metrics arrive from both workers, each under the pod's
    resource (service name, pod, namespace) with a ``service.instance.id`` of its own, and one
    span a request."""
    received, base = http_receiver
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, partial(stream, [])))
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": base + "/v1/traces",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": base + "/v1/metrics",
        "LLM_SIDECAR_OTEL_METRICS": "true",
        "LLM_SIDECAR_WORKERS": "2",
    }
    proc, url, _admin, out = await run_sidecar(up.url, env, tmp_path / "sidecar.log")
    requests = 24
    try:

        async def one(_: int) -> None:
            async with aiohttp.ClientSession() as s:  # a connection each: both workers
                body = {
                    "model": "m1",
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                }
                async with s.post(url + ROUTE, json=body) as r:
                    assert r.status == 200
                    await r.read()

        await asyncio.gather(*(one(i) for i in range(requests)))
    finally:
        proc.send_signal(signal.SIGTERM)  # every worker drains, then flushes its exporters
        await asyncio.wait_for(proc.wait(), timeout=30)
        out.close()
    assert proc.returncode == 0, (tmp_path / "sidecar.log").read_text()
    spans = [(res, span) for res, _scope, span in received.spans() if span.name == "chat m1"]
    assert len(spans) == requests
    instances = {res["service.instance.id"] for res, _ in spans}
    assert instances == {"vllm-0-worker-0", "vllm-0-worker-1"}
    for res, _ in spans:
        assert res["service.name"] == "sidecar-under-test"
        assert res["k8s.pod.name"] == "vllm-0" and res["k8s.namespace.name"] == "inference"
    with received.lock:
        metric_instances = {
            attributes(rm.resource.attributes).get("service.instance.id")
            for req in received.metrics
            for rm in req.resource_metrics
        }
    assert metric_instances == instances
