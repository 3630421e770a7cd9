"""Relay benchmark: the same streaming load direct, through nginx and through the sidecar.

    .venv/bin/python -m bench.run --streams 200 --tokens 200 --tpot 0.02 --duration 20
    .venv/bin/python -m bench.run --streams 50,200,400 --json bench.json
    .venv/bin/python -m bench.run --quick           # seconds; a CI smoke test
    .venv/bin/python -m bench.run --shape mixed --streams 200 --duration 20 --rounds 5
    .venv/bin/python -m bench.run --quick --shape mixed

Per load point and target, fresh processes: the light vLLM-shaped upstream
(:mod:`bench.upstream`), the proxy under test (none for ``direct``; ``nginx`` with
``proxy_buffering off``, skipped with a note when not installed; ``python -m sidecar serve
--access-log false``), and the load generator (:mod:`bench.client`), each its own process.

Pinning (``--pin auto``, the default on a machine with 2+ CPUs): the proxy under test gets
the last CPU to itself; the upstream and the load generator share the others. The proxy's
CPU and latency are then its own, and ``direct`` runs with the same load processes on the
same CPUs, so "added latency" compares like with like.

``--pin spread`` gives each process of the proxy that relays (the sidecar's workers, an nginx
worker, a single process) a CPU of its own, counting down from the last, and leaves the load
unpinned: with ``--load-nice 19`` the load runs only where a relaying process leaves a CPU
idle, as in a pod whose CPU request gives the proxy its cores; how N workers compare with
one is measured that way (docs/performance.md).

Reported per target: tokens/s delivered in the steady window, errors, streams complete
and byte-identical to what the upstream generated (checksum), whether they arrived
unbuffered (ITL p50 within 25 % of tpot and < 5 % of gaps bunched below tpot/4), CPU
microseconds per token of the proxy process tree (``/proc/PID/stat`` utime+stime), its
peak RSS (``VmHWM``), client-observed TTFT and ITL p50/p99/max, and added TTFT/ITL
p50/p99 versus direct. The exit status is 1 only when a stream was incomplete or
corrupted, never because of timing.

Two load shapes (``--shape``):

* ``steady`` (the default): every connection is kept alive and runs ``--tokens``-token
  streamed chat completions back to back; every stream the same length, one route, one
  model.
* ``mixed``: what a fleet's proxy sees. Each request is drawn from (connection index,
  request number) by :func:`bench.wire.mixed_request`, so every target and every round gets
  the same sequence: output length log-uniform in ``--token-range`` (default 20..800; median
  ~126, mean ~210 tokens), 20 % non-streamed (one JSON body with ``usage``, answered when
  its streamed twin would have sent its last token), 25 % on ``/v1/completions`` (vLLM
  0.32's shape) and the rest on ``/v1/chat/completions``, four model names (weights
  4:3:2:1), and every fourth connection opens a new TCP connection per request
  (``Connection: close``) while the others keep alive. ``--streams`` is then the number of
  concurrent connections. Every response is still checked byte for byte; TTFT and ITL come
  from the streamed requests (from the connect for per-request connections), and it also
  reports requests/s, non-streamed latency p50/p99 and its excess over the upstream's
  schedule (added over direct too), CPU µs per request and requests per CPU-second of the
  proxy. CPU µs/token divides by every token delivered, streamed or not. ``--quick``
  shortens the range to 10..60 so the run takes seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson

from bench.client import token_range
from bench.wire import MIXED_TOKENS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGETS = ("direct", "nginx", "pyrelay", "sidecar")
DEFAULT_TARGETS = "direct,nginx,sidecar"

# The goal at 200 streams x 50 tok/s (#36, on both load shapes; #27's was 1.5x, +1.0 ms TTFT
# and +0.5 ms ITL p99; reported, never enforced by the exit status): what the sidecar adds
# over nginx (over direct when nginx did not run), and its memory.
GOAL = {
    "added_itl_p99_ms": 0.3,
    "added_ttft_p99_ms": 0.5,
    "cpu_vs_nginx": 1.25,
    "peak_rss_mb": 100.0,
}


# ------------------------------------------------------------------ /proc helpers


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(c) for c in fh.read().split()]
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += _children(p)
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (all their threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLK_TCK


def _status_fields(path: str, names: tuple[str, ...]) -> list[int]:
    """The first number of each named line of a ``/proc/.../status`` file (0 where absent);
    nothing when the file cannot be read (the process or thread is gone)."""
    found = dict.fromkeys(names, 0)
    try:
        with open(path) as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in found:
                    found[name] = int(rest.split()[0])
    except OSError:
        return []
    return list(found.values())


def context_switches(pids: list[int]) -> tuple[int, int]:
    """Voluntary and involuntary context switches of these processes, over all their threads
    (``/proc/PID/task/TID/status``): a voluntary one is the loop going back to wait for
    events, so per token it says how many tokens each wake-up handled; an involuntary one is
    the process preempted, on a machine where it shares its CPUs with the load."""
    voluntary = involuntary = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            counts = _status_fields(
                f"/proc/{pid}/task/{tid}/status",
                ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"),
            )
            if counts:
                voluntary, involuntary = voluntary + counts[0], involuntary + counts[1]
    return voluntary, involuntary


def system_busy_seconds() -> float:
    """CPU seconds all CPUs spent not idle since boot (``/proc/stat``)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK  # guest time is already in user


