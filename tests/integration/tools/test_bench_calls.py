"""bench.calls end to end on a tiny run: three profiled sidecar processes, real sockets, the
simulator upstream. Asserts what the report means, never a count a change could move."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.integration


def test_a_tiny_count_reports_calls_per_request_per_token_and_the_sidecars_top_functions(
    tmp_path,
):
    out = tmp_path / "calls.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.calls", "--requests", "8,24", "--tokens", "2,10",
         "--clients", "4", "--top", "15", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [(r["requests"], r["tokens"]) for r in runs] == [(8, 2), (24, 2), (8, 10)]
    a, b, c = (r["calls"] for r in runs)
    # The difference over the difference: start-up and shutdown, in every run, cancel.
    assert report["calls_per_request"] == pytest.approx((b - a) / 16)
    assert report["calls_per_token"] == pytest.approx((c - a) / (8 * 8))
    assert a > 10 * (b - a) / 16, "each run's count includes the sidecar's start-up"
    assert report["calls_per_request"] > 100, "a relayed request is hundreds of calls"
    assert report["reads_per_token"] > 0, "a longer stream is more reads of the upstream"
    for what in ("request", "token"):
        top = report[f"top_per_{what}"]
        assert len(top) == 15
        assert [r["calls"] for r in top] == sorted((r["calls"] for r in top), reverse=True)
        # The sidecar's process was profiled, not the load or the simulator (this process).
        names = [r["function"] for r in top]
        assert not [n for n in names if n.startswith(("bench/", "sidecar/tools/"))], names
        assert not [n for n in names if " at 0x" in n], "one name per function in every run"
    assert "calls per 2-token request" in done.stdout and "calls per token" in done.stdout
