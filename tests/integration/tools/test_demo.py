"""``llm-sidecar demo``: its Prometheus-style maths by hand-computed values, and the whole
demo run as a user runs it (real subprocesses, real sockets), leaving nothing behind."""

from __future__ import annotations

import math
import os
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from sidecar.cli import _build_parser
from sidecar.tools.demo import METRICS_PORT_OFFSET, metrics_port_for
from sidecar.tools.demo.draw import BAR_WIDTH, batching_lines, curve_lines, intro, plain_line
from sidecar.tools.demo.exposition import Snapshot, parse_snapshot
from sidecar.tools.demo.main import DEMO_SIMULATOR, simulator_args
from sidecar.tools.demo.quantiles import (
    WINDOW_SECONDS,
    bucket_deltas,
    counter_delta,
    histogram_quantile,
    window_baseline,
    window_figures,
)

INF = math.inf

# 10 observations: 2 in (0, 0.1], 4 in (0.1, 0.2], 3 in (0.2, 0.5], 1 above 0.5.
BUCKETS = ((0.1, 2.0), (0.2, 6.0), (0.5, 9.0), (INF, 10.0))


# -- histogram_quantile, checked against values worked out by hand ----------------------


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.1, 0.05),  # rank 1 of the 2 in the first bucket, which starts at 0
        (0.5, 0.175),  # rank 5: 3rd of the 4 in (0.1, 0.2] -> 0.1 + 0.1 * 3/4
        (0.6, 0.2),  # rank 6 is exactly the cumulative count at 0.2
        (0.75, 0.35),  # rank 7.5: 1.5 of the 3 in (0.2, 0.5] -> 0.2 + 0.3 * 0.5
        (0.9, 0.5),
        (0.99, 0.5),  # rank 9.9 lands in +Inf: the highest finite bound
        (1.0, 0.5),
    ],
)
def test_histogram_quantile_hand_computed(q, expected):
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)


def test_histogram_quantile_edges():
    assert histogram_quantile(0.5, ((0.1, 0.0), (INF, 0.0))) is None  # no data: NaN in PromQL
    assert histogram_quantile(0.5, ()) is None
    assert histogram_quantile(0.5, ((0.1, 3.0),)) is None  # no +Inf bucket: not a histogram
    assert histogram_quantile(-0.1, BUCKETS) == -INF
    assert histogram_quantile(1.1, BUCKETS) == INF
    assert histogram_quantile(0.5, ((INF, 4.0),)) is None  # only +Inf: nothing to interpolate
    # Every observation above the top finite bound.
    assert histogram_quantile(0.5, ((0.1, 0.0), (0.2, 0.0), (INF, 5.0))) == pytest.approx(0.2)
    # The rank in a bucket after empty ones: interpolates from the bound below it.
    assert histogram_quantile(
        0.5, ((0.1, 0.0), (0.2, 0.0), (0.4, 4.0), (INF, 4.0))
    ) == pytest.approx(0.3)


def test_histogram_quantile_matches_exact_for_uniform_data():
    # 1000 evenly spread values in (0, 1] with 0.1-wide buckets: interpolation is exact.
    bounds = [round(0.1 * i, 1) for i in range(1, 11)]
    buckets = tuple((b, 100.0 * i) for i, b in enumerate(bounds, 1)) + ((INF, 1000.0),)
    for q in (0.05, 0.5, 0.9, 0.99):
        assert histogram_quantile(q, buckets) == pytest.approx(q)


# -- deltas and windows ----------------------------------------------------------------


def test_deltas_over_a_window():
    old = ((0.1, 1.0), (0.2, 3.0), (INF, 4.0))
    new = ((0.1, 3.0), (0.2, 9.0), (INF, 14.0))
    assert bucket_deltas(new, old) == ((0.1, 2.0), (0.2, 6.0), (INF, 10.0))
    assert bucket_deltas(new, ()) == new  # a series that did not exist yet counts from 0
    assert counter_delta(10.0, 4.0) == 6.0
    assert counter_delta(3.0, 40.0) == 3.0  # reset, as Prometheus's increase() treats it


def test_window_baseline_picks_oldest_scrape_inside_the_window():
    history = [Snapshot(at=float(t)) for t in range(0, 16)]
    assert window_baseline(history, now=15.0, window=10.0).at == 5.0
    assert window_baseline(history[:4], now=3.0, window=10.0).at == 0.0  # before a whole window


