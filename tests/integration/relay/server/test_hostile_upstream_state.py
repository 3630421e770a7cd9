"""Bounded memory and no stalls, whatever one upstream event claims.

A ``serve`` subprocess in front of an upstream that streams hostile but well-formed events;
the sidecar's RSS and peak (``/proc``), its CPU time, and the admin port's ``/healthz`` answer
time are measured while the stream runs.

- Token counts: a chunk whose per-chunk usage says ``completion_tokens`` jumped by millions
  (alternating, so every other event claims it again). Held as one gap per token, one 300-byte
  event claiming +4 M tokens cost +199 MiB and a 0.6-1.4 s stall; +20 M, a 1 GiB peak (past
  the chart's 512 Mi limit) and a 5.8 s stall (past the 3 s readiness timeout). Tokens that
  arrive together are one entry standing for their count, so the cost is per event; the ITL
  histogram still counts one observation per token.
- Choice indices: a stream numbering its choices 0, 1, 2, ... grew the dialect's sets without
  bound, and every templated event the Python path decodes copied them (300 k indices: +51 MiB,
  then 100 escaped tokens 2.2 s of CPU). At most ``MAX_INDICES_PER_RESPONSE`` choices are
  tracked, and nothing is copied per event.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest

from sidecar.streams.protocols.events import MAX_INDICES_PER_RESPONSE
from tests.support.census import MiB, answer_times, proc_status, reset_peak
from tests.support.samples import per_model, sample_of
from tests.support.sse import http_chunk

pytestmark = pytest.mark.integration

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
CLAIM = 4_000_000  # tokens one event claims, alternately
BIG_CLAIM = 20_000_000  # the last claim, in one event
RSS_BOUND = 48 * MiB  # above the idle RSS, over the whole hostile stream
STALL_BOUND = 0.5  # seconds the admin port may take to answer, while it runs


def usage_event(completion: int, text: str = "x") -> bytes:
    return (
        b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"'
        + text.encode()
        + b'"},"finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":'
        + str(completion).encode()
        + b"}}\n\n"
    )


def choice_event(index: int, text: bytes = b"x") -> bytes:
    return (
        b'data: {"id":"c","model":"m","choices":[{"index":'
        + str(index).encode()
        + b',"delta":{"content":"'
        + text
        + b'"},"finish_reason":null}]}\n\n'
    )


FINISH = (
    b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


class PacedUpstream:
    """A raw upstream that answers each request with ``script``: a list of (bytes, pause)
    written one chunk each, so each piece reaches the sidecar in reads of its own."""

    def __init__(self, script: list[tuple[bytes, float]]) -> None:
        self.script = script
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: the sidecar's pool sends the next request on this one
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"POST "):  # the sidecar's own probes
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(HEAD)
                for piece, pause in self.script:
                    writer.write(http_chunk(piece))
                    await writer.drain()
                    if pause:
                        await asyncio.sleep(pause)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_hostile(serve_process, script: list[tuple[bytes, float]]):
    """Warm the sidecar with one plain stream, then stream ``script`` while probing
    ``/healthz``; returns (RSS growth, peak growth, slowest /healthz, CPU s, body, metrics)."""
    up = PacedUpstream([(usage_event(1) + FINISH, 0.0)])
    url = await up.start()
    sc = serve_process(url)
    try:
        await sc.wait_alive()
        pid = sc.proc.pid
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as s:
            async with s.post(sc.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
            await asyncio.sleep(0.3)
            up.script = script
            before = proc_status(pid, "VmRSS")
            reset_peak(pid)
            cpu_before = cpu_seconds(pid)
            async with answer_times(s, sc.admin_url + "/healthz") as waits:
                async with s.post(sc.url + "/v1/chat/completions", json=body) as r:
                    got = await r.read()
                await asyncio.sleep(0.3)  # the record is made after the last byte
            rss = proc_status(pid, "VmRSS") - before
            peak = proc_status(pid, "VmHWM") - before
            cpu = cpu_seconds(pid) - cpu_before
            metrics = await sc.metrics()
    finally:
        await up.close()
    print(
        f"rss +{rss / MiB:.1f} MiB, peak +{peak / MiB:.1f} MiB, cpu {cpu:.2f} s, "
        f"/healthz slowest {max(waits) * 1e3:.0f} ms of {len(waits)}"
    )
    return rss, peak, max(waits), len(waits), cpu, got, metrics


async def test_millions_of_tokens_claimed_in_one_event_cost_one_entry(serve_process):
    script: list[tuple[bytes, float]] = []
    completion, expected_tokens = 0, 0
    for i in range(40):
        # odd events claim CLAIM more tokens than the last; even ones fall back to 1 (a count
        # that shrank is no claim: that event is one token, as its delta says)
        completion = completion + CLAIM if i % 2 else 1
        expected_tokens += CLAIM if i % 2 else 1
        script.append((usage_event(completion), 0.01))
    completion += BIG_CLAIM
    expected_tokens += BIG_CLAIM
    script.append((usage_event(completion), 0.01))
    script.append((FINISH, 0.0))
    rss, peak, slowest, probes, cpu, got, metrics = await run_hostile(serve_process, script)

    assert got == b"".join(piece for piece, _ in script)  # every byte relayed, unchanged
    labels = {"model": "m", "route": "/v1/chat/completions"}
    # The figures are per token, as if each had come alone: one ITL observation per token
    # after the first, and the output count the last usage said.
    # (the warm-up's one token has no gap)
    itl = sample_of(metrics, "llm_inter_token_latency_seconds_count", **per_model(labels))
    assert itl == expected_tokens - 1
    assert sample_of(metrics, "llm_tokens_total", type="output", **labels) == 1 + completion
    assert peak < RSS_BOUND, peak
    assert rss < RSS_BOUND, rss
    assert probes >= 5 and slowest < STALL_BOUND, slowest
    assert cpu < 2.0, cpu


async def test_endless_choice_indices_are_bounded_and_copied_by_no_event(serve_process):
    indices = 150_000
    bulk = b"".join(choice_event(i) for i in range(indices))
    script: list[tuple[bytes, float]] = [
        (bulk[i : i + (1 << 20)], 0.0) for i in range(0, len(bulk), 1 << 20)
    ]
    # A plain event repeated with a changing text arms the template; the same shape with an
    # escaped text is then decoded by the Python path, one read each, which compared copies
    # of the choice sets before and after every such event.
    script += [(choice_event(0, b"t%d" % i), 0.002) for i in range(8)]
    script += [(choice_event(0, b"\\u00e9%d" % i), 0.002) for i in range(400)]
    script.append((FINISH, 0.0))
    rss, peak, slowest, probes, cpu, got, metrics = await run_hostile(serve_process, script)

    assert got == b"".join(piece for piece, _ in script)
    labels = {"model": "m", "route": "/v1/chat/completions"}
    assert sample_of(metrics, "llm_tokens_total", type="output", **labels) == 1 + indices + 408
    assert MAX_INDICES_PER_RESPONSE == 128
    assert peak < RSS_BOUND, peak
    assert probes >= 5 and slowest < STALL_BOUND, slowest
    # The stream's own decoding (~150 k JSON events) costs CPU; the 400 escaped events on top
    # must not cost a copy of 150 k indices each (seconds, before).
    assert cpu < 8.0, cpu
