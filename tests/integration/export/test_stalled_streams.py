"""Streams in flight seen while they run, over real sockets: a scripted upstream that stops
mid-stream with its connection open, one that never sends a first token, a slow but moving
stream, an idle pod. The sidecar is the production one (``build_sidecar``: its proxy port
and its admin port), and every figure is read from ``/metrics`` scraped over HTTP, as
Prometheus reads it; the opt-in ``/stallz`` probe from the same admin port.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from sidecar.app import ProxyRunner, build_sidecar
from sidecar.config import Settings
from sidecar.export import semconv as sc
from tests.support.scripted_server import Peer, ScriptedServer
from tests.support.sse import CHUNKED_HEAD, DONE, LAST_CHUNK, chat_chunk, http_chunk
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

STALL = 2.0  # --stall-seconds in these tests (a loaded 2-core machine may pause a loop ~1 s)
PROBE = 3.5  # --stall-probe-seconds
BODY = b'{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true}'
ROUTE = "/v1/chat/completions"


def post(body: bytes = BODY) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar.test\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )


class Pod:
    """A sidecar (proxy and admin port, each on a free port) in front of a scripted upstream."""

    def __init__(self, script, tracer_provider=None, meter_provider=None, **settings) -> None:
        self.script = script
        self.providers = {"tracer_provider": tracer_provider, "meter_provider": meter_provider}
        self.settings = {"stall_seconds": STALL, "model_allowlist": ["m1"], **settings}

    async def __aenter__(self) -> Pod:
        self.upstream = await ScriptedServer(self.script).start()
        try:
            self.sc = build_sidecar(
                Settings(upstream=self.upstream.url, **self.settings),
                CollectorRegistry(),
                access_log=False,
                **self.providers,
            )
            self.proxy = ProxyRunner(self.sc, shutdown_timeout=1.0)
            await self.proxy.setup()
            await self.proxy.listen("127.0.0.1", 0)
            self.port = self.proxy.addresses[0][1]
            self.admin = web.AppRunner(self.sc.admin_app)
            await self.admin.setup()
            site = web.TCPSite(self.admin, "127.0.0.1", 0)
            await site.start()
            self.admin_port = self.admin.addresses[0][1]
            self.http = aiohttp.ClientSession()
        except BaseException:
            await self.upstream.stop()
            raise
        self.clients: list[asyncio.StreamWriter] = []
        return self

    async def __aexit__(self, *exc) -> None:
        for writer in self.clients:
            writer.close()
        await self.http.close()
        await self.admin.cleanup()
        await self.proxy.cleanup()
        for peer in self.upstream.peers:
            peer.go.set()
        await self.upstream.stop()

    async def open_stream(self, body: bytes = BODY) -> asyncio.StreamReader:
        """A client that sent a request and keeps reading whatever comes."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.clients.append(writer)
        writer.write(post(body))
        return reader

    async def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The admin port's /metrics: {(sample name, sorted labels): value}."""
        async with self.http.get(f"http://127.0.0.1:{self.admin_port}/metrics") as r:
            assert r.status == 200
            text = await r.text()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    async def stalled(self, phase: str | None = None) -> float:
        page = await self.scrape()
        return sum(
            v
            for (name, labels), v in page.items()
            if name == "llm_streams_stalled" and (phase is None or ("phase", phase) in labels)
        )

    async def probe(self) -> tuple[int, dict]:
        async with self.http.get(f"http://127.0.0.1:{self.admin_port}/stallz") as r:
            return r.status, await r.json()


def labels(phase: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"model": "m1", "route": ROUTE, "phase": phase}.items()))


def token(text: str = "tok") -> bytes:
    return http_chunk(chat_chunk(text))


END = http_chunk(chat_chunk(finish="stop")) + http_chunk(DONE) + LAST_CHUNK


async def read_past(reader: asyncio.StreamReader, marker: bytes) -> None:
    await asyncio.wait_for(reader.readuntil(marker), 10)


async def test_a_stream_that_stops_is_stalled_one_scrape_after_the_threshold_and_clears_when_tokens_resume():
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD + token("first") + token("second"))
        await peer.go.wait()  # the engine hangs: no byte, the connection open
        peer.send(token("resumed"))
        await peer.go.wait()
        peer.send(END)

    async with Pod(script) as pod:
        reader = await pod.open_stream()
        await read_past(reader, b"second")
        began = time.monotonic()
        page = await pod.scrape()
        assert page[("llm_requests_in_phase", labels("decode"))] == 1
        assert ("llm_streams_stalled", labels("decode")) not in page  # under the threshold
        await asyncio.sleep(STALL - (time.monotonic() - began) + 0.2)
        assert await pod.stalled("decode") == 1  # the first scrape past the threshold
        assert await pod.stalled("first_token") == 0
        page = await pod.scrape()
        assert page[("llm_requests_in_phase_oldest_seconds", labels("decode"))] >= STALL
        pod.upstream.peers[0].go.set()
        await read_past(reader, b"resumed")
        assert await pod.stalled() == 0  # the next scrape after a token
        pod.upstream.peers[0].go.set()
        await read_past(reader, b"0\r\n\r\n")
        await wait_for(lambda: pod.sc.proxy.records.in_flight == 0)
        page = await pod.scrape()
        assert not [
            k for k in page if k[0].startswith(("llm_streams_stalled", "llm_requests_in_phase"))
        ]


