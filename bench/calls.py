"""The interpreter's calls per request and per token: the sidecar under cProfile, counted.

    .venv/bin/python -m bench.calls                   # 300 vs 1500 requests, 5 vs 65 tokens
    .venv/bin/python -m bench.calls --requests 16,48 --tokens 2,6 --top 10   # seconds

A count of calls moves far less with the machine's noise than a time does, so a change's
effect on the relay's work can be read in one run, before and after, on any machine.

Three runs, each a fresh ``python -m cProfile -o FILE -m sidecar serve`` (one process,
``--access-log false`` as in :mod:`bench.run`, the caller's ``LLM_SIDECAR_*`` and ``OTEL_*``
variables left out), stopped with SIGTERM once its load is done, so cProfile writes every
call of the process's life: Python functions and the C functions they call (a C extension's
method is one call, whatever it does inside; uvloop's own C work is not a call and is not
counted):

* A: ``N1`` requests of ``T1`` tokens; B: ``N2`` requests of ``T1`` tokens;
  C: ``N1`` requests of ``T2`` tokens.
* calls per request (of ``T1`` tokens) = (B - A) / (N2 - N1): start-up, shutdown and the first
  requests' one-off work (imports, caches) are in both runs and cancel.
* calls per token = (C - A) / (N1 * (T2 - T1)): the same requests, only longer.
* the functions with the most calls per request (B - A) and per token (C - A).

What is left is noise from how the bytes fall into reads (a chunk's head in one read and its
data in the next takes another path through the parsers) and from work on timers, so the
difference runs are long: a few per cent per request from run to run, about one call per
token. ``reads per token`` (the sidecar's ``data_received`` calls) should be about 1: each
token arrived in a read of its own, as from a real server.

The load: the simulator (:mod:`sidecar.tools.sim`) in this process, each request exact
(``x-sim-tokens``, ``x-sim-ttft``, ``x-sim-tpot`` headers: no jitter), its tokens ``--tpot``
apart, and ``--clients`` keep-alive connections sending streamed chat completions back to
back over raw sockets; every response must be a 200 ending with ``data: [DONE]``, else the
run fails. ``--profiles DIR`` keeps the three profiles for ``pstats``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import re
import signal
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from sidecar.base import speedups
from sidecar.relay.data import token_lane
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app

ROOT = Path(__file__).resolve().parents[1]
MODEL = "sim-llama-3-8b"
_BOUND = re.compile(rb"\b(bound|metrics_bound)\W+(?:\[?[0-9a-fA-F.:]+\]?):(\d+)")
_DONE = b"data: [DONE]\n\n"
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")

FuncKey = tuple[str, int, str]


@dataclass(frozen=True)
class Profile:
    """One run's counts: every call, and each function's."""

    requests: int
    tokens: int
    total: int
    by_function: Counter[FuncKey]

    @property
    def reads(self) -> int:
        """``data_received`` calls of the sidecar's own protocols: the reads it was handed."""
        return sum(
            n
            for (filename, _, name), n in self.by_function.items()
            if name == "data_received" and f"{os.sep}sidecar{os.sep}" in filename
        )


def request_bytes(port: int, tokens: int, ttft: float, tpot: float) -> bytes:
    body = (
        b'{"model":"%s","messages":[{"role":"user","content":"Write about latency."}],'
        b'"stream":true,"max_tokens":%d}' % (MODEL.encode(), tokens)
    )
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"x-sim-tokens: %d\r\nx-sim-ttft: %r\r\nx-sim-tpot: %r\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (port, tokens, ttft, tpot, len(body), body)
    )


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 response's body (chunked or with a length); raises unless a 200."""
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"not a 200: {head[:200]!r}")
    lower = head.lower()
    if b"transfer-encoding: chunked" not in lower:
        length = re.search(rb"\r\ncontent-length: *(\d+)", lower)
        if length is None:
            raise RuntimeError(f"neither chunked nor a length: {head[:200]!r}")
        return await reader.readexactly(int(length[1]))
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers: the empty line
            return b"".join(parts)
        parts.append((await reader.readexactly(size + 2))[:-2])


