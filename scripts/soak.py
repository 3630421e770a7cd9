#!/usr/bin/env python3
"""Soak: hundreds of concurrent streams for minutes through one ``llm-sidecar serve`` process,
every byte checked, memory watched.

Three processes on 127.0.0.1: a deterministic upstream (this script, ``--role upstream``),
the sidecar under test (``python -m sidecar serve``, access log on, as deployed), and the
client (this script). Each of ``--streams`` client slots opens a streaming chat request,
reads it to the end, checks it, and opens the next, until ``--duration`` has passed.

Checked per stream: the bytes received are exactly the bytes the upstream generated for that
stream id (sha256 and length, so nothing lost, added or reordered), minus the usage event
the sidecar asked for on the client's behalf (the client did not ask, so it must not see it).
Checked at the end: the sidecar's ``/metrics`` counts every stream as ``ok`` and none as
``error`` or ``cancelled``; its output-token counter equals the tokens sent; its request log
has one line per stream. Reported: streams, bytes, tokens, errors by kind, client-side TTFT,
and the sidecar's RSS (at start, once every stream is running, and at the end), open fds,
and CPU.

Run:  python scripts/soak.py --streams 300 --duration 180 --json soak.json
Exit status 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
MODEL = "soak-model"
PATH = "/v1/chat/completions"
_WORDS = [
    " the",
    " token",
    " latency",
    " stream",
    " café",
    " 日本",
    " 🚀",
    ",",
    ".",
    "\n",
    " naïve",
    " €",
    " sidecar",
    " soak",
]


# -- the deterministic wire --------------------------------------------------------------------


def _digest(stream_id: str, k: int) -> bytes:
    return hashlib.blake2b(f"{stream_id}/{k}".encode(), digest_size=8).digest()


def plan(stream_id: str, mean_tokens: int) -> tuple[int, list[bytes]]:
    """Tokens for a stream id (±50 % around the mean) and each token's text as JSON."""
    d = _digest(stream_id, -1)
    n = max(1, mean_tokens // 2 + d[0] * mean_tokens // 255)
    texts = []
    for k in range(n):
        h = _digest(stream_id, k)
        texts.append(
            json.dumps(
                "".join(_WORDS[b % len(_WORDS)] for b in h[: 1 + h[7] % 3]), ensure_ascii=False
            ).encode()
        )
    return n, texts


def events(stream_id: str, mean_tokens: int, include_usage: bool) -> list[bytes]:
    """The stream's SSE events, vLLM-shaped: role chunk, tokens, finish, [usage], [DONE]."""
    n, texts = plan(stream_id, mean_tokens)
    head = (
        b'data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","created":1,"model":"%s","choices":[{"index":0,"delta":'
        % (
            stream_id.encode(),
            MODEL.encode(),
        )
    )
    out = [head + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n']
    for k, text in enumerate(texts):
        finish = b'"stop"' if k == n - 1 else b"null"
        out.append(
            head + b'{"content":%s},"logprobs":null,"finish_reason":%s}]}\n\n' % (text, finish)
        )
    if include_usage:
        out.append(
            b'data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","created":1,"model":"%s","choices":[],'
            b'"usage":{"prompt_tokens":9,"total_tokens":%d,"completion_tokens":%d}}\n\n'
            % (stream_id.encode(), MODEL.encode(), 9 + n, n)
        )
    out.append(b"data: [DONE]\n\n")
    return out


def expected_for_client(stream_id: str, mean_tokens: int) -> tuple[str, int]:
    data = b"".join(events(stream_id, mean_tokens, include_usage=False))
    return hashlib.sha256(data).hexdigest(), len(data)


# -- upstream role ---------------------------------------------------------------------------------


async def run_upstream(port: int, ttft: float, tpot: float, mean_tokens: int) -> None:
    served = Counter()

    async def chat(request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        stream_id = request.headers["x-soak-id"]
        include_usage = bool((doc.get("stream_options") or {}).get("include_usage"))
        evs = events(stream_id, mean_tokens, include_usage)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ttft
        split = _digest(stream_id, -2)
        try:
            for k, ev in enumerate(evs):
                if 1 <= k < len(evs) - 2:
                    deadline += tpot
                delay = deadline - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if split[k % 8] < 24 and len(ev) > 8:  # ~10 %: an event cut mid-line across writes
                    cut = 1 + split[(k + 3) % 8] % (len(ev) - 1)
                    await resp.write(ev[:cut])
                    await asyncio.sleep(0)
                    await resp.write(ev[cut:])
                else:
                    await resp.write(ev)
            await resp.write_eof()
            served["completed"] += 1
        except (ConnectionError, asyncio.CancelledError):
            served["cancelled"] += 1
            raise
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post(PATH, chat)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    print(json.dumps(dict(served)), flush=True)


# -- process figures -----------------------------------------------------------------------------


def proc_figures(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(
        int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")
    )
    threads = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return {"rss": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": threads, "cpu_s": cpu}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"not ready: {url}")
            await asyncio.sleep(0.1)


def metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


# -- client role -------------------------------------------------------------------------------------


async def soak(args: argparse.Namespace) -> dict:
    up_port, port, admin = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LLM_SIDECAR_"))}
    upstream = subprocess.Popen(
        [sys.executable, __file__, "--role", "upstream", "--port", str(up_port), "--ttft", str(args.ttft), "--tpot", str(args.tpot), "--tokens", str(args.tokens)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    log = tempfile.NamedTemporaryFile(prefix="soak-sidecar-", suffix=".log", delete=False)
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--upstream", f"http://127.0.0.1:{up_port}",
         "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{admin}", "--drain-seconds", "5"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert upstream.stdout is not None and upstream.stdout.readline().strip() == "ready"
        await wait_http(f"http://127.0.0.1:{admin}/readyz")
        return await drive(args, sidecar, port, admin, Path(log.name))
    finally:
        for p in (sidecar, upstream):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        sidecar_exit = sidecar.wait(timeout=30)
        upstream.wait(timeout=30)
        if sidecar_exit != 0:
            print(f"sidecar exited {sidecar_exit}; log {log.name}", file=sys.stderr)


async def drive(
    args: argparse.Namespace, sidecar: subprocess.Popen, port: int, admin: int, log: Path
) -> dict:
    url = f"http://127.0.0.1:{port}{PATH}"
    pid = sidecar.pid
    started_at = time.monotonic()
    deadline = started_at + args.duration
    ramp = min(5.0, args.duration / 4)
    results = Counter()
    errors: Counter[str] = Counter()
    ttfts: list[float] = []
    totals = {"bytes": 0, "tokens": 0}
    running = {"n": 0}
    figures: dict[str, dict] = {"before": proc_figures(pid)}
    samples: list[tuple[float, int]] = []

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:

        async def slot(i: int) -> None:
            await asyncio.sleep(ramp * i / args.streams)
            seq = 0
            while time.monotonic() < deadline:
                stream_id = f"{i}-{seq}"
                seq += 1
                sha = hashlib.sha256()
                size = 0
                t0 = time.monotonic()
                first = None
                running["n"] += 1
                try:
                    body = {
                        "model": MODEL,
                        "stream": True,
                        "messages": [{"role": "user", "content": f"soak {stream_id}"}],
                    }
                    async with session.post(url, json=body, headers={"x-soak-id": stream_id}) as r:
                        if r.status != 200:
                            errors[f"status {r.status}"] += 1
                            await r.read()
                            continue
                        async for chunk in r.content.iter_any():
                            if first is None:
                                first = time.monotonic() - t0
                            sha.update(chunk)
                            size += len(chunk)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    errors[type(exc).__name__] += 1
                    continue
                finally:
                    running["n"] -= 1
                want_sha, want_size = expected_for_client(stream_id, args.tokens)
                if sha.hexdigest() != want_sha or size != want_size:
                    results["mismatch"] += 1
                    continue
                results["ok"] += 1
                totals["bytes"] += size
                totals["tokens"] += plan(stream_id, args.tokens)[0]
                if first is not None:
                    ttfts.append(first)

        async def monitor() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                now = proc_figures(pid)
                samples.append((round(time.monotonic() - started_at, 1), now["rss"]))
                if "start" not in figures and running["n"] >= args.streams:
                    figures["start"] = now  # every slot has a stream in flight
                if args.progress and int(time.monotonic() - started_at) % 15 == 0:
                    print(
                        f"  t={time.monotonic() - started_at:5.0f}s streams ok={results['ok']} running={running['n']} rss={now['rss'] >> 20} MiB",
                        file=sys.stderr,
                        flush=True,
                    )

        await asyncio.gather(monitor(), *(slot(i) for i in range(args.streams)))
        figures["end"] = proc_figures(pid)
        figures.setdefault("start", figures["before"])
        elapsed = time.monotonic() - started_at
    async with (
        aiohttp.ClientSession() as plain,
        plain.get(f"http://127.0.0.1:{admin}/metrics") as r,
    ):
        text = await r.text()
    await asyncio.sleep(
        1.0
    )  # the client's connections are closed: the sidecar's side must close too
    figures["after"] = proc_figures(pid)

    labels = {"model": MODEL, "route": PATH}
    await asyncio.sleep(0.5)  # the last request log lines
    log_lines = sum(
        1 for line in log.read_text().splitlines() if '"event": "request"' in line and PATH in line
    )
    counted = {
        "ok": metric(text, "llm_requests_total", outcome="ok", **labels),
        "error": metric(text, "llm_requests_total", outcome="error", **labels),
        "cancelled": metric(text, "llm_requests_total", outcome="cancelled", **labels),
        "output_tokens": metric(text, "llm_tokens_total", type="output", **labels),
        "parse_errors": metric(text, "llm_stream_parse_errors_total"),
        "request_log_lines": log_lines,
    }
    cpu = figures["end"]["cpu_s"] - figures["before"]["cpu_s"]
    ttfts.sort()
    report = {
        "streams_concurrent": args.streams,
        "duration_s": round(elapsed, 1),
        "streams_completed": results["ok"],
        "mismatches": results["mismatch"],
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "bytes_relayed": totals["bytes"],
        "tokens_relayed": totals["tokens"],
        "tokens_per_s": round(totals["tokens"] / elapsed),
        "client_ttft_ms_p50": round(1000 * statistics.median(ttfts), 1) if ttfts else None,
        "client_ttft_ms_p99": round(1000 * ttfts[int(0.99 * (len(ttfts) - 1))], 1)
        if ttfts
        else None,
        "sidecar_rss_mb": {
            k: round(figures[k]["rss"] / 2**20, 1) for k in ("before", "start", "end")
        },
        "sidecar_rss_mb_max": round(max(r for _, r in samples) / 2**20, 1) if samples else None,
        # "after": once the client closed its keep-alive connections; what stays open is the
        # sidecar's pool of idle upstream connections (at most one per concurrent stream).
        "sidecar_fds": {k: figures[k]["fds"] for k in ("before", "start", "end", "after")},
        "sidecar_threads_end": figures["end"]["threads"],
        "sidecar_cpu_pct_core": round(100 * cpu / elapsed, 1),
        "sidecar_counted": counted,
        "rss_samples_mb": " ".join(
            f"{t:g}s:{r / 2**20:.1f}" for t, r in samples[:: max(1, len(samples) // 20)]
        ),
        "tpot_s": args.tpot,
        "mean_tokens": args.tokens,
    }
    report["passed"] = (
        report["mismatches"] == 0
        and report["errors"] == 0
        and report["streams_completed"] > 0
        and counted["ok"] == results["ok"]
        and counted["error"] == 0
        and counted["cancelled"] == 0
        and counted["output_tokens"] == totals["tokens"]
        and counted["parse_errors"] == 0
        and log_lines == results["ok"]
        and figures["after"]["fds"] <= figures["before"]["fds"] + args.streams
    )
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=300, help="concurrent streams (client slots)")
    p.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    p.add_argument(
        "--tokens", type=int, default=100, help="mean tokens per stream (each stream 50-150 %%)"
    )
    p.add_argument("--ttft", type=float, default=0.2, help="upstream seconds to first token")
    p.add_argument("--tpot", type=float, default=0.05, help="upstream seconds per token")
    p.add_argument("--json", default=None, help="write the report here too")
    p.add_argument("--progress", action="store_true", help="a status line every 15 s on stderr")
    p.add_argument(
        "--role", choices=["client", "upstream"], default="client", help=argparse.SUPPRESS
    )
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    try:
        import uvloop  # noqa: PLC0415

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    if args.role == "upstream":
        asyncio.run(run_upstream(args.port, args.ttft, args.tpot, args.tokens))
        return 0
    report = asyncio.run(soak(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