def _exposition() -> str:
    """A real prometheus_client exposition: two label sets per metric, to be summed."""
    reg = CollectorRegistry()
    requests = Counter(
        "requests", "", ("model", "route", "code", "outcome"), namespace="llm", registry=reg
    )
    tokens = Counter("tokens", "", ("model", "route", "type"), namespace="llm", registry=reg)
    ttft = Histogram(
        "time_to_first_token_seconds", "", ("model", "route"), namespace="llm", registry=reg,
        buckets=(0.1, 0.2, 0.5),
    )  # fmt: skip
    requests.labels("m", "/v1/chat/completions", "200", "ok").inc(7)
    requests.labels("m", "/v1/completions", "500", "error").inc(2)
    requests.labels("m", "/v1/completions", "200", "cancelled").inc(1)
    tokens.labels("m", "/v1/chat/completions", "output").inc(300)
    tokens.labels("m", "/v1/completions", "output").inc(100)
    tokens.labels("m", "/v1/completions", "input").inc(999)
    for v in (0.05, 0.15, 0.15, 0.3):
        ttft.labels("m", "/v1/chat/completions").observe(v)
    for v in (0.05, 0.15, 0.4, 0.45, 0.9, 0.15):
        ttft.labels("m", "/v1/completions").observe(v)
    return generate_latest(reg).decode()


def test_parse_snapshot_sums_label_sets():
    snap = parse_snapshot(_exposition(), at=12.0)
    assert (snap.requests, snap.errors, snap.cancelled, snap.output_tokens) == (
        10.0,
        2.0,
        1.0,
        400.0,
    )
    assert snap.histograms["llm_time_to_first_token_seconds"] == BUCKETS
    assert snap.histograms["llm_inter_token_latency_seconds"] == ()  # no series yet


def test_the_curve_is_read_per_band_from_the_capacity_metrics():
    """The demo's curve uses the sidecar's own capacity metrics, through the real exporter."""
    from sidecar.export.capacity import CapacityMetrics

    registry = CollectorRegistry()
    capacity = CapacityMetrics(registry)
    for band, gap, n in (("1", 0.02, 50), ("4", 0.05, 40), ("8", 0.2, 30)):
        for _ in range(n):
            capacity.itl.labels("m", band).observe(gap)  # one gap per decode token
        capacity.seconds.labels("m", band).inc(n * gap)
    snap = parse_snapshot(generate_latest(registry).decode(), at=31.0)
    lines = curve_lines(snap, Snapshot(at=0.0))
    # the curve says what span it covers: the whole run, since the baseline scrape
    assert "since the start (31s)" in lines[0]
    header = lines[1]
    assert header.split()[:3] == ["decode", "streams", "ITL"]
    rows = [line for line in lines[2:] if line.strip().startswith("<=")]
    assert [r.split()[1] for r in rows] == ["1", "4", "8"]  # by band, empty bands left out
    # the bar has its own labelled column, beside ITL p95, and tok/s is a column after it
    bar_at, rate_at = header.index("ITL p95 as a bar"), header.index("tok/s")
    assert header.index("ITL p95") < bar_at < rate_at
    bars = [len(r[bar_at:rate_at].strip()) for r in rows]
    assert all(set(r[bar_at:rate_at].strip()) == {"█"} for r in rows)
    assert bars == sorted(bars) and bars[-1] == BAR_WIDTH  # the slowest band's p95 fills it
    assert [float(r[rate_at - 2 :]) for r in rows] == [50.0, 20.0, 5.0]  # tokens / decode s
    assert "tok/s" in lines[-1] and "█" not in lines[-1]  # the footnote says what tok/s is
    assert curve_lines(snap, snap) == []  # nothing new since the baseline: no curve


def test_window_figures_are_rates_and_quantiles_of_deltas():
    old = Snapshot(at=0.0)
    new = parse_snapshot(_exposition(), at=5.0)
    f = window_figures(new, old)
    assert f.requests_per_s == pytest.approx(2.0)
    assert f.output_tokens_per_s == pytest.approx(80.0)
    assert f.ttft_p50 == pytest.approx(0.175)
    assert f.ttft_p99 == pytest.approx(0.5)
    assert f.itl_p50 is None
    assert f.error_ratio == pytest.approx(0.2)
    line = plain_line(f, 5.0, 3, 8)
    assert "req/s 2.0" in line and "TTFT p50 175 ms p99 500 ms" in line and "ITL p50 -" in line
    assert "clients 3/8" in line and "last 5s:" in line  # who runs now; what span the figures cover
    assert "\x1b" not in line