async def one_client(port: int, count: int, request: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(count):
            writer.write(request)
            body = await read_response(reader)
            if not body.endswith(_DONE):
                raise RuntimeError(f"a stream did not end with [DONE]: {body[-200:]!r}")
    finally:
        writer.close()
        await writer.wait_closed()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LLM_SIDECAR_", "OTEL_"))} | {
        "PYTHONPATH": str(ROOT)
    }


async def profiled_run(
    sim_url: str, requests: int, tokens: int, args: argparse.Namespace, out: Path
) -> Profile:
    """One fresh sidecar under cProfile, ``requests`` requests of ``tokens`` tokens through
    it, stopped; its counts."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cProfile", "-o", str(out), "-m", "sidecar", "serve",
        "--upstream", sim_url, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
        "--access-log", "false", "--log-format", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=_clean_env(),
        cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    log = []
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            log.append(line)
            if not line:
                raise RuntimeError(f"the sidecar exited before it started: {b''.join(log)!r}")
            if b"started" in line and (ports := dict(_BOUND.findall(line))).get(b"bound"):
                port = int(ports[b"bound"])
                break
        request = request_bytes(port, tokens, args.ttft, args.tpot)
        share, extra = divmod(requests, args.clients)
        await asyncio.gather(
            *(
                one_client(port, share + (i < extra), request)
                for i in range(args.clients)
                if share + (i < extra)
            )
        )
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 60)
        log.append(rest)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"the sidecar exited {proc.returncode}: {b''.join(log)[-3000:]!r}")
    return read_profile(out, requests, tokens)


def read_profile(path: Path, requests: int, tokens: int) -> Profile:
    """A cProfile file's calls: each function's count of calls (recursive ones included)."""
    by_function: Counter[FuncKey] = Counter()
    for (filename, line, name), row in pstats.Stats(str(path)).stats.items():  # type: ignore[attr-defined]
        # "<built-in method __new__ of type object at 0x7f..>": the same function in every run
        by_function[filename, line, _ADDRESS.sub("", name)] += row[1]
    return Profile(requests, tokens, sum(by_function.values()), by_function)


def function_name(key: FuncKey) -> str:
    """``path:line(name)``, the path from the repository or the installed package's root."""
    filename, line, name = key
    if filename == "~":  # a C function: "<built-in method builtins.len>", "<method 'get' ...>"
        return name
    path = Path(filename)
    if path.is_relative_to(ROOT) and ".venv" not in path.parts:
        shown = str(path.relative_to(ROOT))
    elif "site-packages" in path.parts:
        shown = "/".join(path.parts[path.parts.index("site-packages") + 1 :])
    else:
        shown = "/".join(path.parts[-2:])
    return f"{shown}:{line}({name})"


def top_functions(longer: Profile, shorter: Profile, per: float, top: int) -> list[dict]:
    """The ``top`` functions by the calls ``longer`` made beyond ``shorter``, over ``per``."""
    diff = Counter(longer.by_function)
    diff.subtract(shorter.by_function)
    rows = sorted(diff.items(), key=lambda kv: (-kv[1], function_name(kv[0])))
    return [{"function": function_name(key), "calls": n / per} for key, n in rows[:top]]


def summarize(a: Profile, b: Profile, c: Profile, top: int) -> dict:
    per_request = (b.total - a.total) / (b.requests - a.requests)
    tokens = a.requests * (c.tokens - a.tokens)
    per_token = (c.total - a.total) / tokens

    return {
        "runs": [{"requests": p.requests, "tokens": p.tokens, "calls": p.total} for p in (a, b, c)],
        "calls_per_request": per_request,
        "calls_per_token": per_token,
        "reads_per_token": (c.reads - a.reads) / tokens,
        "tokens_per_request": a.tokens,
        "top_per_request": top_functions(b, a, b.requests - a.requests, top),
        "top_per_token": top_functions(c, a, tokens, top),
    }


