"""Two proxies under the same load at the same time: ``python -m bench.paired``.

A VM's CPU cost per token drifts from minute to minute (nginx's own moved 12.7-18.3 µs
within six runs of `bench.run`), so two proxies measured one after the other differ by
as much as the change being judged. Here both run at once, on the same CPU, each in front
of its own upstream process with its own load generator (half the streams each), so every
drift of the machine falls on both alike; the ratio of their CPU per token is taken within
each round, and the median over rounds decides. Every stream is still checked byte for byte
and both proxies' tokens must arrive complete.

Each side is ``nginx`` or a Python module run as ``-m MODULE serve`` (the sidecar's own CLI):
``sidecar`` is this tree, and a module that puts another checkout first on ``sys.path``
runs that one (an A/B of two versions of the code). Examples::

    python -m bench.paired --a nginx --b sidecar --rounds 5          # the goal, paired
    python -m bench.paired --a nginx --b sidecar --rounds 5 --shape mixed   # the second shape
    PYTHONPATH=/tmp/mods python -m bench.paired --a old_tree --b sidecar --rounds 5

The two share the machine, so each is a little slower than alone; the ratio is what this
measures, not either absolute figure. ``--shape mixed`` runs bench.run's second load shape
(mixed lengths, routes, models, non-streamed requests, per-request connections; see
bench/run.py) on both sides; ``--streams`` then counts connections, and each side also
reports its CPU per request.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench.client import token_range
from bench.run import (
    Procs,
    cpu_seconds,
    find_nginx,
    free_port,
    longest_tokens,
    pinning,
    process_tree,
    shape_args,
    start_nginx,
    wait_http,
)
from bench.wire import MIXED_TOKENS


def start_proxy(side: str, name: str, up_port: int, procs: Procs, nginx: str | None) -> tuple:
    """Start one proxy in front of ``up_port``; its port and process."""
    if side == "nginx":
        if nginx is None:
            raise SystemExit("nginx is not installed (apt-get install nginx)")
        return start_nginx(nginx, f"proxy-{name}", up_port, procs)
    port, admin = free_port(), free_port()  # a module run as `-m MODULE serve`
    argv = [
        sys.executable, "-m", side, "serve", "--upstream", f"http://127.0.0.1:{up_port}",
        "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{admin}", "--access-log", "false",
    ]  # fmt: skip
    proc = procs.spawn(f"proxy-{name}", argv, "proxy")
    wait_http(f"http://127.0.0.1:{admin}/readyz", proc, side)
    return port, proc


def one_round(args: argparse.Namespace, procs: Procs, nginx: str | None, round_no: int) -> dict:
    """Both sides at once; CPU per token of each over the same seconds."""
    sides = {"a": args.a, "b": args.b}
    upstreams, proxies, ports = {}, {}, {}
    for key in sides:
        up_port = free_port()
        upstreams[key] = procs.spawn(
            f"upstream-{key}-{round_no}",
            [sys.executable, "-m", "bench.upstream", "--port", str(up_port), "--ttft", str(args.ttft), "--tpot", str(args.tpot),
             *shape_args(args, "upstream")],
            "load",
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{up_port}/health", upstreams[key], "upstream")
        ports[key], proxies[key] = start_proxy(
            sides[key], f"{key}-{round_no}", up_port, procs, nginx
        )
    trees = {k: process_tree(p.pid) for k, p in proxies.items()}
    cpu0 = {k: cpu_seconds(t) for k, t in trees.items()}
    clients, outs = {}, {}
    for key in sides:
        outs[key] = procs.workdir / f"client-{key}-{round_no}.json"
        clients[key] = procs.spawn(
            f"client-{key}-{round_no}",
            [
                sys.executable, "-m", "bench.client", "--port", str(ports[key]),
                "--streams", str(args.streams // 2), "--tokens", str(args.tokens), "--tpot", str(args.tpot),
                "--ttft", str(args.ttft), "--duration", str(args.duration), "--ramp", str(args.ramp),
                "--out", str(outs[key]), *shape_args(args, "client"),
            ],
            "load",
        )  # fmt: skip
    limit = args.ramp + args.duration + longest_tokens(args) * args.tpot * 4 + args.ttft + 120
    try:
        for client in clients.values():
            client.wait(limit)
        cpu1 = {k: cpu_seconds(t) for k, t in trees.items()}
    finally:
        for proc in (*upstreams.values(), *proxies.values()):
            procs.stop(proc)
    result = {}
    for key in sides:
        if clients[key].returncode != 0:
            raise RuntimeError(
                f"load generator {key} failed:\n{procs.log(f'client-{key}-{round_no}')}"
            )
        res = orjson.loads(outs[key].read_bytes())
        tokens = res["tokens_total"]
        complete = (
            res["errors"] == 0
            and res["checksum_mismatches"] == 0
            and res["streams_complete"] == res["streams_started"] > 0
        )
        requests = res["streams_complete"]
        result[key] = {
            "proxy": sides[key],
            "tokens": tokens,
            "requests": requests,
            "complete": complete,
            "cpu_us_per_token": 1e6 * (cpu1[key] - cpu0[key]) / tokens if tokens else None,
            "cpu_us_per_request": 1e6 * (cpu1[key] - cpu0[key]) / requests if requests else None,
            "ttft_p99_ms": res["ttft_s"]["p99"] * 1e3 if res["ttft_s"]["p99"] is not None else None,
            "itl_p99_ms": res["itl_s"]["p99"] * 1e3 if res["itl_s"]["p99"] is not None else None,
        }
    a, b = result["a"]["cpu_us_per_token"], result["b"]["cpu_us_per_token"]
    result["b_vs_a_cpu_per_token"] = b / a if a and b else None
    a, b = result["a"]["cpu_us_per_request"], result["b"]["cpu_us_per_request"]
    result["b_vs_a_cpu_per_request"] = b / a if a and b else None
    return result


def summarize(rounds: list[dict]) -> dict:
    """The median of the per-round ratios (each taken over the same seconds), and whether
    every stream of every round arrived complete."""

    def spread(key: str) -> dict:
        ratios = [r[key] for r in rounds if r.get(key) is not None]
        return {
            "median": statistics.median(ratios) if ratios else None,
            "min": min(ratios, default=None),
            "max": max(ratios, default=None),
        }

    return {
        "rounds": len(rounds),
        "b_vs_a_cpu_per_token": spread("b_vs_a_cpu_per_token"),
        "b_vs_a_cpu_per_request": spread("b_vs_a_cpu_per_request"),
        "complete": all(r[k]["complete"] for r in rounds for k in ("a", "b")),
    }


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.paired", description=__doc__.split("\n")[0])
    p.add_argument(
        "--a", default="nginx", help="the baseline: nginx, or a module run as `-m MODULE serve`"
    )
    p.add_argument("--b", default="sidecar", help="the proxy judged against it (same choices)")
    p.add_argument(
        "--streams", type=int, default=200, help="streams in all, half through each side"
    )
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream (steady shape)")
    p.add_argument(
        "--shape",
        choices=("steady", "mixed"),
        default="steady",
        help="the load shape (bench/run.py)",
    )
    p.add_argument(
        "--token-range", type=token_range, default=MIXED_TOKENS, metavar="MIN,MAX",
        help="mixed shape: output tokens per request, log-uniform (default 20,800)",
    )  # fmt: skip
    p.add_argument("--tpot", type=float, default=0.02)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--ramp", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    nginx = find_nginx() if "nginx" in (args.a, args.b) else None
    workdir = Path(tempfile.mkdtemp(prefix="llm-sidecar-paired-"))
    procs = Procs(workdir, pinning("auto"))
    rounds = []
    try:
        for round_no in range(1, args.rounds + 1):
            t0 = time.monotonic()
            r = one_round(args, procs, nginx, round_no)
            rounds.append(r)
            print(
                f"round {round_no}: {args.a} {_f(r['a']['cpu_us_per_token'])} µs/token, "
                f"{args.b} {_f(r['b']['cpu_us_per_token'])} µs/token, {args.b}/{args.a} {_f(r['b_vs_a_cpu_per_token'], 2)}"
                f" (TTFT p99 {_f(r['a']['ttft_p99_ms'])} / {_f(r['b']['ttft_p99_ms'])} ms, ITL p99"
                f" {_f(r['a']['itl_p99_ms'])} / {_f(r['b']['itl_p99_ms'])} ms, complete"
                f" {r['a']['complete'] and r['b']['complete']}, {time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    finally:
        procs.stop_all()
    summary = summarize(rounds)
    s = summary["b_vs_a_cpu_per_token"]
    print(
        f"{args.b} / {args.a} CPU per token, median of {len(rounds)} paired rounds: {_f(s['median'], 2)}"
        f" ({_f(s['min'], 2)}-{_f(s['max'], 2)}); every stream complete: {summary['complete']}"
    )
    if args.shape == "mixed":
        s = summary["b_vs_a_cpu_per_request"]
        print(
            f"{args.b} / {args.a} CPU per request (mixed shape): {_f(s['median'], 2)} ({_f(s['min'], 2)}-{_f(s['max'], 2)})"
        )
    if args.json:
        Path(args.json).write_bytes(
            orjson.dumps({"rounds": rounds, "summary": summary}, option=orjson.OPT_INDENT_2)
        )
    return 0 if summary["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
