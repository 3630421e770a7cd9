"""Memory benchmark: the sidecar's RSS per concurrent stream and for the largest accepted
request body, against the Helm chart's default memory limit.

    .venv/bin/python -m bench.memory                       # 100 and 400 streams, the 31.5 MiB body
    .venv/bin/python -m bench.memory --streams 50 --json memory.json
    .venv/bin/python -m bench.run --memory ...             # the same, in the relay bench's report

One ``llm-sidecar serve`` subprocess (access log off) in front of an upstream in this
process that answers every streaming chat request with a role event and then one token
every half second, for as long as the client stays. Read from ``/proc/PID/status``:

- idle RSS after one warm-up stream;
- RSS with N streams open at once (every one has received its first token), and
  ``(RSS - idle) / N`` per stream;
- the peak (``VmHWM``, reset through ``clear_refs`` first) while a chat body of the largest
  size the sidecar reads to learn its model (``max_request_inspect_bytes``, 32 MiB by
  default: 1.1 M small messages, 31.5 MiB) is relayed, and the RSS while its answer streams.

Then how many such streams fit in the chart's limit beside one largest body, and the
hostile mixes of issue 23 (``--attacks``, on by default), each against the same process:
its peak RSS, the RSS a second after it ended (is memory returned?) and the slowest
``/healthz`` answer while it ran:

- ``unended_heads``: 200 connections each sending 126 header fields of 8,000 B, never
  ending the head (finding 1);
- ``withheld_bodies``: 16 API bodies of 30 MiB, the last byte of each withheld (finding 2);
- ``huge_json_answer``: one non-streamed answer of 15.9 MiB ``{"choices":[{},{},...]}``
  (finding 3).

Measured, never asserted: the tests that bound memory are
``tests/integration/relay/server/test_hostile_memory.py``, ``test_hostile_body_budget.py`` and
``test_hostile_requests.py`` (a whole head's budget).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
CHAT = b"/v1/chat/completions"


@functools.cache
def huge_json() -> bytes:
    """A 15.9 MiB non-streamed answer of 5.5 million empty choices, just under the largest
    answer the sidecar reads (``max_response_inspect_bytes``, 16 MiB; issue 23, finding 3)."""
    return (
        b'{"choices":['
        + b"{}," * (5_550_000 - 1)
        + b'{}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    )


def chart_memory_limit() -> int:
    """The chart's default sidecar memory limit, in bytes (``512Mi``)."""
    values = yaml.safe_load((ROOT / "helm" / "llm-sidecar" / "values.yaml").read_text())
    text = str(values["sidecar"]["resources"]["limits"]["memory"])
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for {pid}")


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlowUpstream:
    """Streams a role event, then a token every ``tpot`` seconds until the client leaves;
    reads any body whole first (as a server must before it can start)."""

    def __init__(self, tpot: float = 0.5) -> None:
        self.tpot = tpot
        self.streams_started = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while length:
                    data = await reader.read(min(length, MiB))
                    if not data:
                        return
                    length -= len(data)
                if head.startswith(b"POST /v1/completions "):  # the huge_json_answer attack
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                        % len(huge_json())
                    )
                    writer.write(huge_json())
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                self.streams_started += 1
                role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
                writer.write(b"%x\r\n%b\r\n" % (len(role), role))
                while True:
                    token = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
                    writer.write(b"%x\r\n%b\r\n" % (len(token), token))
                    await writer.drain()
                    await asyncio.sleep(self.tpot)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the bench ends (its streams are cancelled then)
        finally:
            writer.close()


async def open_stream(port: int, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (CHAT, len(body))
    )
    view = memoryview(body)
    for i in range(0, len(body), MiB):
        writer.write(view[i : i + MiB])
        await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    await reader.readuntil(b'"content"')  # the first token arrived through the sidecar
    return reader, writer


def largest_body(limit: int) -> bytes:
    """A chat body of many small messages, as large as fits in ``limit``."""
    message = b'{"role":"user","content":"x"},'
    head, tail = b'{"model":"m","stream":true,"messages":[', b'{"role":"user","content":"x"}]}'
    n = (limit - len(head) - len(tail) - 1) // len(message)
    return head + message * n + tail


async def measure(stream_counts: list[int], body_limit: int, attacks: tuple[str, ...] = ()) -> dict:
    upstream = SlowUpstream()
    up_port = await upstream.start()
    port, admin = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--upstream", f"http://127.0.0.1:{up_port}",
         "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{admin}", "--access-log", "false",
         "--drain-seconds", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LLM_SIDECAR_"))},
    )  # fmt: skip
    small = orjson.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                r, w = await open_stream(port, small)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        w.close()
        await asyncio.sleep(0.5)
        idle = status_bytes(proc.pid, "VmRSS")
        report: dict = {"idle_rss_mib": idle / MiB, "streams": []}
        for n in stream_counts:
            conns = await asyncio.gather(*(open_stream(port, small) for _ in range(n)))
            await asyncio.sleep(1.0)
            rss = status_bytes(proc.pid, "VmRSS")
            report["streams"].append(
                {"concurrent": n, "rss_mib": rss / MiB, "kib_per_stream": (rss - idle) / n / 1024}
            )
            for _, w in conns:
                w.close()
            await asyncio.sleep(1.0)
        body = largest_body(body_limit)
        base = status_bytes(proc.pid, "VmRSS")
        reset_peak(proc.pid)
        r, w = await open_stream(port, body)
        body_len = len(body)
        del body
        await asyncio.sleep(0.5)
        report["largest_body"] = {
            "bytes": body_len,
            "rss_before_mib": base / MiB,
            "peak_rss_mib": status_bytes(proc.pid, "VmHWM") / MiB,
            "rss_while_streaming_mib": status_bytes(proc.pid, "VmRSS") / MiB,
        }
        w.close()
        report["attacks"] = {}
        for name in attacks:
            report["attacks"][name] = await attack(proc.pid, port, admin, ATTACKS[name])
    finally:
        # Waited for off the event loop: the upstream the sidecar drains against runs here.
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
        upstream.server.close()
    limit = chart_memory_limit()
    per_stream = max(s["kib_per_stream"] for s in report["streams"]) * 1024
    body_peak = report["largest_body"]["peak_rss_mib"] * MiB
    report["chart_limit_mib"] = limit / MiB
    report["peak_with_largest_body_vs_limit"] = body_peak / limit
    report["streams_that_fit_beside_largest_body"] = (
        int((limit - body_peak) / per_stream) if per_stream > 0 else None
    )
    return report


