"""Real vLLM (CPU; default flags and --enable-force-include-usage), real llama.cpp and real
Hugging Face ``transformers serve`` (whose streams end with a finish_reason + usage chunk and
never send ``[DONE]``: every request must still be ``ok``) behind the sidecar: the client's
bytes are the server's, and what the sidecar measured agrees with what the server reported.

For each route a server serves, streamed and not, with and without
``stream_options.include_usage``, one request goes through the sidecar, whose upstream is a
wire tap (tests/real/tap.py: a TCP pipe that records both directions) in front of the
server. Then, for that very request:

- the relay changes nothing: the status, end-to-end headers and body the client got are
  byte for byte the ones the server sent, and the server received the client's body byte
  for byte and every end-to-end header the client sent (Host, hop-by-hop and the proxy's
  own X-Forwarded-* aside);
- the measurements: one TTFT per streamed request, ITL count = content chunks - 1 (more
  where vLLM's per-chunk usage shows a chunk carried several tokens), output
  and input tokens = the server's usage when it reported one, else llama.cpp's own counts
  (its ``timings``), else the stream's content chunks, flagged as estimated.

(An earlier version compared with a separate direct request under a mask of volatile keys;
vLLM splits a request's tokens into events by its own timing, so on a busy machine no two
requests agreed and the comparison failed for the server's reasons, not the sidecar's.)

Marked ``real``: deselected from the default run; ``make test-real`` installs the servers
(cached under .tools/) and runs this.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import aiohttp
import pytest

from sidecar.measure.timeline import TokenCountSource
from tests.real.conftest import LIVE_KINDS
from tests.real.servers import Case, ServerKind, cases
from tests.real.tap import Exchange, WireTap
from tests.real.wire import (
    content_events,
    engine_counts,
    json_events,
    reported_usage,
    token_arrivals,
)
from tests.support.waits import wait_for

pytestmark = pytest.mark.real

# Each end's connection headers; Host names the hop; the proxy adds its X-Forwarded-*.
_PER_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "host",
}
_PROXY_ADDED = {"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"}

PARAMS = [
    pytest.param(kind, case, id=f"{kind.name}-{case.name}")
    for kind in LIVE_KINDS
    for case in cases(kind)
]


def end_to_end(headers) -> list[tuple[str, str]]:
    """``(name, value)`` pairs, names lower-cased, without the per-hop ones, in order."""
    return [(k.lower(), v) for k, v in headers if k.lower() not in _PER_HOP]


def metric(registry, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


@pytest.mark.parametrize(("kind", "case"), PARAMS)
async def test_relay_is_byte_exact_and_measures_what_the_server_reported(
    live_servers, sidecar_factory, kind: ServerKind, case: Case
):
    server = live_servers.get(kind)
    where = urlsplit(server.url)
    tap = await WireTap(where.hostname, where.port).start()
    running = await sidecar_factory(tap.url)
    summaries: list = []
    # The proxy's recorders are fixed at build time; add a capture beside the metrics.
    proxy = running.sidecar.proxy
    proxy.records._recorders = (*proxy.records._recorders, summaries.append)
    sent = json.dumps(case.body(kind.model)).encode()
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(auto_decompress=False, timeout=timeout) as session:
            async with session.post(
                running.url + case.route, data=sent, headers={"Content-Type": "application/json"}
            ) as resp:
                via = b"".join([chunk async for chunk in resp.content.iter_any()])
                status, got_headers, client_sent = (
                    resp.status,
                    resp.raw_headers,
                    resp.request_info.headers,
                )
        await wait_for(lambda: len(summaries) == 1, timeout=10)
        generations = [x for x in tap.exchanges() if (x.method, x.target) == ("POST", case.route)]
    finally:
        await tap.close()
    assert len(generations) == 1, (
        f"the server should have seen this one request, saw {len(generations)}"
    )
    seen: Exchange = generations[0]

    # The relay: the server got the client's request, the client got the server's answer.
    assert seen.request_body == sent, "the sidecar changed the request body"
    received = [(k, v) for k, v in end_to_end(seen.request_headers) if k not in _PROXY_ADDED]
    assert received == end_to_end(client_sent.items()), "the sidecar changed the request headers"
    assert status == seen.status
    decoded = [(k.decode(), v.decode("latin-1")) for k, v in got_headers]
    assert end_to_end(decoded) == end_to_end(seen.response_headers), (
        "the sidecar changed the response headers"
    )
    assert via == seen.response_body, "the sidecar changed the response body"

    summary = summaries[0]
    registry = running.registry
    route = {"route": case.route}
    assert metric(registry, "llm_requests_total", outcome="ok", code=str(status), **route) == 1
    assert summary.parse_errors == 0
    if status != 200:
        assert case.include_usage and not case.stream  # stream_options without stream: a 400
        return

    events = json_events(via, case.stream)
    chunks = content_events(events)
    usage = reported_usage(events)
    outputs = metric(registry, "llm_tokens_total", type="output", **route)
    inputs = metric(registry, "llm_tokens_total", type="input", **route)
    if case.stream:
        assert chunks >= 2, "the tiny model should stream several content chunks"
        assert metric(registry, "llm_time_to_first_token_seconds_count") == 1  # per model
        # One gap between consecutive arrivals: content chunks - 1 (more when per-chunk usage
        # says a chunk carried several tokens).
        assert (
            metric(registry, "llm_inter_token_latency_seconds_count") == token_arrivals(events) - 1
        ), via.decode("utf-8", "replace")
    else:
        assert metric(registry, "llm_time_to_first_token_seconds_count") == 0
    engine = engine_counts(events)
    if usage is not None:
        assert summary.token_count_source is TokenCountSource.USAGE
        assert (outputs, inputs) == (usage["output"], usage["input"])
    elif engine is not None:  # llama.cpp without usage: its timings still count
        assert summary.token_count_source is TokenCountSource.ENGINE
        assert (outputs, inputs) == (engine["output"], engine["input"])
    else:
        assert case.stream, "a non-streamed answer always carries its counts"
        assert summary.token_count_source is TokenCountSource.ESTIMATED, (
            "an estimate must be flagged"
        )
        assert outputs == token_arrivals(events) and inputs == 0
