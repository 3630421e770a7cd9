"""The soak at test-suite scale: 100 concurrent streams for 10 s through one sidecar process
(``scripts/soak.py``, which runs the same at hundreds of streams for minutes).

Every stream must arrive byte-identical and in order (sha256 against the upstream's
deterministic bytes), with no error, every one counted ``ok`` by the sidecar, its request
log complete, and its memory flat between the moment all streams run and the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.integration


def test_soak_small_scale(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--streams", "100", "--duration", "10",
         "--tokens", "40", "--tpot", "0.02", "--ttft", "0.05", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert out.exists(), proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    print(
        f"\nsoak: {report['streams_completed']} streams, {report['bytes_relayed']} B, RSS MiB {report['sidecar_rss_mb']}, fds {report['sidecar_fds']}"
    )
    assert report["passed"], report
    assert report["mismatches"] == 0 and report["errors"] == 0, report["error_kinds"]
    # ~1 s streams on 100 slots for 10 s: ~1000 on a quiet machine, 195 seen beside other test
    # runs on 2 cores; what must hold is that every slot kept streaming, not a throughput.
    assert report["streams_completed"] >= 100
    counted = report["sidecar_counted"]
    assert (
        counted["ok"] == report["streams_completed"]
        and counted["error"] == counted["cancelled"] == 0
    )
    assert counted["output_tokens"] == report["tokens_relayed"]
    rss = report["sidecar_rss_mb"]
    assert rss["end"] - rss["start"] < 16, rss  # flat once every stream is running
    assert proc.returncode == 0


def test_serve_raises_its_open_file_limit(tmp_path):
    """Two sockets per stream: a soft limit of 1024 would cap the sidecar near 500 streams,
    so ``serve`` lifts the soft limit to the hard one at start."""
    import resource
    import time

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip("needs a finite hard limit above 256")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--upstream", "http://127.0.0.1:9",
         "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while b'"started"' not in (line := proc.stdout.readline()):
            assert line and time.monotonic() < deadline, proc.stderr.read()
        assert json.loads(line)["open_files_limit"] == hard
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft_now = next(
            line.split()[3] for line in limits.splitlines() if line.startswith("Max open files")
        )
        assert int(soft_now) == hard
    finally:
        proc.kill()
        proc.wait(timeout=10)