def print_report(report: dict, clients: int) -> None:
    runs = report["runs"]
    built = [name for name, on in report["c_extensions"].items() if on]
    print(
        f"sidecar under cProfile (C extensions: {', '.join(built) or 'none'}), "
        f"{clients} keep-alive clients, streamed chat completions: "
        + ", ".join(f"{r['requests']} x {r['tokens']} tokens = {r['calls']:,} calls" for r in runs)
    )
    print(
        f"calls per {report['tokens_per_request']}-token request: "
        f"{report['calls_per_request']:,.0f}   calls per token: {report['calls_per_token']:.1f}"
        f" (reads per token: {report['reads_per_token']:.2f}; 1: each token a read of its own)"
    )
    if report["reads_per_token"] < 0.95:
        print(
            "  (some tokens arrived together in one read, as on a busy machine: calls per token "
            "then differs from a quiet run's; run it again when the machine is quieter)"
        )
    for what in ("request", "token"):
        print(f"top functions by calls per {what}:")
        for row in report[f"top_per_{what}"]:
            print(f"  {row['calls']:8.1f}  {row['function']}")


async def run(args: argparse.Namespace) -> dict:
    (n1, n2), (t1, t2) = args.requests, args.tokens
    sim = web.AppRunner(
        build_simulator_app(SimulatorConfig(model=MODEL, jitter=0, seed=1)),
        handler_cancellation=True,
        access_log=None,
    )
    await sim.setup()
    site = web.TCPSite(sim, "127.0.0.1", 0)
    await site.start()
    sim_url = f"http://127.0.0.1:{sim.addresses[0][1]}"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-calls-") as tmp:
            where = Path(args.profiles or tmp)
            where.mkdir(parents=True, exist_ok=True)
            profiles = [
                await profiled_run(sim_url, n, t, args, where / f"{n}x{t}.prof")
                for n, t in ((n1, t1), (n2, t1), (n1, t2))
            ]
    finally:
        await sim.cleanup()
    return summarize(*profiles, top=args.top)


def _pair(text: str) -> tuple[int, int]:
    low, high = (int(v) for v in text.split(","))
    if not 0 < low < high:
        raise argparse.ArgumentTypeError("two integers, 0 < first < second")
    return low, high


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.calls", description=__doc__.split("\n")[0])
    p.add_argument(
        "--requests", type=_pair, default=(300, 1500), metavar="N1,N2",
        help="the two run lengths; per request is the difference over the difference",
    )  # fmt: skip
    p.add_argument(
        "--tokens", type=_pair, default=(5, 65), metavar="T1,T2",
        help="tokens per request: the short stream (per request) and the long one (per token)",
    )  # fmt: skip
    p.add_argument("--clients", type=int, default=8, help="keep-alive connections")
    p.add_argument("--ttft", type=float, default=0.002, help="upstream seconds to first token")
    p.add_argument(
        "--tpot", type=float, default=0.005,
        help="upstream seconds between tokens (long enough that each token is a read of its own)",
    )  # fmt: skip
    p.add_argument("--top", type=int, default=25, help="functions listed")
    p.add_argument("--json", default=None, help="also write the report here")
    p.add_argument(
        "--profiles", default=None, metavar="DIR",
        help="keep the three runs' cProfile files here (N1xT1.prof ...; read with pstats)",
    )  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(run(args))
    report["config"] = {
        k: getattr(args, k) for k in ("requests", "tokens", "clients", "ttft", "tpot")
    }
    # The sidecar imports the same tree (PYTHONPATH), so it runs the same lanes as this process.
    report["c_extensions"] = {"speedups": speedups.IN_C, "token_lane": token_lane.IN_C_LANE}
    print_report(report, args.clients)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