async def test_a_stream_waiting_for_its_first_token_past_the_threshold_counts_in_its_own_phase():
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD)  # the head, then nothing: a first token that never comes
        await peer.go.wait()
        peer.send(token("late") + END)

    async with Pod(script) as pod:
        reader = await pod.open_stream()
        await read_past(reader, b"\r\n\r\n")
        await wait_for(lambda: pod.sc.proxy.records.in_flight == 1)
        page = await pod.scrape()
        assert page[("llm_requests_in_phase", labels("first_token"))] == 1
        assert ("llm_streams_stalled", labels("first_token")) not in page  # none stalled yet
        await asyncio.sleep(STALL + 0.2)
        page = await pod.scrape()
        assert page[("llm_streams_stalled", labels("first_token"))] == 1
        assert ("llm_streams_stalled", labels("decode")) not in page
        pod.upstream.peers[0].go.set()
        await read_past(reader, b"late")
        await read_past(reader, b"0\r\n\r\n")
        assert await pod.stalled() == 0


async def test_a_stream_request_without_a_response_head_counts_in_the_head_phase_a_whole_one_never():
    async def script(peer: Peer) -> None:
        await peer.read_request()  # and no answer at all
        await peer.go.wait()

    async with Pod(script) as pod:
        await pod.open_stream()
        await pod.open_stream(BODY.replace(b'"stream":true', b'"stream":false'))
        await wait_for(lambda: pod.upstream.accepted == 2 and pod.sc.proxy.records.in_flight == 2)
        await asyncio.sleep(STALL + 0.2)
        page = await pod.scrape()
        assert page[("llm_requests_in_phase", labels("head"))] == 2
        assert page[("llm_streams_stalled", labels("head"))] == 1  # the one that asked to stream


async def test_a_slow_but_moving_stream_never_counts_and_an_idle_pod_exports_no_series():
    gap = STALL / 3

    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD)
        for i in range(12):  # 4 thresholds long, a token every third of one
            peer.send(token(f"t{i}"))
            await asyncio.sleep(gap)
        peer.send(END)

    async with Pod(script) as pod:
        page = await pod.scrape()
        assert not [
            k for k in page if k[0].startswith(("llm_streams_stalled", "llm_requests_in_phase"))
        ]
        reader = await pod.open_stream()
        await read_past(reader, b"t0")
        seen = []
        while pod.sc.proxy.records.in_flight:
            seen.append(await pod.stalled())
            await asyncio.sleep(gap / 2)
        assert len(seen) >= 10 and not any(seen)
        page = await pod.scrape()
        assert not [
            k for k in page if k[0].startswith(("llm_streams_stalled", "llm_requests_in_phase"))
        ]


async def test_the_probe_is_off_unless_asked_for_and_then_listed_in_the_admin_index():
    async with Pod(serve_nothing) as pod:
        async with pod.http.get(f"http://127.0.0.1:{pod.admin_port}/stallz") as r:
            assert r.status == 404
        async with pod.http.get(f"http://127.0.0.1:{pod.admin_port}/") as r:
            assert "/stallz" not in await r.text()
    async with Pod(serve_nothing, stall_probe_seconds=PROBE) as pod:
        assert await pod.probe() == (
            200,
            {
                "in_flight": 0,
                "stalled": 0,
                "stall_seconds": PROBE,
                "longest_silence_seconds": 0.0,
                "seconds_since_completed": None,
                "stalled_engine": False,
            },
        )  # an idle engine is never restarted
        async with pod.http.get(f"http://127.0.0.1:{pod.admin_port}/") as r:
            assert "/stallz" in await r.text()


async def serve_nothing(peer: Peer) -> None:
    await peer.go.wait()