# -- the demo, end to end ---------------------------------------------------------------


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _demo_port() -> int:
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 65535 - METRICS_PORT_OFFSET)
        if _bindable(port) and _bindable(port + METRICS_PORT_OFFSET):
            return port
    raise RuntimeError("no free pair of ports")


def _processes_mentioning(needle: str) -> list[str]:
    """Command lines of live processes containing ``needle`` (Linux /proc; else nothing)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and int(entry.name) != os.getpid():
            found.append(cmdline)
    return found


def _run_demo(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.integration
def test_demo_runs_shows_live_figures_and_leaves_nothing_behind():
    port = _demo_port()
    admin = port + 1  # the documented default: the port after --port
    result = _run_demo("--duration", "6", "--port", str(port))
    out = result.stdout
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{result.stderr}"

    assert f"curl -N http://127.0.0.1:{port}/v1/chat/completions" in out
    assert f"sidecar metrics    http://127.0.0.1:{admin}/metrics" in out
    assert "\x1b" not in out  # not a terminal: plain lines, no redrawing
    header = out[: out.index("\n\n")]
    assert "--enable-force-include-usage" in header
    assert "\n".join(batching_lines(DEMO_SIMULATOR, 8)) in header

    live = [line for line in out.splitlines() if line.startswith("[") and "req/s" in line]
    assert len(live) >= 4, out
    busy = [
        line
        for line in live
        if float(re.search(r"req/s ([\d.]+)", line).group(1)) > 0
        and re.search(r"TTFT p50 \d+ ms p99 \d+ ms", line)
    ]
    assert busy, out
    # the clients actually running: they join 2 s apart, so 6 s never sees all 8
    running = [int(re.search(r"clients (\d+)/8", line).group(1)) for line in live]
    assert running == sorted(running) and 1 <= running[0] < running[-1] < 8, out
    assert "summary over the whole run" in out and "sidecar exited with code 0" in out
    # the simulator force-includes usage, so the sidecar counts tokens from it; only streams
    # cut when the demo stops may be estimated
    counted = re.search(r"token counts   by source: (.*) \(llm_token_count_source_total\)", out)
    assert counted, out
    sources = {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", counted.group(1))}
    cancelled = int(re.search(r"(\d+) cancelled", out).group(1))
    assert sources.get("usage", 0) > 0 and sources.get("estimated", 0) <= cancelled, out
    # The summary draws the curve by band, lowest first. How many bands a 6 s run reaches is
    # up to its random mix: a fifth of its requests are not streamed, answers run 16-192
    # tokens, and only gaps that end while another stream decodes land above the first band
    # (so a run whose streams never overlapped has one band, truthfully). The drawing of
    # several bands is test_the_curve_is_read_per_band_from_the_capacity_metrics'.
    curve = out[out.index("decode streams") :].splitlines()[1:]
    assert "curve since the start" in out[: out.index("decode streams")].splitlines()[-2]
    bands = [int(m.group(1)) for line in curve if (m := re.match(r"\s+<= (\d+)\s", line))]
    assert bands and bands == sorted(set(bands)), out
    assert set(bands) <= {1, 2, 4, 8, 16, 32, 64, 128}, out

    sim = re.search(r"simulated server\s+http://127\.0\.0\.1:(\d+)", out)
    assert sim, out
    sim_port = int(sim.group(1))
    for p in (port, admin, sim_port):
        assert _bindable(p), f"port {p} still in use after the demo exited"
    if Path("/proc/self/cmdline").exists():
        assert _processes_mentioning(f"127.0.0.1:{port}") == []
        assert _processes_mentioning(f"127.0.0.1:{sim_port}") == []


@pytest.mark.integration
def test_demo_port_taken_is_a_one_line_error():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = taken = holder.getsockname()[1]
        if port + METRICS_PORT_OFFSET > 65535:
            port -= 1  # then the metrics port (the one after) is the taken one
        result = _run_demo("--duration", "2", "--port", str(port), timeout=30)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "in use" in lines[0], result.stderr
    assert f"127.0.0.1:{taken} " in lines[0], result.stderr


# -- the ports, the header, the clients -------------------------------------------------


def test_metrics_port_is_the_next_port_unless_given():
    assert metrics_port_for(8080) == 8081
    assert metrics_port_for(9000) == 9001  # make demo PORT=9000 moves both, predictably
    assert metrics_port_for(9000, 9464) == 9464
    demo = next(a for a in _build_parser()._actions if a.dest == "command").choices["demo"]
    args = demo.parse_args(["--port", "9000"])
    assert (args.port, args.metrics_port) == (9000, None)
    assert demo.parse_args(["--metrics-port", "9464"]).metrics_port == 9464
    assert "--port + 1" in demo.format_help()


@pytest.mark.integration
def test_metrics_port_taken_names_the_flag_and_the_rule():
    port = _demo_port()  # this port and the next are free; the next is then taken
    taken = port + 1
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        result = _run_demo("--duration", "2", "--port", str(port), timeout=30)
        given = _run_demo("--port", str(port), "--metrics-port", str(taken), timeout=30)
    for res in (result, given):
        assert res.returncode == 2 and res.stdout == "", res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert f"127.0.0.1:{taken} (metrics port" in line and "--metrics-port" in line, line
    assert "--port + 1" in result.stderr


@pytest.mark.integration
def test_bad_port_pairs_are_refused_before_anything_starts():
    same = _run_demo("--port", "20000", "--metrics-port", "20000", timeout=30)
    assert same.returncode == 2 and "must differ" in same.stderr
    top = _run_demo("--port", "65535", timeout=30)
    assert top.returncode == 2 and "--port must be 1-65534" in top.stderr


def test_the_demo_starts_the_simulator_its_header_describes():
    """The child's flags, parsed by the real CLI, give the config the header is drawn from."""
    sim = next(a for a in _build_parser()._actions if a.dest == "command").choices["simulate"]
    args = sim.parse_args(simulator_args(DEMO_SIMULATOR))
    for name in (
        "ttft", "tpot", "jitter", "tokens", "tokens_spread", "model", "fail_rate",
        "drop_rate", "batch_alpha", "batch_knee", "batch_knee_factor",
    ):  # fmt: skip
        assert getattr(args, name) == getattr(DEMO_SIMULATOR, name), name
    assert args.enable_force_include_usage is True


