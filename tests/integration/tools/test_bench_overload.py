"""The overload benchmark (bench/overload.py): what it reads from wrk and the kernel, and a
short run end to end with real processes (wrk, nginx, the sidecar, the upstream).

Asserts what the report carries and that every connection is counted; never a timing, so a
busy machine cannot fail it. The starvation itself is tested by counting loop turns
(tests/integration/relay/server/test_accept_burst.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from bench.overload import COUNTERS, fairness, parse_wrk, request_bytes, wrk_script
from bench.run import find_nginx
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

WRK_REPORT = """Running 13s test @ http://127.0.0.1:57801/
  2 threads and 1024 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.05s   385.69ms   2.03s    65.51%
    Req/Sec   639.85    648.79     3.03k    85.84%
  Latency Distribution
     50%  986.94ms
     75%    1.26s
     90%    1.64s
     99%    1.96s
  11572 requests in 13.01s, 8.64MB read
  Socket errors: connect 0, read 3, write 0, timeout 0
  Non-2xx or 3xx responses: 7
Requests/sec:    889.67
Transfer/sec:    680.29KB
"""


def test_wrk_report_is_read_in_seconds_with_its_errors():
    got = parse_wrk(WRK_REPORT)
    assert got["p50_s"] == pytest.approx(0.98694)
    assert got["p90_s"] == pytest.approx(1.64)
    assert got["p99_s"] == pytest.approx(1.96)
    assert got["max_s"] == pytest.approx(2.03)
    assert got["mean_s"] == pytest.approx(1.05)
    assert got["requests"] == 11572
    assert got["requests_per_s"] == pytest.approx(889.67)
    assert got["socket_errors"] == "connect 0, read 3, write 0, timeout 0"
    assert got["non_2xx"] == 7
    assert got["p99_over_p50"] == pytest.approx(1.96 / 0.98694)


def test_fairness_counts_whole_requests_per_connection_and_the_starved():
    size = 100
    before = {"a": 100, "b": 300, "c": 500, "gone": 100}
    after = {"a": 100, "b": 950, "c": 1_550, "new": 200}  # a: none; b: 6 and a part; c: 10
    got = fairness(before, after, size)
    assert got == {
        "connections": 3, "min": 0, "p1": 0, "p50": 6, "max": 10, "zero": 1, "total": 16,
    }  # fmt: skip


def test_the_request_is_framed_and_the_lua_string_gives_it_back_byte_for_byte(tmp_path):
    request = request_bytes(8080)
    head, _, body = request.partition(b"\r\n\r\n")
    length = re.search(rb"Content-Length: (\d+)", head)
    assert length is not None and int(length.group(1)) == len(body)
    assert json.loads(body)["stream"] is False
    script = wrk_script(request, tmp_path / "r.lua").read_text()
    literal = re.fullmatch(r'local req = "(.*)"\nrequest = function\(\) return req end\n', script)
    assert literal is not None
    decoded = literal.group(1).replace("\\r\\n", "\r\n").replace('\\"', '"').replace("\\\\", "\\")
    assert decoded.encode() == request


def test_a_short_run_counts_every_connection_of_both_targets_and_both_waves(tmp_path):
    missing = [t for t in ("wrk", "ss", "nstat") if shutil.which(t) is None]
    if missing or find_nginx() is None:
        pytest.skip(f"needs {', '.join(missing) or 'nginx'} (scripts/system-deps.sh installs them)")
    out = tmp_path / "overload.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.overload", "--connections", "64", "--late", "16",
         "--late-after", "1", "--window", "2",
         "--json", str(out), "--keep-logs", str(tmp_path / "logs")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert [t["target"] for t in report["targets"]] == ["nginx", "sidecar"]
    for target in report["targets"]:
        name = target["target"]
        assert target["fairness"]["connections"] == 64, name
        assert target["fairness_first"]["connections"] == 48, name
        assert target["fairness_late"]["connections"] == 16, name
        assert target["fairness"]["total"] > 0, name
        for wave in ("first", "late"):
            latency = target["waves"][wave]["latency"]
            assert latency["non_2xx"] == 0, (name, target["wrk"][wave])
            assert {"p50_s", "p90_s", "p99_s", "max_s", "requests_per_s"} <= set(latency)
        assert set(target["counters"]) == set(COUNTERS)
        assert target["upstream"]["requests"] > 0 and target["upstream"]["connections"] >= 1
        assert target["top"].startswith("top"), name
    assert "requests a connection completed in 2 s" in proc.stdout