async def test_the_probe_fails_on_a_hung_engine_only_and_recovers_when_tokens_resume():
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD + token("first"))
        await peer.go.wait()
        peer.send(token("resumed"))
        await peer.go.wait()
        peer.send(END)

    async with Pod(script, stall_probe_seconds=PROBE) as pod:
        readers = [await pod.open_stream(), await pod.open_stream()]
        for reader in readers:
            await read_past(reader, b"first")
        await asyncio.sleep(STALL + 0.2)
        status, doc = await pod.probe()
        assert (status, doc["stalled"]) == (200, 0)  # stalled for the alert, not yet the probe
        assert await pod.stalled() == 2
        await asyncio.sleep(PROBE - STALL)
        status, doc = await pod.probe()
        assert status == 503
        assert doc["stalled_engine"] is True and doc["in_flight"] == 2 and doc["stalled"] == 2
        assert doc["longest_silence_seconds"] >= PROBE
        for peer in pod.upstream.peers:
            peer.go.set()
        for reader in readers:
            await read_past(reader, b"resumed")
        assert (await pod.probe())[0] == 200


async def test_the_probe_holds_while_another_stream_moves_or_a_request_completed():
    async def script(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:  # a pooled connection's too
            await answer(peer, request)

    async def answer(peer: Peer, request: bytes) -> None:
        if b"moving" in request:
            peer.send(CHUNKED_HEAD)
            for i in range(int((PROBE + 1.5) / 0.25)):  # past the probe sleep below
                peer.send(token(f"m{i}"))
                await asyncio.sleep(0.25)
            peer.send(END)
        elif b"quick" in request:
            peer.send(CHUNKED_HEAD + token("q") + END)
        else:
            peer.send(CHUNKED_HEAD + token("stuck"))
            await peer.go.wait()

    moving = BODY.replace(b'"hi"', b'"moving"')
    quick = BODY.replace(b'"hi"', b'"quick"')
    async with Pod(script, stall_probe_seconds=PROBE) as pod:
        stuck = await pod.open_stream()
        await read_past(stuck, b"stuck")
        other = await pod.open_stream(moving)
        await read_past(other, b"m0")
        await asyncio.sleep(PROBE + 0.3)
        status, doc = await pod.probe()
        assert (status, doc["stalled"], doc["in_flight"]) == (200, 1, 2)  # a busy engine
        await read_past(other, b"0\r\n\r\n")
        await wait_for(lambda: pod.sc.proxy.records.in_flight == 1)
        done = await pod.open_stream(quick)
        await read_past(done, b"0\r\n\r\n")
        await wait_for(lambda: pod.sc.proxy.records.in_flight == 1)
        status, doc = await pod.probe()
        assert status == 200 and doc["seconds_since_completed"] < PROBE  # it answered one
        await asyncio.sleep(PROBE + 0.1)
        assert (await pod.probe())[0] == 503  # nothing since: the stuck stream is the engine's


def stalled_points(reader: InMemoryMetricReader) -> dict[str, float]:
    """{phase: value} of llm_sidecar.client.streams.stalled at one collection."""
    data = reader.get_metrics_data()
    return {
        point.attributes[sc.LLM_SIDECAR_STALL_PHASE]: point.value
        for rm in (data.resource_metrics if data is not None else ())
        for scope in rm.scope_metrics
        for metric in scope.metrics
        if metric.name == sc.METRIC_OWN_STREAMS_STALLED
        for point in metric.data.data_points
    }


async def test_otel_has_the_stall_count_as_a_gauge_and_the_span_an_event_where_the_stream_stopped():
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD + token("first"))
        await peer.go.wait()
        peer.send(token("resumed") + END)

    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    async with Pod(script, tracer_provider=tracer, meter_provider=meters, otel_metrics=True) as pod:
        assert stalled_points(reader) == {}  # idle: nothing observed
        reader_ = await pod.open_stream()
        await read_past(reader_, b"first")
        stopped = time.time_ns()
        assert stalled_points(reader) == {"decode": 0}
        await asyncio.sleep(STALL + 0.2)
        assert stalled_points(reader) == {"decode": 1}
        await wait_for(lambda: pod.sc.stall_watch is not None and pod.sc.proxy.records.open_records
                       and next(iter(pod.sc.proxy.records.open_records)).stall_noted)  # fmt: skip
        pod.upstream.peers[0].go.set()
        await read_past(reader_, b"0\r\n\r\n")
        await wait_for(lambda: len(exporter.get_finished_spans()) == 1)
    (span,) = exporter.get_finished_spans()
    (event,) = [e for e in span.events if e.name == sc.EVENT_STALLED]
    assert dict(event.attributes) == {
        sc.LLM_SIDECAR_STALL_PHASE: "decode",
        sc.LLM_SIDECAR_STALL_SECONDS: STALL,
    }
    # Stamped at the last byte before the stop, not when the watch noticed it.
    assert abs(event.timestamp - stopped) < 0.5e9
    (first,) = [e for e in span.events if e.name == sc.EVENT_FIRST_TOKEN]
    assert first.timestamp <= event.timestamp < span.end_time