def peak_rss_kb(pids: list[int]) -> int:
    return sum(sum(_status_fields(f"/proc/{pid}/status", ("VmHWM",))) for pid in pids)


# ------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (
            p
            for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
            if os.access(p, os.X_OK)
        ),
        None,
    )


def find_pyspy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


class Procs:
    """Every process this run started, stopped by pid (never by name)."""

    def __init__(self, workdir: Path, pin: dict[str, set[int]] | None, load_nice: int = 0) -> None:
        self.workdir = workdir
        self.pin = pin
        self.load_nice = load_nice
        self.started: list[subprocess.Popen] = []

    def spawn(self, name: str, argv: list[str], role: str) -> subprocess.Popen:
        cpus = self.pin.get(role) if self.pin else None
        nice = self.load_nice if role == "load" else 0

        def place() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)
            if nice:
                os.nice(nice)

        log = open(self.workdir / f"{name}.log", "wb")
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=place if cpus or nice else None,
        )
        log.close()
        self.started.append(proc)
        return proc

    def stop(
        self, proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0
    ) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self.started:
            self.started.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.started)):
            self.stop(proc, timeout=5.0)

    def log(self, name: str) -> str:
        try:
            return (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""


def wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if 200 <= resp.status < 300:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready at {url} after {timeout:.0f} s")


def scrape_sidecar(admin_port: int) -> dict:
    """What the sidecar itself counted, to cross-check its figures against the client's."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5.0) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return {"error": str(exc)}
    out = {
        "output_tokens": 0.0,
        "requests": 0.0,
        "ok_requests": 0.0,
        "parse_errors": 0.0,
        "itl_observations": 0.0,
    }
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("llm_tokens_total{") and 'type="output"' in name:
            out["output_tokens"] += float(value)
        elif name.startswith("llm_requests_total{"):
            out["requests"] += float(value)
            if 'outcome="ok"' in name:
                out["ok_requests"] += float(value)
        elif name.startswith("llm_stream_parse_errors_total{"):
            out["parse_errors"] += float(value)
        elif name.startswith("llm_inter_token_latency_seconds_count{"):
            out["itl_observations"] += float(value)
    return {k: int(v) for k, v in out.items()}


# ------------------------------------------------------------------ one target


def start_nginx(nginx: str, name: str, up_port: int, procs: Procs) -> tuple[int, subprocess.Popen]:
    """nginx in front of ``up_port`` (bench/nginx.conf.template), answering; its port and process."""
    port = free_port()
    ndir = procs.workdir / name
    ndir.mkdir()
    conf = (HERE / "nginx.conf.template").read_text()
    conf = (
        conf.replace("@DIR@", str(ndir))
        .replace("@PORT@", str(port))
        .replace("@UPSTREAM_PORT@", str(up_port))
    )
    (ndir / "nginx.conf").write_text(conf)
    proxy = procs.spawn(name, [nginx, "-p", str(ndir), "-c", str(ndir / "nginx.conf")], "proxy")
    wait_http(f"http://127.0.0.1:{port}/health", proxy, "nginx")
    return port, proxy


def run_target(
    target: str, point: dict, args: argparse.Namespace, procs: Procs, nginx: str | None
) -> dict:
    py = sys.executable
    tag = f"{target}-{point['streams']}" + (f"-r{point['round']}" if point.get("round") else "")
    up_port = free_port()
    upstream = procs.spawn(
        f"upstream-{tag}",
        [py, "-m", "bench.upstream", "--port", str(up_port), "--ttft", str(args.ttft), "--tpot", str(args.tpot),
         *shape_args(args, "upstream")],
        "load",
    )  # fmt: skip
    proxy = None
    admin_port = None
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", upstream, "upstream")
        if target == "direct":
            port = up_port
        elif target == "nginx":
            port, proxy = start_nginx(nginx, f"nginx-{tag}", up_port, procs)  # type: ignore[arg-type]
        elif target == "pyrelay":
            port = free_port()
            argv = [py, "-m", "bench.pyrelay", "--port", str(port), "--upstream-port", str(up_port)]
            proxy = procs.spawn(f"pyrelay-{tag}", argv, "proxy")
            wait_http(f"http://127.0.0.1:{port}/health", proxy, "pyrelay")
        else:
            port, admin_port = free_port(), free_port()
            argv = [
                py, "-m", args.sidecar_module, "serve",
                "--upstream", f"http://127.0.0.1:{up_port}",
                "--listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{admin_port}",
                "--access-log", "false",
                *args.sidecar_args,
            ]  # fmt: skip
            proxy = procs.spawn(f"sidecar-{tag}", argv, "proxy")
            wait_http(f"http://127.0.0.1:{admin_port}/readyz", proxy, "sidecar")

        tree = process_tree(proxy.pid) if proxy else []
        placed = spread(tree) if args.pin == "spread" and tree else None
        out_file = procs.workdir / f"client-{tag}.json"
        cpu0, up0, sys0, t0 = (
            cpu_seconds(tree),
            cpu_seconds([upstream.pid]),
            system_busy_seconds(),
            time.monotonic(),
        )
        switches0 = context_switches(tree)
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        client = procs.spawn(
            f"client-{tag}",
            [
                py, "-m", "bench.client", "--port", str(port),
                "--streams", str(point["streams"]), "--tokens", str(args.tokens),
                "--tpot", str(args.tpot), "--ttft", str(args.ttft),
                "--duration", str(args.duration), "--ramp", str(point["ramp"]),
                "--out", str(out_file), *shape_args(args, "client"),
            ],
            "load",
        )  # fmt: skip
        profiler = None
        if args.profile and target == "sidecar":
            profiler = start_profiler(args, procs, proxy.pid, point)
        limit = (
            point["ramp"] + args.duration + longest_tokens(args) * args.tpot * 4 + args.ttft + 120
        )
        try:
            client.wait(limit)
        except subprocess.TimeoutExpired:
            procs.stop(client, signal.SIGKILL)
            raise RuntimeError(f"load generator did not finish within {limit:.0f} s") from None
        wall = time.monotonic() - t0
        cpu1, up1, sys1 = cpu_seconds(tree), cpu_seconds([upstream.pid]), system_busy_seconds()
        switches1 = context_switches(tree)
        kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the client, start-up included
        client_all = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
        if client.returncode != 0:
            raise RuntimeError(f"load generator failed:\n{procs.log(f'client-{tag}')}")
        if profiler is not None:
            procs.stop(profiler, signal.SIGINT, timeout=30.0)
        res = orjson.loads(out_file.read_bytes())
        res["target"] = target
        if placed is not None:  # --pin spread: pid -> the CPU it had to itself
            res["relays_pinned"] = {str(pid): cpu for pid, cpu in placed.items()}
        if proxy is not None:
            tokens = res["tokens_total"]
            res["proxy_cpu_s"] = cpu1 - cpu0
            res["proxy_cpu_pct_core"] = 100.0 * (cpu1 - cpu0) / wall
            res["proxy_cpu_us_per_token"] = 1e6 * (cpu1 - cpu0) / tokens if tokens else None
            requests = res["streams_complete"]
            res["proxy_cpu_us_per_request"] = 1e6 * (cpu1 - cpu0) / requests if requests else None
            res["requests_per_cpu_s"] = requests / (cpu1 - cpu0) if cpu1 > cpu0 else None
            res["peak_rss_mb"] = peak_rss_kb(process_tree(proxy.pid)) / 1024
            res["proxy_processes"] = len(tree)
            woke, preempted = (b - a for a, b in zip(switches0, switches1, strict=True))
            res["proxy_wakeups_per_token"] = woke / tokens if tokens else None
            res["proxy_preemptions_per_token"] = preempted / tokens if tokens else None
        else:
            res["proxy_cpu_s"] = res["proxy_cpu_pct_core"] = res["proxy_cpu_us_per_token"] = None
            res["proxy_cpu_us_per_request"] = res["requests_per_cpu_s"] = None
            res["peak_rss_mb"] = None
            res["proxy_processes"] = 0
            res["proxy_wakeups_per_token"] = res["proxy_preemptions_per_token"] = None
        res["upstream_cpu_pct_core"] = 100.0 * (up1 - up0) / wall
        res["client_cpu_pct_core"] = 100.0 * res["client_cpu_s"] / wall
        # Busy CPU that none of this run's processes account for: other work on the machine
        # (or kernel softirq time) that may have disturbed the latencies. Flagged when high.
        ours = (cpu1 - cpu0) + (up1 - up0) + client_all
        res["foreign_cpu_pct_core"] = max(0.0, 100.0 * ((sys1 - sys0) - ours) / wall)
        if target == "sidecar":
            time.sleep(0.2)  # the last request is finalised just after its client saw EOF
            res["sidecar_counted"] = scrape_sidecar(admin_port)
    finally:
        # The upstream first: the sidecar drains for as long as its upstream answers
        # (sidecar/relay/server/drain.py), as in a pod with a native sidecar.
        procs.stop(upstream)
        if proxy is not None:
            procs.stop(proxy)
    # The upstream's own count (its last log line) must match what the client received.
    lines = procs.log(f"upstream-{tag}").strip().splitlines()
    try:
        res["upstream_counted"] = orjson.loads(lines[-1]) if lines else None
    except orjson.JSONDecodeError:
        res["upstream_counted"] = None
    return res


def shape_args(args: argparse.Namespace, who: str) -> list[str]:
    """The load shape's arguments for bench.client or bench.upstream; none for the steady
    shape, so its command lines stay what they were."""
    if args.shape == "steady":
        return []
    if who == "upstream":
        return ["--shape", args.shape]
    return ["--shape", args.shape, "--token-range", ",".join(map(str, args.token_range))]


def longest_tokens(args: argparse.Namespace) -> int:
    """The longest response's tokens, for the load generator's time limit."""
    return args.token_range[1] if args.shape == "mixed" else args.tokens


def start_profiler(
    args: argparse.Namespace, procs: Procs, pid: int, point: dict
) -> subprocess.Popen | None:
    pyspy = find_pyspy()
    if pyspy is None:
        print("note: --profile needs py-spy (pip install py-spy); not profiling", file=sys.stderr)
        return None
    suffix = f"-r{point['round']}" if point.get("round") else ""
    out = Path(args.profile) / f"sidecar-{point['streams']}{suffix}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        pyspy,
        "record",
        "--pid",
        str(pid),
        "--rate",
        "250",
        "--format",
        "raw",
        "--output",
        str(out),
    ]
    argv += ["--native"] if args.profile_native else ["--nonblocking"]
    print(f"  profiling sidecar pid {pid} -> {out}", file=sys.stderr)
    return procs.spawn(f"py-spy-{point['streams']}", argv, "load")


# ------------------------------------------------------------------ figures


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def finish_target(res: dict, args: argparse.Namespace, direct: dict | None) -> dict:
    itl, ttft = res["itl_s"], res["ttft_s"]
    res["ttft_ms"] = {k: _ms(ttft[k]) for k in ("p50", "p99", "max")}
    res["itl_ms"] = {k: _ms(itl[k]) for k in ("p50", "p99", "max")}
    res["complete"] = (
        res["errors"] == 0
        and res["checksum_mismatches"] == 0
        and res["streams_complete"] == res["streams_started"] > 0
    )
    p50 = itl["p50"]
    res["unbuffered"] = bool(
        p50 is not None
        and abs(p50 - args.tpot) <= 0.25 * args.tpot
        and res["bunched_share"] is not None
        and res["bunched_share"] < 0.05
    )
    base = res if res["target"] == "direct" else direct
    if "nonstream_excess_s" in res:  # the mixed shape
        res["nonstream_latency_ms"] = {
            k: _ms(res["nonstream_latency_s"][k]) for k in ("p50", "p99", "max")
        }
        res["nonstream_excess_ms"] = {
            k: _ms(res["nonstream_excess_s"][k]) for k in ("p50", "p99", "max")
        }
    keys = (
        ("ttft_ms", "itl_ms", "nonstream_excess_ms")
        if "nonstream_excess_ms" in res
        else ("ttft_ms", "itl_ms")
    )
    for key in keys:
        res["added_" + key] = {
            q: _diff(res[key][q], base[key][q]) if base and key in base else None
            for q in ("p50", "p99")
        }
    return res


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def ratios(targets: dict) -> dict:
    d, n, s, r = (targets.get(k) for k in ("direct", "nginx", "sidecar", "pyrelay"))
    ran = lambda t: t is not None and "skipped" not in t  # noqa: E731
    out: dict = {}
    for name, t in (("nginx", n), ("pyrelay", r), ("sidecar", s)):
        if ran(t) and ran(d):
            out[f"{name}_vs_direct_tokens_per_s"] = _ratio(t["tokens_per_s"], d["tokens_per_s"])
    if ran(r) and ran(n):
        out["pyrelay_vs_nginx_cpu_per_token"] = _ratio(
            r["proxy_cpu_us_per_token"], n["proxy_cpu_us_per_token"]
        )
    if ran(s) and ran(r):
        out["sidecar_vs_pyrelay_cpu_per_token"] = _ratio(
            s["proxy_cpu_us_per_token"], r["proxy_cpu_us_per_token"]
        )
    if ran(s) and ran(n):
        out["sidecar_vs_nginx_cpu_per_token"] = _ratio(
            s["proxy_cpu_us_per_token"], n["proxy_cpu_us_per_token"]
        )
        out["sidecar_vs_nginx_peak_rss"] = _ratio(s["peak_rss_mb"], n["peak_rss_mb"])
        out["sidecar_minus_nginx_added_itl_p99_ms"] = _diff(
            s["added_itl_ms"]["p99"], n["added_itl_ms"]["p99"]
        )
        out["sidecar_minus_nginx_added_ttft_p99_ms"] = _diff(
            s["added_ttft_ms"]["p99"], n["added_ttft_ms"]["p99"]
        )
        if s.get("shape") == "mixed":  # steady's ratios stay the ones they were
            out["sidecar_vs_nginx_cpu_per_request"] = _ratio(
                s["proxy_cpu_us_per_request"], n["proxy_cpu_us_per_request"]
            )
            out["sidecar_minus_nginx_added_nonstream_excess_p99_ms"] = _diff(
                s["added_nonstream_excess_ms"]["p99"], n["added_nonstream_excess_ms"]["p99"]
            )
    return out


def goal(targets: dict, r: dict) -> dict | None:
    s = targets.get("sidecar")
    if s is None or "skipped" in s or targets.get("direct") is None:
        return None
    itl, ttft = _added(s, r, "itl"), _added(s, r, "ttft")
    checks = {
        "complete_and_unbuffered": s["complete"] and s["unbuffered"],
        f"added_itl_p99_ms<={GOAL['added_itl_p99_ms']}": itl <= GOAL["added_itl_p99_ms"],
        f"added_ttft_p99_ms<={GOAL['added_ttft_p99_ms']}": ttft <= GOAL["added_ttft_p99_ms"],
        f"peak_rss_mb<={GOAL['peak_rss_mb']:g}": (s["peak_rss_mb"] or 0) <= GOAL["peak_rss_mb"],
    }
    cpu = r.get("sidecar_vs_nginx_cpu_per_token")
    if cpu is not None:
        checks[f"cpu_per_token<={GOAL['cpu_vs_nginx']}x_nginx"] = cpu <= GOAL["cpu_vs_nginx"]
    return checks


def _added(sidecar: dict, ratios: dict, what: str) -> float:
    """Milliseconds the sidecar adds at p99 over nginx when nginx ran, else over direct."""
    over_nginx = ratios.get(f"sidecar_minus_nginx_added_{what}_p99_ms")
    if over_nginx is not None:
        return over_nginx
    return sidecar[f"added_{what}_ms"]["p99"] or 0


def summarize(rounds: list[dict]) -> dict:
    """Medians over the rounds of one load point, and the goal judged on them: each ratio
    is taken within its own round (same minute, same machine state), then the median of
    those is what counts; completeness must hold in every round."""
    keys = sorted({k for r in rounds for k, v in r["ratios"].items() if v is not None})
    ratio_stats = {}
    for k in keys:
        values = [r["ratios"][k] for r in rounds if r["ratios"].get(k) is not None]
        ratio_stats[k] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
    cpu = {}
    for name in rounds[0]["targets"]:
        values = [
            r["targets"][name].get("proxy_cpu_us_per_token") for r in rounds if name in r["targets"]
        ]
        values = [v for v in values if v is not None]
        if values:
            cpu[name] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
    checks = None
    sidecar = [r["targets"].get("sidecar") for r in rounds]
    if (
        all(s is not None and "skipped" not in s for s in sidecar)
        and rounds[0]["targets"].get("direct") is not None
    ):
        itl = statistics.median(
            _added(s, r["ratios"], "itl") for s, r in zip(sidecar, rounds, strict=True)
        )
        ttft = statistics.median(
            _added(s, r["ratios"], "ttft") for s, r in zip(sidecar, rounds, strict=True)
        )
        checks = {
            "complete_and_unbuffered": all(s["complete"] and s["unbuffered"] for s in sidecar),
            f"added_itl_p99_ms<={GOAL['added_itl_p99_ms']}": itl <= GOAL["added_itl_p99_ms"],
            f"added_ttft_p99_ms<={GOAL['added_ttft_p99_ms']}": ttft <= GOAL["added_ttft_p99_ms"],
            f"peak_rss_mb<={GOAL['peak_rss_mb']:g}": max(s["peak_rss_mb"] or 0 for s in sidecar)
            <= GOAL["peak_rss_mb"],
        }
        if "sidecar_vs_nginx_cpu_per_token" in ratio_stats:
            checks[f"cpu_per_token<={GOAL['cpu_vs_nginx']}x_nginx"] = (
                ratio_stats["sidecar_vs_nginx_cpu_per_token"]["median"] <= GOAL["cpu_vs_nginx"]
            )
    return {
        "streams": rounds[0]["streams"],
        "rounds": len(rounds),
        "cpu_us_per_token": cpu,
        "ratios": ratio_stats,
        "goal": checks,
    }


def print_summary(summary: dict) -> None:
    print(f"\n{summary['streams']} streams, median of {summary['rounds']} rounds (min-max):")
    for name, v in summary["cpu_us_per_token"].items():
        print(f"  CPU us/token {name:<8} {v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f})")
    for k, v in summary["ratios"].items():
        print(f"  {k} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})")
    if summary["goal"]:
        print(
            "issue goal (medians): "
            + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in summary["goal"].items())
        )


def _f(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _triple(d: dict) -> str:
    return "/".join(_f(d[k]) for k in ("p50", "p99", "max"))


def _pair(d: dict) -> str:
    return "/".join(_f(d[k], "{:+.1f}") for k in ("p50", "p99"))


def print_point(point: dict, args: argparse.Namespace) -> None:
    n = point["streams"]
    if args.shape == "mixed":
        lo, hi = args.token_range
        print(
            f"\n{n} connections, mixed shape (tokens log-uniform {lo}..{hi}, 20 % non-streamed, chat + completions, "
            f"4 models, 1 in 4 connections per request), tpot {args.tpot * 1e3:g} ms, ttft {args.ttft * 1e3:g} ms "
            f"(offered {point['offered_tokens_per_s']:,.0f} tok/s), {args.duration:g} s steady"
        )
    else:
        print(
            f"\n{n} streams x {args.tokens} tokens, tpot {args.tpot * 1e3:g} ms, ttft {args.ttft * 1e3:g} ms "
            f"(offered {point['offered_tokens_per_s']:,.0f} tok/s), {args.duration:g} s steady"
        )
    head = (
        f"{'target':<8} {'tok/s':>8} {'err':>4} {'complete':>9} {'unbuf':>5} {'CPU us/tok':>10} {'CPU %core':>9} "
        f"{'RSS MB':>7} {'TTFT ms p50/p99/max':>21} {'ITL ms p50/p99/max':>20} {'+TTFT p50/p99':>14} {'+ITL p50/p99':>13}"
    )
    print(head)
    print("-" * len(head))
    for name, t in point["targets"].items():
        if "skipped" in t:
            print(f"{name:<8} skipped: {t['skipped']}")
            continue
        print(
            f"{name:<8} {_f(t['tokens_per_s'], '{:,.0f}'):>8} {t['errors']:>4} "
            f"{t['streams_complete']:>4}/{t['streams_started']:<4} {'yes' if t['unbuffered'] else 'NO':>5} "
            f"{_f(t['proxy_cpu_us_per_token']):>10} {_f(t['proxy_cpu_pct_core']):>9} {_f(t['peak_rss_mb']):>7} "
            f"{_triple(t['ttft_ms']):>21} {_triple(t['itl_ms']):>20} {_pair(t['added_ttft_ms']):>14} "
            f"{_pair(t['added_itl_ms']):>13}"
        )
        if t["errors"]:
            print(f"{'':<8} errors: {t['error_kinds']}")
    if args.shape == "mixed":
        print_requests(point)
    r = point["ratios"]
    if r:
        print("ratios: " + ", ".join(f"{k} {_f(v, '{:.2f}')}" for k, v in r.items()))
    loads = ", ".join(
        f"{name} client {t['client_cpu_pct_core']:.0f}% upstream {t['upstream_cpu_pct_core']:.0f}%"
        for name, t in point["targets"].items()
        if "skipped" not in t
    )
    print(f"load processes (% of a core): {loads}")
    wakes = ", ".join(
        f"{name} {t['proxy_wakeups_per_token']:.3f} (preempted {t['proxy_preemptions_per_token']:.3f})"
        for name, t in point["targets"].items()
        if t.get("proxy_wakeups_per_token") is not None
    )
    if wakes:
        print(
            f"proxy wake-ups a token (the loop back to wait; fewer: more tokens a wake-up): {wakes}"
        )
    noisy = {
        name: t["foreign_cpu_pct_core"]
        for name, t in point["targets"].items()
        if "skipped" not in t
    }
    flag = (
        " -- other work ran during this point; latencies may be disturbed"
        if max(noisy.values(), default=0) > 15
        else ""
    )
    print(
        "foreign CPU (% of a core, not from this run): "
        + ", ".join(f"{k} {v:.0f}%" for k, v in noisy.items())
        + flag
    )
    s = point["targets"].get("sidecar")
    if s and "sidecar_counted" in s:
        print(
            f"sidecar counted: {s['sidecar_counted']} (client received {s['tokens_total']} tokens)"
        )
    if point.get("goal"):
        print(
            "issue goal: "
            + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in point["goal"].items())
        )


def print_requests(point: dict) -> None:
    """The mixed shape's per-request figures: rate, the proxy's CPU per request and its
    requests per CPU-second, and the non-streamed requests' latency."""
    head = (
        f"{'target':<8} {'req/s':>7} {'CPU us/req':>10} {'req/CPU-s':>9} {'non-streamed ms p50/p99':>23} "
        f"{'excess ms p50/p99':>17} {'+excess p50/p99':>15}  requests by kind"
    )
    print(head)
    print("-" * len(head))
    for name, t in point["targets"].items():
        if "skipped" in t:
            continue
        lat, exc = t["nonstream_latency_ms"], t["nonstream_excess_ms"]
        print(
            f"{name:<8} {_f(t['requests_per_s']):>7} {_f(t['proxy_cpu_us_per_request'], '{:,.0f}'):>10} "
            f"{_f(t['requests_per_cpu_s'], '{:,.0f}'):>9} {_f(lat['p50']) + '/' + _f(lat['p99']):>23} "
            f"{_f(exc['p50']) + '/' + _f(exc['p99']):>17} {_pair(t['added_nonstream_excess_ms']):>15}  "
            + ", ".join(f"{k} {v}" for k, v in sorted(t["kinds"].items()))
        )


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument(
        "--streams", default="200", help="concurrent streams; a comma list runs several load points"
    )
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream (steady shape)")
    p.add_argument(
        "--shape",
        choices=("steady", "mixed"),
        default="steady",
        help="the load shape (see module doc)",
    )
    p.add_argument(
        "--token-range", type=token_range, default=None, metavar="MIN,MAX",
        help="mixed shape: output tokens per request, log-uniform (default 20,800; 10,60 with --quick)",
    )  # fmt: skip
    p.add_argument(
        "--tpot", type=float, default=0.02, help="seconds between tokens of one stream (50 tok/s)"
    )
    p.add_argument("--ttft", type=float, default=0.05, help="upstream seconds to first token")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of steady load per target")
    p.add_argument(
        "--ramp", type=float, default=None, help="seconds over which streams start (default: 2)"
    )
    p.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        help="comma list of direct,nginx,sidecar and optionally pyrelay (a plain Python byte relay: the floor)",
    )
    p.add_argument("--json", default=None, help="also write the full results here")
    p.add_argument(
        "--rounds", type=int, default=1,
        help="run every target this many times per load point, interleaved, and judge the goal on the "
        "medians (a VM's CPU cost per token drifts between minutes, nginx's by up to 1.5x)",
    )  # fmt: skip
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny run (10 streams x 20 tokens, 1 s): checks correctness; its CPU figures are below clock-tick resolution",
    )
    p.add_argument(
        "--pin",
        choices=("auto", "off", "spread"),
        default="auto",
        help="CPU pinning (see module doc)",
    )
    p.add_argument(
        "--load-nice",
        type=int,
        choices=range(20),
        default=0,
        metavar="N",
        help="run the upstream and the load generator at this nice value (0-19): on a machine "
        "whose CPUs the proxy shares with the load, how often the proxy wakes, and so its CPU per "
        "token, depends on which of them the scheduler runs first",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="py-spy the sidecar under load; collapsed stacks in DIR",
    )
    p.add_argument(
        "--profile-native",
        action="store_true",
        help="with --profile: include native frames (pauses the process)",
    )
    p.add_argument(
        "--sidecar-args",
        default="",
        help="extra arguments for `sidecar serve`, e.g. '--read-timeout 900'",
    )
    p.add_argument(
        "--sidecar-module",
        default="sidecar",
        help="module run as `python -m MODULE serve ...` for the sidecar target (A/B a patched build)",
    )
    p.add_argument("--keep-logs", default=None, metavar="DIR", help="keep process logs here")
    p.add_argument(
        "--memory",
        action="store_true",
        help="also run bench.memory: RSS per concurrent stream and for the largest accepted body vs the chart's limit",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.streams, args.tokens, args.duration = "10", 20, 1.0
        args.ramp = 0.2 if args.ramp is None else args.ramp
    if args.token_range is None:
        args.token_range = (10, 60) if args.quick else MIXED_TOKENS
    args.stream_counts = [int(s) for s in str(args.streams).split(",") if s.strip()]
    args.target_list = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in args.target_list if t not in TARGETS]
    if bad or not args.target_list:
        p.error(
            f"--targets: choose from {','.join(TARGETS)} (direct is the baseline of 'added'); got {args.targets!r}"
        )
    args.sidecar_args = args.sidecar_args.split()
    return args


