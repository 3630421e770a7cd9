"""The relay benchmark's quick mode, end to end: real processes, real sockets.

Asserts correctness only (every stream complete and byte-identical through every target,
the report carries every field); never a timing threshold, so CI noise cannot fail it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.run import find_nginx
from tests.conftest import IN_CI
from tests.support.paths import ROOT


TARGET_FIELDS = {
    "tokens_per_s", "errors", "error_kinds", "streams_started", "streams_complete", "checksum_mismatches",
    "complete", "unbuffered", "bunched_share", "tokens_total", "proxy_cpu_us_per_token", "proxy_cpu_pct_core",
    "peak_rss_mb", "ttft_ms", "itl_ms", "added_ttft_ms", "added_itl_ms", "client_cpu_pct_core",
    "upstream_cpu_pct_core", "foreign_cpu_pct_core", "upstream_counted",
}  # fmt: skip

pytestmark = pytest.mark.integration


def test_quick_benchmark_relays_every_stream_intact(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["config"]["quick"] is True
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
        assert TARGET_FIELDS <= t.keys(), (name, TARGET_FIELDS - t.keys())
        assert t["complete"], (name, t["error_kinds"])
        assert t["errors"] == 0 and t["checksum_mismatches"] == 0
        assert t["streams_started"] == t["streams_complete"] >= 10
        assert t["tokens_total"] == 20 * t["streams_complete"]
        for key in ("ttft_ms", "itl_ms"):
            assert set(t[key]) == {"p50", "p99", "max"}
            assert all(v is not None for v in t[key].values())
        for key in ("added_ttft_ms", "added_itl_ms"):
            assert set(t[key]) == {"p50", "p99"}
        # What the upstream generated is what the client received, through every target.
        assert t["upstream_counted"]["completed"] == t["streams_complete"]
        assert t["upstream_counted"]["tokens"] == t["tokens_total"]
        if name == "direct":
            assert t["proxy_cpu_us_per_token"] is None
        else:
            assert t["proxy_cpu_us_per_token"] is not None and t["peak_rss_mb"] > 0

    # The sidecar measured what the client received: same requests, same output tokens.
    counted = targets["sidecar"]["sidecar_counted"]
    assert counted["ok_requests"] == counted["requests"] == targets["sidecar"]["streams_complete"]
    assert counted["output_tokens"] == targets["sidecar"]["tokens_total"]
    assert counted["parse_errors"] == 0

    assert "sidecar_vs_direct_tokens_per_s" in point["ratios"]
    if nginx_present:
        assert "sidecar_vs_nginx_cpu_per_token" in point["ratios"]
    assert point["goal"] is not None


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
        assert only[side]["tokens"] >= 5 * 20 and only[side]["tokens"] % 20 == 0  # whole streams, 5 at least
        assert only[side]["cpu_us_per_token"] > 0
    assert only["b_vs_a_cpu_per_token"] == pytest.approx(only["b"]["cpu_us_per_token"] / only["a"]["cpu_us_per_token"])
    assert report["summary"]["complete"] is True