def test_the_header_names_the_batching_model_and_the_figure_at_each_stream_count():
    text = intro(DEMO_SIMULATOR, 41000, 8080, 8081, 8, 2.0, 10.0, "127.0.0.1")
    assert "tpot 30 ms alone" in text  # tpot is the one-stream figure, said so
    assert "continuous" in text and "tpot x (1 + 0.1 (n - 1))" in text
    assert "3x steeper past 4 streams" in text
    # the effective time per token the simulator gives n streams, from its own model
    for n in (1, 2, 4, 8):
        ms = round(DEMO_SIMULATOR.tpot * DEMO_SIMULATOR.batch_factor(n) * 1000)
        assert f"{ms} ms" in text, (n, ms, text)
    assert "75 ms at 8" in text  # 30 ms x (1 + 0.1 x (3 + 4 x 3)), worked out by hand
    assert "http://127.0.0.1:8081/metrics" in text and "default --port + 1" in text
    assert "8 concurrent clients joining 2s apart, all running after 14s" in text
    alone = intro(DEMO_SIMULATOR, 41000, 8080, 8081, 1, 2.0, None, "127.0.0.1")
    assert "all running" not in alone and "until Ctrl-C" in alone


def test_the_table_says_how_many_clients_run_and_over_what_span():
    from sidecar.tools.demo.draw import table_lines

    f = window_figures(parse_snapshot(_exposition(), at=4.0), Snapshot(at=0.0))
    lines = table_lines(f, 4.0, 2, 8)
    assert "2 of 8 clients running" in lines[0]
    assert f"last 4s (a {WINDOW_SECONDS:g}s sliding window)" in lines[1]


async def test_clients_count_as_running_from_when_they_join_until_they_leave():
    import asyncio

    import aiohttp
    from aiohttp import web

    from sidecar.tools.demo.load import LoadStats, client_loop

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"choices": []})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    stats, stop = LoadStats(), asyncio.Event()
    try:
        async with aiohttp.ClientSession() as session:
            tasks = [
                asyncio.create_task(client_loop(session, base, stats, stop, i, i * 0.3))
                for i in range(3)
            ]
            seen = []
            for _ in range(6):  # the last client joins at 0.6 s; the last look is at 1.5 s
                seen.append(stats.running)
                await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*tasks)
    finally:
        await runner.cleanup()
    assert seen[0] <= 1 and seen[-1] == 3 and seen == sorted(seen), seen
    assert stats.running == 0 and stats.sent > 0