def spread(tree: list[int]) -> dict[int, int]:
    """``--pin spread``: every relaying process of the proxy's tree (its leaves; the root when
    it has no children) on a CPU of its own, counting down from the last, every thread of it.
    Returns pid -> CPU."""
    kids = {pid: set(_children(pid)) & set(tree) for pid in tree}
    relays = sorted(pid for pid in tree if not kids[pid]) or tree[:1]
    cpus = sorted(os.sched_getaffinity(0), reverse=True)
    placed = {}
    for i, pid in enumerate(relays):
        cpu = cpus[i % len(cpus)]
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            continue
        placed[pid] = cpu
    return placed


def pinning(mode: str) -> dict[str, set[int]] | None:
    if mode in ("off", "spread"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {"proxy": {cpus[-1]}, "load": set(cpus[:-1])}


def _interrupted(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt  # so `finally` stops every process this run started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Also when started in the background (SIGINT ignored) or stopped with SIGTERM.
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    nginx = find_nginx() if "nginx" in args.target_list else None
    pin = pinning(args.pin)
    workdir = (
        Path(args.keep_logs)
        if args.keep_logs
        else Path(tempfile.mkdtemp(prefix="llm-sidecar-bench-"))
    )
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Procs(workdir, pin, args.load_nice)
    report = {
        "config": {
            "tokens": args.tokens, "tpot_s": args.tpot, "ttft_s": args.ttft, "duration_s": args.duration,
            "streams": args.stream_counts, "targets": args.target_list, "quick": args.quick,
            "sidecar_args": args.sidecar_args, "shape": args.shape, "load_nice": args.load_nice,
            **({"token_range": list(args.token_range)} if args.shape == "mixed" else {}),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "pinning": {k: sorted(v) for k, v in pin.items()} if pin else None,
            "python": sys.version.split()[0],
            "nginx": nginx,
        },
        "load_points": [],
    }  # fmt: skip
    if pin:
        print(
            f"pinning: proxy on CPU {sorted(pin['proxy'])}, upstream + load generator on CPU {sorted(pin['load'])}"
        )
    elif args.pin == "spread":
        print("pinning: each relaying process of the proxy on a CPU of its own, the load unpinned")
    else:
        print("pinning: off")
    correct = True
    try:
        for n in args.stream_counts:
            ramp = args.ramp if args.ramp is not None else 2.0
            rounds = []
            for round_no in range(1, args.rounds + 1):
                point = {
                    "streams": n,
                    "ramp_s": ramp,
                    "offered_tokens_per_s": n / args.tpot,
                    "targets": {},
                }
                if args.rounds > 1:
                    point["round"] = round_no
                run_point = {"streams": n, "ramp": ramp, "round": point.get("round")}
                for target in args.target_list:
                    if target == "nginx" and nginx is None:
                        point["targets"]["nginx"] = {
                            "skipped": "nginx is not installed (apt-get install nginx)"
                        }
                        print(
                            "note: nginx is not installed; skipping the nginx target",
                            file=sys.stderr,
                        )
                        continue
                    print(f"  {n} streams: {target} ...", file=sys.stderr, flush=True)
                    res = run_target(target, run_point, args, procs, nginx)
                    res = finish_target(res, args, point["targets"].get("direct"))
                    correct &= res["complete"]
                    point["targets"][target] = res
                point["ratios"] = ratios(point["targets"])
                point["goal"] = goal(point["targets"], point["ratios"])
                report["load_points"].append(point)
                print_point(point, args)
                rounds.append(point)
            if len(rounds) > 1:
                summary = summarize(rounds)
                report.setdefault("summaries", []).append(summary)
                print_summary(summary)
        if args.memory:
            import asyncio

            from bench.memory import measure, print_report

            report["memory"] = asyncio.run(measure(args.stream_counts, 32 << 20))
            print_report(report["memory"])
    finally:
        procs.stop_all()
        if not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        print(f"\nwrote {args.json}")
    if not correct:
        print(
            "\nFAILED: some stream was incomplete or not byte-identical (see errors above)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
