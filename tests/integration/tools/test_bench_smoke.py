"""The relay benchmark's quick mode, end to end: real processes, real sockets, both load
shapes (steady, and mixed: lengths, routes, models, non-streamed, per-request connections).

Asserts correctness only (every stream complete and byte-identical through every target,
the report carries every field); never a timing threshold, so CI noise cannot fail it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from bench.run import find_nginx, process_tree, spread
from bench.wire import COMPLETIONS_PATH, MODELS, closes_per_request, expected_body, mixed_request
from tests.support.paths import ROOT
from tests.support.skips import IN_CI

TARGET_FIELDS = {
    "tokens_per_s", "errors", "error_kinds", "streams_started", "streams_complete", "checksum_mismatches",
    "complete", "unbuffered", "bunched_share", "tokens_total", "proxy_cpu_us_per_token", "proxy_cpu_pct_core",
    "peak_rss_mb", "ttft_ms", "itl_ms", "added_ttft_ms", "added_itl_ms", "client_cpu_pct_core",
    "upstream_cpu_pct_core", "foreign_cpu_pct_core", "upstream_counted", "requests_per_s",
    "proxy_cpu_us_per_request", "requests_per_cpu_s", "proxy_wakeups_per_token",
    "proxy_preemptions_per_token", "client_nice",
}  # fmt: skip
MIXED_FIELDS = {
    "streamed_tokens_total", "nonstream_latency_ms", "nonstream_excess_ms", "added_nonstream_excess_ms",
    "kinds", "models", "connections_opened",
}  # fmt: skip
KINDS = {"chat_stream", "chat_whole", "completions_stream", "completions_whole"}

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("shape", ["steady", "mixed"])
def test_quick_benchmark_relays_every_stream_intact(tmp_path, shape):
    out = tmp_path / "bench.json"
    # The steady run puts the load a little lower in the scheduler's order (--load-nice).
    nice = 3 if shape == "steady" else 0
    argv = [sys.executable, "-m", "bench.run", "--quick", "--shape", shape, "--json", str(out)]
    proc = subprocess.run(
        [*argv, "--load-nice", str(nice)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["config"]["quick"] is True
    assert report["config"]["shape"] == shape
    mixed = shape == "mixed"
    (point,) = report["load_points"]
    targets = point["targets"]

    nginx_present = find_nginx() is not None
    if IN_CI:
        assert nginx_present, "CI installs nginx (scripts/system-deps.sh)"
    expected = {"direct", "sidecar"} | ({"nginx"} if nginx_present else set())
    ran = {name for name, t in targets.items() if "skipped" not in t}
    assert ran == expected
    if not nginx_present:
        assert "not installed" in targets["nginx"]["skipped"]

    for name in ran:
        t = targets[name]
        fields = TARGET_FIELDS | (MIXED_FIELDS if mixed else set())
        assert fields <= t.keys(), (name, fields - t.keys())
        assert t["complete"], (name, t["error_kinds"])
        assert t["errors"] == 0 and t["checksum_mismatches"] == 0
        assert t["streams_started"] == t["streams_complete"] >= 10
        if mixed:
            # Every kind, route and model went through and came back byte-identical (the
            # first request of each of the 10 connections already covers them all).
            assert set(t["kinds"]) == KINDS and sum(t["kinds"].values()) == t["streams_complete"]
            assert set(t["models"]) == set(MODELS)
            assert 0 < t["streamed_tokens_total"] < t["tokens_total"]
            assert (
                t["nonstream_latency_ms"]["p50"] is not None
                and t["nonstream_excess_ms"]["p99"] is not None
            )
            # 3 of the 10 connections connect per request: more connects than connections.
            assert t["connections_opened"] > 10
            assert t["requests_per_s"] > 0
        else:
            assert t["tokens_total"] == 20 * t["streams_complete"]
        for key in ("ttft_ms", "itl_ms"):
            assert set(t[key]) == {"p50", "p99", "max"}
            assert all(v is not None for v in t[key].values())
        for key in ("added_ttft_ms", "added_itl_ms"):
            assert set(t[key]) == {"p50", "p99"}
        # What the upstream generated is what the client received, through every target.
        assert t["upstream_counted"]["completed"] == t["streams_complete"]
        assert t["upstream_counted"]["tokens"] == t["tokens_total"]
        assert t["client_nice"] == min(19, os.nice(0) + nice)
        if name == "direct":
            assert t["proxy_cpu_us_per_token"] is None
            assert t["proxy_wakeups_per_token"] is None
        else:
            assert t["proxy_cpu_us_per_token"] is not None and t["peak_rss_mb"] > 0
            assert t["proxy_cpu_us_per_request"] > 0
            # A proxy goes back to wait for events at least once while it relays them.
            assert t["proxy_wakeups_per_token"] > 0 and t["proxy_preemptions_per_token"] >= 0

    # The sidecar measured what the client received: same requests, same output tokens.
    counted = targets["sidecar"]["sidecar_counted"]
    assert counted["ok_requests"] == counted["requests"] == targets["sidecar"]["streams_complete"]
    assert counted["output_tokens"] == targets["sidecar"]["tokens_total"]
    assert counted["parse_errors"] == 0

    assert "sidecar_vs_direct_tokens_per_s" in point["ratios"]
    if nginx_present:
        assert "sidecar_vs_nginx_cpu_per_token" in point["ratios"]
        assert ("sidecar_vs_nginx_cpu_per_request" in point["ratios"]) is mixed
    assert point["goal"] is not None


def test_mixed_shape_draws_the_same_sequence_in_the_stated_proportions():
    """What every target gets: a pure function of (connection, request number), with the
    shares the docs state, and valid vLLM-shaped bodies for every kind."""
    draws = [mixed_request(c, s) for c in range(100) for s in range(50)]
    assert draws == [mixed_request(c, s) for c in range(100) for s in range(50)]
    n = len(draws)
    assert 0.17 < sum(not d.stream for d in draws) / n < 0.23
    assert 0.22 < sum(d.route == COMPLETIONS_PATH for d in draws) / n < 0.28
    tokens = sorted(d.tokens for d in draws)
    assert tokens[0] >= 20 and tokens[-1] <= 800
    assert 100 < tokens[n // 2] < 160  # log-uniform: the median near sqrt(20 * 800) = 126
    assert sum(closes_per_request(c) for c in range(100)) == 25
    assert {d.kind for d in draws[::50][:10]} == KINDS  # the quick run's first requests
    for sid, d in enumerate(draws[:200]):
        body = expected_body(sid, d)
        if d.stream:
            events = body.split(b"\n\n")
            assert events[-2:] == [b"data: [DONE]", b""] and len(events) - 1 == d.events()
            docs = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
            assert all(doc["model"] == d.model for doc in docs)
            assert docs[-1]["choices"][0]["finish_reason"] == "length"
        else:
            doc = json.loads(body)
            assert doc["usage"]["completion_tokens"] == d.tokens and doc["model"] == d.model


def test_paired_benchmark_runs_two_proxies_at_once(tmp_path):
    """bench.paired, tiny: two sidecars side by side (an A/A run), every stream of both
    complete and byte-identical, a CPU figure for each and their ratio."""
    out = tmp_path / "paired.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.paired", "--a", "sidecar", "--b", "sidecar", "--rounds", "1",
            "--streams", "10", "--tokens", "20", "--duration", "1", "--ramp", "0.2", "--json", str(out),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    (only,) = report["rounds"]
    for side in ("a", "b"):
        assert only[side]["complete"] is True
        assert (
            only[side]["tokens"] >= 5 * 20 and only[side]["tokens"] % 20 == 0
        )  # whole streams, 5 at least
        assert only[side]["cpu_us_per_token"] > 0
    assert only["b_vs_a_cpu_per_token"] == pytest.approx(
        only["b"]["cpu_us_per_token"] / only["a"]["cpu_us_per_token"]
    )
    assert report["summary"]["complete"] is True


def test_spread_gives_each_relaying_process_a_cpu_of_its_own():
    """``--pin spread`` pins the leaves of the proxy's process tree (a supervisor's workers),
    each to its own CPU from the last down, and leaves the parent where it was."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs to give two processes one each")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         f"kids = [subprocess.Popen({sleeper!r}) for _ in range(2)]\n"
         "print('up', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "up\n"
        tree = process_tree(parent.pid)
        assert len(tree) == 3, tree
        placed = spread(tree)
        kids = sorted(set(tree) - {parent.pid})
        assert placed == {kids[0]: cpus[-1], kids[1]: cpus[-2]}
        for kid, cpu in placed.items():
            assert os.sched_getaffinity(kid) == {cpu}
        assert os.sched_getaffinity(parent.pid) == set(cpus)
        # A process with no children relays itself.
        assert spread([kids[0]]) == {kids[0]: cpus[-1]}
    finally:
        for pid in process_tree(parent.pid)[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()
