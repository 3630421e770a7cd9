"""bench.memory end to end with real processes: the report carries every figure, and the
figures are sane (never a timing or size threshold beyond what is physically implied)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.memory import chart_memory_limit, largest_body
from sidecar.measure.request_fields import scan_request_fields
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration


def test_largest_body_is_the_largest_the_sidecar_reads_and_is_valid():
    body = largest_body(32 << 20)
    assert (32 << 20) - 64 < len(body) <= 32 << 20
    fields = scan_request_fields(body)
    assert fields is not None and fields.model == "m" and fields.stream


def test_chart_limit_is_read_from_the_chart():
    assert chart_memory_limit() == 512 << 20


def test_memory_bench_reports_streams_and_the_largest_body(tmp_path):
    out = tmp_path / "memory.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.memory", "--streams", "20", "--body-bytes", str(4 << 20), "--json", str(out),
            "--attacks", "unended_heads",  # the cheapest hostile mix: the report's shape, not the figures
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["chart_limit_mib"] == 512
    (point,) = report["streams"]
    assert point["concurrent"] == 20 and point["rss_mib"] >= report["idle_rss_mib"] * 0.9
    body = report["largest_body"]
    assert (4 << 20) - 64 < body["bytes"] <= 4 << 20
    assert body["peak_rss_mib"] >= body["rss_while_streaming_mib"] * 0.9
    assert "streams that fit" in proc.stdout
    ((name, attack),) = report["attacks"].items()
    assert name == "unended_heads" and attack["peak_rss_mib"] >= attack["rss_before_mib"] * 0.9
    assert attack["healthz_max_ms"] > 0 and "attack unended_heads" in proc.stdout
