"""Overload: 1,024 keep-alive connections against one saturated core, nginx and the sidecar.

    .venv/bin/python -m bench.overload                       # 512 connections, 512 more at 3 s
    .venv/bin/python -m bench.overload --late 0              # all 1,024 at once
    .venv/bin/python -m bench.overload --connections 2048 --window 20 --json overload.json
    .venv/bin/python -m bench.overload --baseline-tree /tmp/before   # also the tree before

Per target, fresh processes: :mod:`bench.upstream` answering every request with a short
JSON body ``--delay`` seconds after it arrived (``--shape mixed``, one token, not
streamed); the proxy under test (nginx from bench/nginx.conf.template, one worker; the
sidecar with ``--workers 1``; with ``--baseline-tree DIR`` also the sidecar of another
source tree, ``git archive <commit> | tar -x -C DIR``, as ``baseline``); and ``wrk``
(Debian's, scripts/system-deps.sh) with ``--connections`` keep-alive connections, each
sending the same request back to back. ``--late`` of them (half, by default) are a second
wrk that starts ``--late-after`` seconds after the first, once the first has saturated the
proxy: clients arriving at a proxy that is already busy, which is where an accept that
lags shows every time (with all the connections at once, it depends on whether they are
accepted before the loop is saturated). With ``--pin auto`` (the default on 2+ CPUs) the
proxy has the last CPU to itself and the upstream and wrk share the others, as in
:mod:`bench.run`; the proxy's core is saturated long before the upstream's delay bounds
the rate (1,024 connections / 20 ms = 51,200 requests/s offered).

Reported per target:

* Each wrk's latency percentiles (p50/p90/p99, max) and requests/s over its whole run,
  connects included. wrk keeps a histogram per thread and merges them at the end; a
  latency past its ``--timeout`` (set to 60 s here) would not be recorded at all.
* Fairness, which does not move with the machine's noise: the requests each connection
  sent in a window of ``--window`` seconds (from 1 s after the last wrk started), read
  from the kernel (``ss -ti``: each client socket's ``bytes_sent`` divided by the
  request's exact length; a connection sends its next request only once the last one was
  answered, so the count is its completed requests, give or take the one in flight): min,
  p1, p50, max and how many connections completed none, over all of them and for the
  first and the late ones apart.
* The proxy's accept queue (the listening socket's Recv-Q, sampled every second, the
  largest seen) and the kernel's counters over the run (``nstat``: TcpExtListenOverflows,
  TcpExtListenDrops, TcpExtTCPLossProbes, TcpRetransSegs, TcpActiveOpens). The counters
  are the machine's, so other work on it adds to them.
* The upstream connections the proxy opened (the upstream's count of connections it
  accepted) against the requests it answered: a pool that closes connections it will need
  again shows here.
* The proxy's CPU share of its core, and ``top -bn1 | head -15`` in the middle of the
  window (a shared machine: what else ran).

The exit status is 1 only when a target could not run (wrk or nginx missing, a process
that did not start); timings never fail it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

from bench.run import (
    ROOT,
    Procs,
    _interrupted,
    cpu_seconds,
    find_nginx,
    free_port,
    pinning,
    process_tree,
    start_nginx,
    wait_http,
)
from bench.wire import MODEL, PATH, STREAM_HEADER

BODY = orjson.dumps(
    {
        "model": MODEL,
        "max_tokens": 1,
        "stream": False,
        "messages": [{"role": "user", "content": "hi"}],
    }
)
COUNTERS = (
    "TcpExtListenOverflows",
    "TcpExtListenDrops",
    "TcpExtTCPLossProbes",
    "TcpRetransSegs",
    "TcpActiveOpens",
)


def request_bytes(port: int) -> bytes:
    """The one request every connection sends, byte for byte (its length divides the bytes
    a connection sent into requests)."""
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"%s: 1\r\nContent-Length: %d\r\n\r\n%s"
        % (PATH.encode(), port, STREAM_HEADER.encode(), len(BODY), BODY)
    )


def wrk_script(request: bytes, path: Path) -> Path:
    """A wrk script that sends ``request`` as it is, on every connection."""
    text = request.decode().replace("\\", "\\\\").replace('"', '\\"').replace("\r\n", "\\r\\n")
    path.write_text(f'local req = "{text}"\nrequest = function() return req end\n')
    return path


# ------------------------------------------------------------------ what the kernel says


def sent_per_connection(port: int) -> dict[str, int]:
    """``bytes_sent`` of each established client socket to ``port``, by its local address."""
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( dport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sent: dict[str, int] = {}
    local = None
    for line in out.splitlines():
        if not line[:1].isspace():
            fields = line.split()
            local = fields[2] if len(fields) >= 4 else None
            continue
        match = re.search(r"\bbytes_sent:(\d+)", line)
        if local is not None:
            sent[local] = int(match.group(1)) if match else 0
    return sent


def accept_queue(port: int) -> int:
    """Connections waiting in the listening socket's accept queue (its Recv-Q)."""
    out = subprocess.run(
        ["ss", "-ltnH", f"( sport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.split())


def nstat(history: Path, reset: bool = False) -> dict[str, int]:
    """The kernel's TCP counters since the last call with the same ``history`` file."""
    env = {**os.environ, "NSTAT_HISTORY": str(history)}
    argv = ["nstat", "-n"] if reset else ["nstat", *COUNTERS]
    out = subprocess.run(argv, capture_output=True, text=True, env=env).stdout
    values = dict.fromkeys(COUNTERS, 0)
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] in values:
            values[fields[0]] = int(fields[1])
    return values


def only(counts: dict[str, int], keys: set[str]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if k in keys}


def fairness(before: dict[str, int], after: dict[str, int], size: int) -> dict:
    counts = sorted((after[k] - before[k]) // size for k in after if k in before)
    n = len(counts)
    if not n:
        return {"connections": 0}
    return {
        "connections": n,
        "min": counts[0],
        "p1": counts[n // 100],
        "p50": counts[n // 2],
        "max": counts[-1],
        "zero": sum(1 for c in counts if c == 0),
        "total": sum(counts),
    }


def upstream_counts(log: str) -> dict:
    """What the upstream counted (its last line): requests answered and connections
    accepted, so the proxy's upstream connections a request are a count too."""
    for line in reversed(log.splitlines()):
        if line.startswith("{"):
            counts = orjson.loads(line)
            return {"requests": counts["completed"], "connections": counts["connections"]}
    return {}


# ------------------------------------------------------------------ wrk's report

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if match is None:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(text: str) -> dict:
    out: dict = {}
    for pct in ("50", "75", "90", "99"):
        match = re.search(rf"^\s+{pct}%\s+(\S+)", text, re.M)
        if match:
            out[f"p{pct}_s"] = _seconds(match.group(1))
    match = re.search(r"^\s+Latency\s+(\S+)\s+(\S+)\s+(\S+)", text, re.M)
    if match:
        out["mean_s"], out["max_s"] = _seconds(match.group(1)), _seconds(match.group(3))
    match = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.M)
    if match:
        out["requests_per_s"] = float(match.group(1))
    match = re.search(r"(\d+) requests in", text)
    if match:
        out["requests"] = int(match.group(1))
    match = re.search(r"Socket errors: (.*)", text)
    out["socket_errors"] = match.group(1).strip() if match else None
    match = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non_2xx"] = int(match.group(1)) if match else 0
    if "p50_s" in out and "p99_s" in out and out["p50_s"] > 0:
        out["p99_over_p50"] = out["p99_s"] / out["p50_s"]
    return out


# ------------------------------------------------------------------ one target


def start_proxy(
    target: str, up_port: int, args: argparse.Namespace, procs: Procs, nginx: str | None
):
    if target == "nginx":
        assert nginx is not None
        return start_nginx(nginx, "nginx", up_port, procs)
    port, admin = free_port(), free_port()
    tree = Path(args.baseline_tree).resolve() if target == "baseline" else ROOT
    if not any(tree.glob("sidecar/**/*.so")):
        print(f"note: {tree} has no built C extensions; its sidecar runs without them")
    argv = [
        sys.executable, "-c",
        f"import sys; sys.path.insert(0, {str(tree)!r}); from sidecar.cli import main; "
        "sys.exit(main())",
        "serve", "--upstream", f"http://127.0.0.1:{up_port}",
        "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{admin}",
        "--access-log", "false", "--workers", "1",
    ]  # fmt: skip
    proxy = procs.spawn(target, argv, "proxy")
    wait_http(f"http://127.0.0.1:{admin}/readyz", proxy, target)
    return port, proxy


def run_target(
    target: str, args: argparse.Namespace, procs: Procs, nginx: str | None, wrk: str
) -> dict:
    py = sys.executable
    up_port = free_port()
    upstream = procs.spawn(
        "upstream",
        [py, "-m", "bench.upstream", "--port", str(up_port), "--ttft", str(args.delay),
         "--shape", "mixed"],
        "load",
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", upstream, "upstream")
        port, proxy = start_proxy(target, up_port, args, procs, nginx)
        request = request_bytes(port)
        script = wrk_script(request, procs.workdir / f"request-{target}.lua")
        history = procs.workdir / f"nstat-{target}"
        nstat(history, reset=True)
        tree = process_tree(proxy.pid)
        cpu0, t0 = cpu_seconds(tree), time.monotonic()
        late = min(max(args.late, 0), args.connections - 1)
        waves = [("first", args.connections - late, args.late_after if late else 0.0)]
        if late:
            waves.append(("late", late, 0.0))

        def start_wave(name: str, connections: int, head_start: float) -> subprocess.Popen:
            run_for = head_start + args.window + 3
            return procs.spawn(
                f"wrk-{target}-{name}",
                [wrk, f"-t{min(args.threads, connections)}", f"-c{connections}",
                 f"-d{run_for:.0f}s", "--timeout", "60s", "--latency", "-s", str(script),
                 f"http://127.0.0.1:{port}/"],
                "load",
            )  # fmt: skip

        queue: list[int] = []
        stop = threading.Event()

        def sample_queue() -> None:
            while not stop.wait(1.0):
                queue.append(accept_queue(port))

        sampler = threading.Thread(target=sample_queue, daemon=True)
        sampler.start()
        clients = [start_wave(*waves[0])]
        first: set[str] = set()
        if late:
            time.sleep(args.late_after)  # the first wave has saturated the proxy by now
            first = set(sent_per_connection(port))
            clients.append(start_wave(*waves[1]))
        time.sleep(1.0)
        before = sent_per_connection(port)
        time.sleep(args.window / 2)
        top = subprocess.run(["top", "-bn1"], capture_output=True, text=True).stdout
        time.sleep(args.window / 2)
        after = sent_per_connection(port)
        for client in clients:
            client.wait(args.late_after + args.window + 60)
        stop.set()
        sampler.join()
        wall = time.monotonic() - t0
        cpu = cpu_seconds(tree) - cpu0
        counters = nstat(history)
        procs.stop(upstream)  # it prints its counters as it stops
        size = len(request)
        reports = {name: procs.log(f"wrk-{target}-{name}") for name, _, _ in waves}
        result = {
            "target": target,
            "waves": {
                name: {"connections": n, "joined_after_s": args.late_after if name == "late" else 0.0,
                       "latency": parse_wrk(reports[name])}
                for name, n, _ in waves
            },
            "fairness": fairness(before, after, size),
            "accept_queue_max": max(queue, default=0),
            "counters": counters,
            "upstream": upstream_counts(procs.log("upstream")),
            "proxy_cpu_pct_core": 100.0 * cpu / wall,
            "top": "\n".join(top.splitlines()[:15]),
            "wrk": reports,
        }  # fmt: skip
        if late:
            result["fairness_first"] = fairness(before, only(after, first), size)
            result["fairness_late"] = fairness(before, only(after, set(after) - first), size)
        return result
    finally:
        procs.stop_all()


# ------------------------------------------------------------------ output


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _latency(lat: dict) -> str:
    ratio = lat.get("p99_over_p50")
    if not ratio:
        return "wrk reported no latency"
    return (
        f"p50 {_ms(lat.get('p50_s'))}  p90 {_ms(lat.get('p90_s'))}  p99 {_ms(lat.get('p99_s'))}  "
        f"max {_ms(lat.get('max_s'))} ms  p99/p50 {ratio:.1f}  "
        f"{lat.get('requests_per_s', 0):.0f} requests/s  non-2xx {lat.get('non_2xx')}"
        + (f"  socket errors: {lat['socket_errors']}" if lat.get("socket_errors") else "")
    )


def _fair(fair: dict) -> str:
    if not fair.get("connections"):
        return "no connection seen"
    return (
        f"min {fair['min']}  p1 {fair['p1']}  p50 {fair['p50']}  max {fair['max']}  "
        f"none: {fair['zero']} of {fair['connections']}"
    )


def print_target(res: dict, window: float) -> None:
    print(f"\n== {res['target']}  (proxy CPU {res['proxy_cpu_pct_core']:.0f} % of its core)")
    for name, wave in res["waves"].items():
        joined = f", joined after {wave['joined_after_s']:.0f} s" if wave["joined_after_s"] else ""
        print(f"{name} {wave['connections']} connections{joined}: {_latency(wave['latency'])}")
    print(f"requests a connection completed in {window:.0f} s  all: {_fair(res['fairness'])}")
    for part in ("first", "late"):
        if f"fairness_{part}" in res:
            print(f"  {part}: {_fair(res[f'fairness_{part}'])}")
    print(f"accept queue (largest seen)  {res['accept_queue_max']}")
    up = res["upstream"]
    if up.get("requests"):
        print(
            f"upstream  {up['connections']} connections for {up['requests']} requests "
            f"({1000 * up['connections'] / up['requests']:.1f} a thousand requests)"
        )
    print("kernel  " + "  ".join(f"{k} {v}" for k, v in res["counters"].items()))
    print(res["top"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.split("\n")[0])
    p.add_argument("--connections", type=int, default=1024, help="keep-alive connections")
    p.add_argument(
        "--late", type=int, default=512,
        help="of the connections, how many join later, once the proxy is saturated (0: all at once)",
    )  # fmt: skip
    p.add_argument(
        "--late-after", type=float, default=3.0, help="seconds after the first ones they join"
    )
    p.add_argument("--window", type=float, default=10.0, help="seconds the fairness count covers")
    p.add_argument("--delay", type=float, default=0.02, help="the upstream's seconds per answer")
    p.add_argument("--threads", type=int, default=2, help="wrk's threads")
    p.add_argument(
        "--targets", default="nginx,sidecar", help="comma list of nginx,sidecar,baseline"
    )
    p.add_argument(
        "--pin", choices=("auto", "off"), default="auto",
        help="auto: the proxy on the last CPU, the upstream and wrk on the others",
    )  # fmt: skip
    p.add_argument(
        "--baseline-tree", default=None, metavar="DIR",
        help="also run the sidecar of this source tree (another commit's files) as 'baseline'",
    )  # fmt: skip
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--keep-logs", default=None, metavar="DIR", help="keep process logs here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    wrk = shutil.which("wrk")
    missing = [tool for tool in ("wrk", "ss", "nstat") if shutil.which(tool) is None]
    if missing:
        print(f"needs {', '.join(missing)} (scripts/system-deps.sh installs them)", file=sys.stderr)
        return 1
    assert wrk is not None
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.baseline_tree and "baseline" not in targets:
        targets.append("baseline")
    nginx = find_nginx() if "nginx" in targets else None
    if "nginx" in targets and nginx is None:
        print("nginx is not installed (apt-get install nginx)", file=sys.stderr)
        return 1
    pin = pinning(args.pin)
    workdir = Path(args.keep_logs) if args.keep_logs else Path(tempfile.mkdtemp(prefix="overload-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.connections} connections, upstream answers after {args.delay * 1000:.0f} ms, "
        f"fairness window {args.window:.0f} s; pinning: "
        + (f"proxy on CPU {sorted(pin['proxy'])}, load on {sorted(pin['load'])}" if pin else "off")
    )
    results = []
    for target in targets:
        res = run_target(target, args, Procs(workdir, pin), nginx, wrk)
        print_target(res, args.window)
        results.append(res)
    if args.json:
        Path(args.json).write_bytes(
            orjson.dumps({"config": vars(args), "targets": results}, option=orjson.OPT_INDENT_2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
