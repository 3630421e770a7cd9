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

from sidecar.tools.demo import ADMIN_PORT_OFFSET
from sidecar.tools.demo.draw import curve_lines, plain_line
from sidecar.tools.demo.exposition import Snapshot, parse_snapshot
from sidecar.tools.demo.quantiles import (
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
            capacity.itl.labels("m", band).observe(gap)
        capacity.tokens.labels("m", band).inc(n)
        capacity.seconds.labels("m", band).inc(n * gap)
    snap = parse_snapshot(generate_latest(registry).decode(), at=1.0)
    lines = curve_lines(snap, Snapshot(at=0.0))
    assert lines[0].split()[:3] == ["decode", "streams", "ITL"]
    rows = [line.split() for line in lines[1:]]
    assert [r[1] for r in rows] == ["1", "4", "8"]  # ordered by band, empty bands left out
    assert [float(r[-2]) for r in rows] == [50.0, 20.0, 5.0]  # tokens / decode seconds
    bars = [len(r[-1]) for r in rows]
    assert bars == sorted(bars) and bars[-1] == 24  # the slowest band's p95 fills the bar
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
    line = plain_line(f, 5.0)
    assert "req/s 2.0" in line and "TTFT p50 175 ms p99 500 ms" in line and "ITL p50 -" in line
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
        port = rng.randrange(20000, 65535 - ADMIN_PORT_OFFSET)
        if _bindable(port) and _bindable(port + ADMIN_PORT_OFFSET):
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
    admin = port + ADMIN_PORT_OFFSET
    result = _run_demo("--duration", "6", "--port", str(port))
    out = result.stdout
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{result.stderr}"

    assert f"curl -N http://127.0.0.1:{port}/v1/chat/completions" in out
    assert f"http://127.0.0.1:{admin}/metrics" in out
    assert "\x1b" not in out  # not a terminal: plain lines, no redrawing

    live = [line for line in out.splitlines() if line.startswith("[") and "req/s" in line]
    assert len(live) >= 4, out
    busy = [
        line
        for line in live
        if float(re.search(r"req/s ([\d.]+)", line).group(1)) > 0
        and re.search(r"TTFT p50 \d+ ms p99 \d+ ms", line)
    ]
    assert busy, out
    assert "summary over" in out and "sidecar exited with code 0" in out
    # Clients join one by one, so the summary's curve has more than one band.
    curve = out[out.index("decode streams") :].splitlines()[1:]
    assert len([line for line in curve if line.strip().startswith("<=")]) >= 2, out

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
        port = holder.getsockname()[1]
        if port + ADMIN_PORT_OFFSET > 65535:
            pytest.skip("ephemeral port too high for the admin offset")
        result = _run_demo("--duration", "2", "--port", str(port), timeout=30)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "in use" in lines[0], result.stderr