PROBE = """
import socket, sys, time
port, worst = int(sys.argv[1]), 0.0
while not sys.stdin.readline().startswith("stop"):
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        while s.recv(65536):
            pass
    worst = max(worst, time.perf_counter() - start)
print(worst)
"""
"""Asks /healthz each time it reads a line, from a process of its own: the attacks keep this
process's event loop busy, so a probe here would time the bench, not the sidecar."""


async def _unended_heads(port: int) -> None:
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-F%d: %s\r\n" % (i, b"v" * 7990) for i in range(126)
    )
    conns = []
    for _ in range(200):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(head)
        conns.append((r, w))
    await asyncio.gather(*(w.drain() for _, w in conns), return_exceptions=True)
    await asyncio.sleep(1.0)
    for _, w in conns:
        w.close()


async def _withheld_bodies(port: int) -> None:
    body = b'{"model":"m","stream":true,"pad":"' + b"p" * (30 * MiB - 40) + b'"}'
    view = memoryview(body)

    async def one():
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(
            b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (CHAT, len(body))
        )
        for i in range(0, len(body) - 1, MiB):
            w.write(view[i : min(i + MiB, len(body) - 1)])
            await w.drain()
        return w

    writers = await asyncio.gather(*(one() for _ in range(16)))
    await asyncio.sleep(1.0)
    for w in writers:
        w.close()


async def _huge_json_answer(port: int) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"model":"m","prompt":"hi"}'
    w.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
        % (len(body), body)
    )
    await r.readuntil(b"\r\n\r\n")
    await r.readexactly(len(huge_json()))
    await asyncio.sleep(0.5)  # the answer is measured after its last byte
    w.close()


ATTACKS = {
    "unended_heads": _unended_heads,
    "withheld_bodies": _withheld_bodies,
    "huge_json_answer": _huge_json_answer,
}


async def attack(pid: int, port: int, admin: int, run) -> dict:
    """One hostile mix: peak RSS while it ran, RSS a second after, the slowest /healthz."""
    await asyncio.sleep(0.5)
    before = status_bytes(pid, "VmRSS")
    reset_peak(pid)
    probe = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(admin)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    task = asyncio.ensure_future(run(port))
    while not task.done():
        probe.stdin.write("probe\n")
        probe.stdin.flush()
        await asyncio.sleep(0.05)
    task.result()
    worst = float((await asyncio.to_thread(probe.communicate, "stop\n", 60))[0])
    peak = status_bytes(pid, "VmHWM")
    await asyncio.sleep(1.0)
    return {
        "rss_before_mib": before / MiB,
        "peak_rss_mib": peak / MiB,
        "rss_after_mib": status_bytes(pid, "VmRSS") / MiB,
        "healthz_max_ms": worst * 1000,
    }


def print_report(report: dict) -> None:
    print(
        f"\nmemory (chart limit {report['chart_limit_mib']:.0f} MiB): idle RSS {report['idle_rss_mib']:.1f} MiB"
    )
    for s in report["streams"]:
        print(
            f"  {s['concurrent']:>5} streams open: RSS {s['rss_mib']:.1f} MiB, {s['kib_per_stream']:.1f} KiB per stream"
        )
    b = report["largest_body"]
    print(
        f"  largest accepted body {b['bytes'] / MiB:.1f} MiB: peak RSS {b['peak_rss_mib']:.1f} MiB "
        f"({report['peak_with_largest_body_vs_limit']:.0%} of the limit), {b['rss_while_streaming_mib']:.1f} MiB while its answer streams"
    )
    print(
        f"  streams that fit in the limit beside one largest body: {report['streams_that_fit_beside_largest_body']}"
    )
    for name, a in report.get("attacks", {}).items():
        print(
            f"  attack {name}: peak RSS {a['peak_rss_mib']:.1f} MiB ({a['peak_rss_mib'] / report['chart_limit_mib']:.0%} of the limit), "
            f"{a['rss_before_mib']:.1f} before, {a['rss_after_mib']:.1f} a second after; /healthz at most {a['healthz_max_ms']:.0f} ms"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n")[0])
    p.add_argument(
        "--streams", default="100,400", help="concurrent streams to hold open, a comma list"
    )
    p.add_argument(
        "--body-bytes",
        type=int,
        default=32 << 20,
        help="largest body (the sidecar's max_request_inspect_bytes)",
    )
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--attacks",
        default=",".join(ATTACKS),
        help=f"hostile mixes to run, a comma list of {', '.join(ATTACKS)} (empty: none)",
    )
    args = p.parse_args(argv)
    attacks = tuple(a for a in args.attacks.split(",") if a)
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        p.error(f"unknown attack(s): {', '.join(sorted(unknown))}")
    report = asyncio.run(
        measure([int(n) for n in args.streams.split(",")], args.body_bytes, attacks)
    )
    print_report(report)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
