"""Spans, propagation, OTel metrics and exemplars through a real sidecar on real sockets,
with in-memory exporters injected into build_sidecar (no globals, no network exporter)."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from sidecar.app import build_sidecar
from sidecar.config import Settings
from sidecar.export import semconv as sc
from tests.support.in_process import RunningSidecar, run_sidecar, sidecar_settings
from tests.support.samples import metric_points
from tests.support.spans import one_span
from tests.support.sse import chat_chunk, scripted
from tests.support.waits import wait_for

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
ROUTE = "/v1/chat/completions"


chunk = partial(chat_chunk, id="chatcmpl-42", model="m1-2025", logprobs=False, spaced=True)


USAGE = (
    b'data: {"id":"chatcmpl-42","object":"chat.completion.chunk","created":1,"model":"m1-2025",'
    b'"choices":[],"usage":{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5}}\n\n'
)
STREAM = [
    (0.0, chunk(role=True)),
    (0.10, chunk("SECRET-COMPLETION")),
    (0.02, chunk("b")),
    (0.02, chunk("c")),
    (0.02, chunk("d")),
    (0.02, chunk("e", finish="stop")),
    (0.0, USAGE),
    (0.0, b"data: [DONE]\n\n"),
]
SECRET_BODY = {
    "model": "m1",
    "stream": True,
    "max_tokens": 50,
    "messages": [{"role": "user", "content": "SECRET-PROMPT"}],
}


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
async def traced_sidecar():
    started: list[RunningSidecar] = []

    async def make(
        upstream_url: str, *, tracer_provider=None, meter_provider=None, **overrides
    ) -> RunningSidecar:
        s = build_sidecar(
            sidecar_settings(upstream_url, **overrides),
            CollectorRegistry(),
            access_log=False,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
        )
        started.append(running := await run_sidecar(s))
        return running

    yield make
    for running in started:
        await running.stop()


async def post(
    url: str, body: dict | None = None, headers: dict | None = None
) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s:
        async with s.post(
            url, json=body if body is not None else SECRET_BODY, headers=headers
        ) as r:
            return r.status, await r.read()


def all_strings(span) -> list[str]:
    """Every string the span would export: name, attributes, events, status, resource."""
    out = [span.name, str(span.status.description)]
    values = list(span.attributes.values()) + list(span.resource.attributes.values())
    for ev in span.events:
        out.append(ev.name)
        values.extend(ev.attributes.values())
    for v in values:
        out.extend(str(x) for x in v) if isinstance(v, tuple) else out.append(str(v))
    out.extend(span.attributes.keys())
    return out


def traceparent(trace_id: str, span_id: str, flags: str = "01") -> str:
    return f"00-{trace_id}-{span_id}-{flags}"


# -- spans ----------------------------------------------------------------------------------------


async def test_ok_stream_span_in_client_trace(upstream, traced_sidecar, spans):
    provider, exporter = spans
    received: list = []
    up = await upstream.start(
        lambda app: app.router.add_post(ROUTE, scripted(STREAM, received=received))
    )
    s = await traced_sidecar(up.url, tracer_provider=provider)
    status, _ = await post(
        s.url + ROUTE + "?api_key=SECRET-QUERY",
        headers={
            "Authorization": "Bearer SECRET-KEY",
            "traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN),
            "tracestate": "vendor=abc",
            "baggage": "tenant=t1",
        },
    )
    assert status == 200
    span = await one_span(exporter)
    assert s.carried == 1  # the relay answered it

    assert span.name == "chat m1"
    assert span.kind is SpanKind.CLIENT
    assert span.context.trace_id == int(CLIENT_TRACE, 16)
    assert span.parent is not None and span.parent.span_id == int(CLIENT_SPAN, 16)
    assert span.status.status_code is StatusCode.UNSET
    a = span.attributes
    expected = {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_PROVIDER_NAME: "openai",
        sc.GEN_AI_REQUEST_MODEL: "m1",
        sc.GEN_AI_REQUEST_MAX_TOKENS: 50,
        sc.GEN_AI_REQUEST_STREAM: True,
        sc.GEN_AI_RESPONSE_MODEL: "m1-2025",
        sc.GEN_AI_RESPONSE_ID: "chatcmpl-42",
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
        sc.GEN_AI_USAGE_INPUT_TOKENS: 7,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        sc.HTTP_REQUEST_METHOD: "POST",
        sc.HTTP_RESPONSE_STATUS_CODE: 200,
        sc.URL_TEMPLATE: ROUTE,
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: up.port,
        sc.LLM_SIDECAR_OUTCOME: "ok",
        sc.LLM_SIDECAR_TOKENS_FROM_USAGE: True,
    }
    assert {k: a.get(k) for k in expected} == expected
    assert sc.ERROR_TYPE not in a and sc.LLM_SIDECAR_CANCELLED not in a
    assert 0.09 <= a[sc.LLM_SIDECAR_TTFT] < 0.3
    assert 0.015 <= a[sc.LLM_SIDECAR_TPOT] < 0.06
    assert a[sc.LLM_SIDECAR_TTFB] < a[sc.LLM_SIDECAR_TTFT]
    # The 2026 registry's name for what a client sees: the same first chunk as TTFT.
    assert a[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == a[sc.LLM_SIDECAR_TTFT]

    # Timestamps: the first-token event sits at start + TTFT; the span lasts e2e.
    (event,) = span.events
    assert event.name == sc.EVENT_FIRST_TOKEN
    assert event.attributes[sc.LLM_SIDECAR_TOKEN_KIND] == "answer"
    assert abs((event.timestamp - span.start_time) / 1e9 - a[sc.LLM_SIDECAR_TTFT]) < 1e-6
    e2e = s.sample("llm_request_duration_seconds_sum", model="m1", outcome="ok")
    assert abs((span.end_time - span.start_time) / 1e9 - e2e) < 1e-6

    # The upstream joined the same trace, as this span's child; tracestate and baggage followed.
    (headers,) = received
    assert headers["traceparent"] == traceparent(CLIENT_TRACE, f"{span.context.span_id:016x}")
    assert headers["tracestate"] == "vendor=abc"
    assert "tenant=t1" in headers["baggage"]

    # Nothing the user sent or received is in the span.
    for text in all_strings(span):
        assert "SECRET" not in text, text
        assert "Bearer" not in text


async def test_root_span_when_client_sends_no_context(upstream, traced_sidecar, spans):
    provider, exporter = spans
    received: list = []
    up = await upstream.start(
        lambda app: app.router.add_post(ROUTE, scripted(STREAM, received=received))
    )
    s = await traced_sidecar(up.url, tracer_provider=provider)
    await post(s.url + ROUTE, headers={"traceparent": "00-garbage-01", "tracestate": "stale=1"})
    span = await one_span(exporter)
    assert span.parent is None
    (headers,) = received
    ctx = span.context
    _, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert int(flags, 16) & 1  # sampled (the SDK may also set W3C level 2's random-id bit)
    assert "tracestate" not in headers  # belonged to the invalid traceparent


async def test_upstream_502_is_error_span(upstream, traced_sidecar, spans):
    provider, exporter = spans
    body = b'{"error":{"message":"bad gateway"}}'
    up = await upstream.start(
        lambda app: app.router.add_post(
            ROUTE, scripted([(0, body)], status=502, content_type="application/json")
        )
    )
    s = await traced_sidecar(up.url, tracer_provider=provider)
    status, _ = await post(s.url + ROUTE)
    assert status == 502
    span = await one_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == "502"
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 502
    assert span.attributes[sc.LLM_SIDECAR_OUTCOME] == "error"
    assert span.events == ()


async def test_upstream_unreachable_is_error_span(traced_sidecar, spans, refused_url):
    provider, exporter = spans
    s = await traced_sidecar(refused_url, tracer_provider=provider)
    status, _ = await post(s.url + ROUTE)
    assert status == 502
    span = await one_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "upstream_unreachable"
    assert span.attributes[sc.ERROR_TYPE] == "upstream_unreachable"


async def test_error_inside_stream_is_error_span(upstream, traced_sidecar, spans):
    provider, exporter = spans
    script = [
        (0.0, chunk(role=True)),
        (
            0.0,
            b'data: {"error":{"message":"overloaded SECRET","type":"InternalServerError","code":500}}\n\n',
        ),
        (0.0, b"data: [DONE]\n\n"),
    ]
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, scripted(script)))
    s = await traced_sidecar(up.url, tracer_provider=provider)
    status, _ = await post(s.url + ROUTE)
    assert status == 200
    span = await one_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == "stream_error"
    assert span.attributes[sc.LLM_SIDECAR_STREAM_ERROR_TYPE] == "InternalServerError"
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert not any("SECRET" in text for text in all_strings(span))  # the message is content


async def test_4xx_is_error_on_the_client_span_but_outcome_ok(upstream, traced_sidecar, spans):
    provider, exporter = spans
    up = await upstream.start(
        lambda app: app.router.add_post(
            ROUTE, scripted([(0, b"{}")], status=429, content_type="application/json")
        )
    )
    s = await traced_sidecar(up.url, tracer_provider=provider)
    await post(s.url + ROUTE)
    span = await one_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is None
    assert span.attributes[sc.ERROR_TYPE] == "429"
    assert span.attributes[sc.LLM_SIDECAR_OUTCOME] == "ok"


async def test_cancelled_request_span(upstream, traced_sidecar, spans):
    provider, exporter = spans

    async def endless(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk(role=True))
        for i in range(1000):
            await resp.write(chunk(f"t{i}"))
            await asyncio.sleep(0.02)
        return resp

    up = await upstream.start(lambda app: app.router.add_post(ROUTE, endless))
    s = await traced_sidecar(up.url, tracer_provider=provider)
    async with aiohttp.ClientSession() as session:
        async with session.post(s.url + ROUTE, json=SECRET_BODY) as r:
            n = 0
            async for _ in r.content.iter_any():
                n += 1
                if n >= 4:
                    break
            r.close()
    span = await one_span(exporter)
    a = span.attributes
    assert a[sc.LLM_SIDECAR_OUTCOME] == "cancelled"
    assert a[sc.LLM_SIDECAR_CANCELLED] is True
    assert sc.ERROR_TYPE not in a
    assert span.status.status_code is StatusCode.UNSET
    assert [e.name for e in span.events] == [sc.EVENT_FIRST_TOKEN]
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] >= 1 and a[sc.LLM_SIDECAR_TOKENS_FROM_USAGE] is False


async def test_first_answer_token_event_after_reasoning(upstream, traced_sidecar, spans):
    provider, exporter = spans
    script = [
        (0.0, chunk(role=True)),
        (0.02, chunk(reasoning="hmm")),
        (0.05, chunk("answer", finish="stop")),
        (0.0, b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":4,'
              b'"completion_tokens_details":{"reasoning_tokens":3}}}\n\n'),
        (0.0, b"data: [DONE]\n\n"),
    ]  # fmt: skip
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, scripted(script)))
    s = await traced_sidecar(up.url, tracer_provider=provider)
    await post(s.url + ROUTE)
    span = await one_span(exporter)
    assert span.attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == 3
    assert span.attributes[sc.LLM_SIDECAR_REASONING_TOKENS] == 3
    first, answer = span.events
    assert (first.name, first.attributes[sc.LLM_SIDECAR_TOKEN_KIND]) == (
        sc.EVENT_FIRST_TOKEN,
        "reasoning",
    )
    assert answer.name == sc.EVENT_FIRST_ANSWER_TOKEN
    assert (
        abs((answer.timestamp - span.start_time) / 1e9 - span.attributes[sc.LLM_SIDECAR_TTFAT])
        < 1e-6
    )
    assert answer.timestamp - first.timestamp >= 0.04e9


async def test_non_genai_route_is_a_plain_http_span(upstream, traced_sidecar, spans):
    provider, exporter = spans

    async def health(request):
        return web.Response(text="ok")

    up = await upstream.start(lambda app: app.router.add_get("/health", health))
    s = await traced_sidecar(up.url, tracer_provider=provider)
    async with aiohttp.ClientSession() as session:
        async with session.get(s.url + "/health?token=SECRET") as r:
            assert r.status == 200
    span = await one_span(exporter)
    assert span.name == "GET"
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert not [k for k in span.attributes if k.startswith("gen_ai.") or k == sc.URL_TEMPLATE]
    assert not any("SECRET" in text for text in all_strings(span))


async def test_span_names_use_the_bounded_model_label(upstream, traced_sidecar, spans):
    provider, exporter = spans
    done = [(0, b"data: [DONE]\n\n")]
    up = await upstream.start(lambda app: app.router.add_post("/v1/completions", scripted(done)))
    s = await traced_sidecar(up.url, tracer_provider=provider, max_models=1)
    for body in ({"model": "a", "prompt": "x"}, {"model": "b", "prompt": "x"}, {"prompt": "x"}):
        await post(s.url + "/v1/completions", body)
    await wait_for(lambda: len(exporter.get_finished_spans()) == 3)
    names = [
        (sp.name, sp.attributes.get(sc.GEN_AI_REQUEST_MODEL))
        for sp in exporter.get_finished_spans()
    ]
    assert names == [
        ("text_completion a", "a"),
        ("text_completion", "b"),
        ("text_completion", None),
    ]


# -- sampling and exemplars ---------------------------------------------------------------------


def exemplar_trace_ids(registry: CollectorRegistry, metric: str) -> set[str]:
    ids = set()
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == metric and sample.exemplar is not None:
                ids.add(sample.exemplar.labels["trace_id"])
    return ids


async def test_exemplars_carry_the_sampled_span_trace_id(upstream, traced_sidecar, spans):
    provider, exporter = spans
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, scripted(STREAM)))
    s = await traced_sidecar(up.url, tracer_provider=provider)
    await post(s.url + ROUTE)
    span = await one_span(exporter)
    trace_id = f"{span.context.trace_id:032x}"
    await wait_for(
        lambda: (
            s.sample("llm_requests_total", model="m1", route=ROUTE, code="200", outcome="ok") == 1
        )
    )
    for metric in (
        "llm_time_to_first_token_seconds_bucket",
        "llm_time_to_first_byte_seconds_bucket",
        "llm_time_per_output_token_seconds_bucket",
        "llm_request_duration_seconds_bucket",
    ):
        assert exemplar_trace_ids(s.registry, metric) == {trace_id}, metric
    # And in the OpenMetrics exposition a scraper asking for it receives.
    async with aiohttp.ClientSession() as session:
        headers = {"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"}
        async with session.get(s.admin_url + "/metrics", headers=headers) as r:
            text = await r.text()
    lines = [
        ln for ln in text.splitlines() if ln.startswith("llm_time_to_first_token_seconds_bucket{")
    ]
    assert any(f'# {{trace_id="{trace_id}"}}' in ln for ln in lines), lines


async def test_unsampled_requests_propagate_but_leave_no_exemplar(upstream, traced_sidecar):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    received: list = []
    up = await upstream.start(
        lambda app: app.router.add_post(ROUTE, scripted(STREAM, received=received))
    )
    s = await traced_sidecar(up.url, tracer_provider=provider)
    await post(s.url + ROUTE, headers={"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN, "00")})
    await post(s.url + ROUTE)  # a root the sampler drops
    await wait_for(
        lambda: (
            s.sample("llm_requests_total", model="m1", route=ROUTE, code="200", outcome="ok") == 2
        )
    )
    assert exporter.get_finished_spans() == ()
    assert exemplar_trace_ids(s.registry, "llm_time_to_first_token_seconds_bucket") == set()
    version, trace_id, span_id, flags = received[0]["traceparent"].split("-")
    assert (trace_id, flags) == (CLIENT_TRACE, "00") and span_id != CLIENT_SPAN
    provider.shutdown()


# -- OTel metrics -----------------------------------------------------------------------------------


async def test_otel_genai_client_metrics_with_semconv_buckets_and_exemplars(
    upstream, traced_sidecar, spans
):
    provider, exporter = spans
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, scripted(STREAM)))
    # The response's model is on the metrics only when it is a model label already (here
    # allowlisted), so an upstream cannot mint series.
    s = await traced_sidecar(
        up.url, tracer_provider=provider, meter_provider=meters, model_allowlist=["m1", "m1-2025"]
    )
    await post(s.url + ROUTE)
    span = await one_span(exporter)
    points = metric_points(reader)
    common = {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_PROVIDER_NAME: "openai",
        sc.GEN_AI_REQUEST_MODEL: "m1",
        sc.GEN_AI_RESPONSE_MODEL: "m1-2025",
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: up.port,
    }
    # The client view only: the model server's own names are the server's to emit.
    assert not [name for name in points if name.startswith("gen_ai.server.")]
    for name in (sc.METRIC_CLIENT_OPERATION_DURATION, sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK):
        (point,) = points[name]
        assert dict(point.attributes) == common, name
        assert tuple(point.explicit_bounds) == sc.BUCKETS_CLIENT_SECONDS, name
        assert point.count == 1
        assert [e.trace_id for e in point.exemplars] == [span.context.trace_id], name
    (ttfc,) = points[sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK]
    assert ttfc.sum == pytest.approx(span.attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK])
    # Five content chunks (the role-only chunk carries nothing): four after the first,
    # about 20 ms apart, one observation each.
    (tpoc,) = points[sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK]
    assert dict(tpoc.attributes) == common
    assert tuple(tpoc.explicit_bounds) == sc.BUCKETS_CLIENT_SECONDS
    assert tpoc.count == 4
    assert 0.06 <= tpoc.sum < 0.25
    usage = {p.attributes[sc.GEN_AI_TOKEN_TYPE]: p for p in points[sc.METRIC_CLIENT_TOKEN_USAGE]}
    assert (usage["input"].sum, usage["output"].sum) == (7, 5)
    assert tuple(usage["input"].explicit_bounds) == sc.BUCKETS_TOKEN_USAGE
    assert dict(usage["output"].attributes) == {**common, sc.GEN_AI_TOKEN_TYPE: "output"}
    meters.shutdown()


async def test_otel_metrics_error_request_only_in_duration(upstream, traced_sidecar):
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    up = await upstream.start(
        lambda app: app.router.add_post(
            ROUTE, scripted([(0, b"{}")], status=500, content_type="application/json")
        )
    )
    s = await traced_sidecar(up.url, meter_provider=meters)  # metrics without tracing
    assert s.sidecar.proxy.records._tracer is None
    await post(s.url + ROUTE)
    await wait_for(lambda: sc.METRIC_CLIENT_OPERATION_DURATION in metric_points(reader))
    points = metric_points(reader)
    (point,) = points[sc.METRIC_CLIENT_OPERATION_DURATION]
    assert point.attributes[sc.ERROR_TYPE] == "500"
    assert sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK not in points  # not a stream
    assert sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK not in points
    meters.shutdown()


async def test_otel_non_streamed_response_has_no_chunk_metrics(upstream, traced_sidecar):
    body = json.dumps(
        {"id": "c1", "model": "m1", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    ).encode()  # fmt: skip
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    up = await upstream.start(
        lambda app: app.router.add_post(
            ROUTE, scripted([(0, body)], content_type="application/json")
        )
    )
    s = await traced_sidecar(up.url, meter_provider=meters)
    await post(s.url + ROUTE, {"model": "m1", "messages": []})
    await wait_for(lambda: sc.METRIC_CLIENT_TOKEN_USAGE in metric_points(reader))
    points = metric_points(reader)
    (point,) = points[sc.METRIC_CLIENT_OPERATION_DURATION]
    assert sc.ERROR_TYPE not in point.attributes
    assert sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK not in points
    assert sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK not in points
    meters.shutdown()


async def test_otel_provider_name_is_configurable(upstream, traced_sidecar, spans):
    provider, exporter = spans
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, scripted(STREAM)))
    s = await traced_sidecar(
        up.url, tracer_provider=provider, meter_provider=meters, otel_provider_name="vllm"
    )
    await post(s.url + ROUTE)
    span = await one_span(exporter)
    assert span.attributes[sc.GEN_AI_PROVIDER_NAME] == "vllm"
    points = metric_points(reader)
    assert {p.attributes[sc.GEN_AI_PROVIDER_NAME] for ps in points.values() for p in ps} == {"vllm"}
    # "m1-2025" is not a model label (no allowlist; only requested names are admitted), so it
    # is left off the metrics and does not take one of the labeler's slots.
    assert not [p for ps in points.values() for p in ps if sc.GEN_AI_RESPONSE_MODEL in p.attributes]
    assert not s.sidecar.metrics.model_label.known("m1-2025")
    meters.shutdown()


async def test_otel_latest_genai_names_behind_opt_in(upstream, traced_sidecar, monkeypatch):
    """OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental: the current names
    (semantic-conventions-genai, see semconv.py): inference.* histograms, usage counters
    with gen_ai.token.modality (cache_read and reasoning too), per-operation token histograms."""
    monkeypatch.setenv(sc.SEMCONV_OPT_IN_ENV, "http,gen_ai_latest_experimental")
    script = [
        (0.0, chunk(role=True)),
        (0.02, chunk(reasoning="hmm")),
        (0.02, chunk("answer", finish="stop")),
        (0.0, b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,'
              b'"prompt_tokens_details":{"cached_tokens":6},'
              b'"completion_tokens_details":{"reasoning_tokens":3}}}\n\n'),
        (0.0, b"data: [DONE]\n\n"),
    ]  # fmt: skip
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, scripted(script)))
    s = await traced_sidecar(up.url, meter_provider=meters)
    for _ in range(2):
        await post(s.url + ROUTE)
    await wait_for(
        lambda: (
            sum(p.count for p in metric_points(reader).get(sc.METRIC_CLIENT_INFERENCE_DURATION, ()))
            == 2
        )
    )
    points = metric_points(reader)
    assert not [
        n
        for n in points
        if n.startswith("gen_ai.client.operation.") or n == sc.METRIC_CLIENT_TOKEN_USAGE
    ]
    for name in (
        sc.METRIC_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK,
        sc.METRIC_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK,
    ):
        (point,) = points[name]
        assert tuple(point.explicit_bounds) == sc.BUCKETS_CLIENT_SECONDS, name
        assert point.count == 2, name
    for name, value in (
        (sc.METRIC_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS, 9),
        (sc.METRIC_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS, 4),
    ):
        (point,) = points[name]
        assert (point.count, point.sum) == (2, 2 * value), name
        assert tuple(point.explicit_bounds) == sc.BUCKETS_TOKEN_USAGE, name
        assert sc.GEN_AI_TOKEN_MODALITY not in point.attributes, name
    counters = {
        sc.METRIC_CLIENT_INFERENCE_USAGE_INPUT_TOKENS: 9,
        sc.METRIC_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS: 4,
        sc.METRIC_CLIENT_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS: 6,
        sc.METRIC_CLIENT_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS: 3,
    }
    for name, value in counters.items():
        (point,) = points[name]
        assert point.value == 2 * value, name  # a counter: summed over the two requests
        assert point.attributes[sc.GEN_AI_TOKEN_MODALITY] == "unknown", name
        assert point.attributes[sc.GEN_AI_OPERATION_NAME] == "chat", name
    assert (
        sc.METRIC_CLIENT_INFERENCE_USAGE_CACHE_WRITE_INPUT_TOKENS not in points
    )  # no server reports it
    meters.shutdown()


# -- telemetry never breaks the relay ---------------------------------------------------------------


class _Broken:
    def __getattr__(self, name):
        if name in ("get_tracer", "get_meter"):
            return lambda *a, **k: self
        if name in ("create_histogram",):
            return lambda *a, **k: self
        raise RuntimeError(f"telemetry bug: {name}")


async def test_broken_telemetry_never_breaks_the_relay(upstream, traced_sidecar):
    up = await upstream.start(lambda app: app.router.add_post(ROUTE, scripted(STREAM)))
    s = await traced_sidecar(up.url, tracer_provider=_Broken(), meter_provider=_Broken())
    status, body = await post(s.url + ROUTE)
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")
    await wait_for(
        lambda: (
            s.sample("llm_requests_total", model="m1", route=ROUTE, code="200", outcome="ok") == 1
        )
    )
    assert s.sample("llm_time_to_first_token_seconds_count", model="m1") == 1


def test_without_providers_the_proxy_has_no_tracer():
    s = build_sidecar(
        Settings(upstream="http://127.0.0.1:1"), CollectorRegistry(), access_log=False
    )
    assert s.proxy.records._tracer is None
    assert s.proxy.records._recorders == (s.metrics.record, s.capacity.record)


async def test_ollama_native_route_provider_and_engine_timings(upstream, traced_sidecar, spans):
    provider, exporter = spans
    lines = [
        b'{"model":"qwen3:8b","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}\n',
        b'{"model":"qwen3:8b","message":{"role":"assistant","content":"Hi"},"done":false}\n',
        b'{"model":"qwen3:8b","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",'
        b'"load_duration":1000000,"prompt_eval_count":26,"prompt_eval_duration":300000000,'
        b'"eval_count":2,"eval_duration":40000000}\n',
    ]
    script = [(0.01, line) for line in lines]
    up = await upstream.start(
        lambda app: app.router.add_post(
            "/api/chat", scripted(script, content_type="application/x-ndjson")
        )
    )
    s = await traced_sidecar(up.url, tracer_provider=provider)
    await post(s.url + "/api/chat", {"model": "qwen3:8b", "messages": [], "stream": True})
    span = await one_span(exporter)
    a = span.attributes
    assert span.name == "chat qwen3:8b"
    assert a[sc.GEN_AI_PROVIDER_NAME] == "ollama"
    assert (a[sc.GEN_AI_USAGE_INPUT_TOKENS], a[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (26, 2)
    assert a[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert a[sc.LLM_SIDECAR_ENGINE_PREFILL] == pytest.approx(0.3)
    assert a[sc.LLM_SIDECAR_ENGINE_DECODE] == pytest.approx(0.04)
    assert [e.name for e in span.events] == [sc.EVENT_FIRST_TOKEN, sc.EVENT_FIRST_ANSWER_TOKEN]
