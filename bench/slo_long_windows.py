"""What a long SLO window costs Prometheus, raw vs recorded: ``python -m bench.slo_long_windows``.

The rules used to evaluate ``rate(llm_time_to_first_token_seconds_bucket[3d])`` (and
``[30d]``) over every pod, route and class at every evaluation; now the 1d, 3d and period
windows are ``sum_over_time`` of the recorded base-window rates (``sidecar/tools/slo/rules.py``).
This builds a TSDB with ``promtool tsdb create-blocks-from openmetrics``: DAYS days of a TTFT
histogram (PODS x ROUTES series of every bucket, one sample a minute) and the two recorded
rate series the rules would have written, opens it with Debian's Prometheus (no scraping),
and asks both forms of the same ``llm:sli_error:ratio_rate<DAYS>d`` at the end with
``stats=all``. Printed: the samples each form loads and its best wall time of REPEATS, the
ratios raw / recorded, and that both give the same ratio (to 1e-3; the recorded form's
window edges taper over 5m).

Numbers only; nothing is asserted in tests from timings.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from sidecar.base.buckets import TTFT_BUCKETS
from sidecar.tools.slo import conventions as c, parse_spec
from sidecar.tools.slo.rules import sli_error_expr

MODEL = "m"
STEP = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bucket_share(le: float) -> float:
    """Cumulative share of requests at or under ``le``: a fixed, plausible TTFT shape."""
    return min(1.0, le / 2.5) if le < 2.5 else 0.97 + 0.03 * min(1.0, (le - 2.5) / 30)


def write_openmetrics(path: Path, days: int, pods: int, routes: int, end: int) -> None:
    points = days * 86400 // STEP + 1
    start = end - (points - 1) * STEP
    rate = 10.0  # requests/s per series
    with path.open("w", encoding="utf-8") as fh:
        fh.write("# TYPE llm_time_to_first_token_seconds histogram\n")
        for p in range(pods):
            for r in range(routes):
                base = (
                    f'model="{MODEL}",namespace="ns",pod="pod-{p}",route="/r{r}",prompt_class="all"'
                )
                for le in (*TTFT_BUCKETS, float("inf")):
                    share = 1.0 if le == float("inf") else _bucket_share(le)
                    label = "+Inf" if le == float("inf") else repr(le)
                    for i in range(points):
                        fh.write(
                            f'llm_time_to_first_token_seconds_bucket{{{base},le="{label}"}} {rate * share * i * STEP:.1f} {start + i * STEP}\n'
                        )
                for i in range(points):
                    fh.write(
                        f"llm_time_to_first_token_seconds_count{{{base}}} {rate * i * STEP:.1f} {start + i * STEP}\n"
                    )
        # What the recording rules write each minute: bad and all events/s over 5m, per group.
        total = rate * pods * routes
        bad = total * (1 - _bucket_share(2.0))
        for name, value in (("llm:sli_bad_events:rate5m", bad), ("llm:sli_events:rate5m", total)):
            fh.write(f"# TYPE {name.replace(':', '_')} gauge\n")
            for i in range(1, points):
                fh.write(
                    f'{name}{{slo="ttft",namespace="ns",model="{MODEL}"}} {value} {start + i * STEP}\n'
                )
        fh.write("# EOF\n")


def query(base: str, expr: str, at: int) -> tuple[float, int, float]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode(
        {"query": expr, "time": at, "stats": "all"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        doc = json.load(r)
    elapsed = time.perf_counter() - started
    assert doc["status"] == "success", doc
    (sample,) = doc["data"]["result"]
    return (
        float(sample["value"][1]),
        doc["data"]["stats"]["samples"]["totalQueryableSamples"],
        elapsed,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--routes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    if not promtool or not prometheus:
        print("needs Debian's prometheus (promtool and prometheus): make system-deps")
        return 2
    end = (int(time.time()) // 3600 - 1) * 3600
    with tempfile.TemporaryDirectory(prefix="slo-bench-") as tmp:
        tmp_path = Path(tmp)
        om = tmp_path / "data.om"
        t0 = time.perf_counter()
        write_openmetrics(om, args.days, args.pods, args.routes, end)
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp_path / "tsdb")],
            check=True, capture_output=True,
        )  # fmt: skip
        om.unlink()
        print(
            f"built {args.days}d x {args.pods} pods x {args.routes} routes in {time.perf_counter() - t0:.1f}s"
        )
        port = free_port()
        (tmp_path / "prometheus.yml").write_text("global: {}\n", encoding="utf-8")
        proc = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=3650d", "--log.level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"{base}/-/ready", timeout=2)
                    break
                except OSError:
                    assert time.monotonic() < deadline and proc.poll() is None, (
                        "prometheus did not start"
                    )
                    time.sleep(0.3)
            spec = parse_spec({"version": 1, "grouping": ["namespace", "model"], "objectives": [
                {"name": "ttft", "sli": "ttft", "target": 95, "threshold_seconds": 2.0}]})  # fmt: skip
            scope = spec.objectives[0].scopes()[0]
            window = args.days * 86400
            span = f"{args.days}d"
            sel = f'{{slo="ttft",namespace="ns",model="{MODEL}"}}'
            forms = {
                "raw": sli_error_expr(scope, window, spec.grouping),
                "recorded": (
                    f"sum_over_time({c.sli_bad_events_record(300)}{sel}[{span}])"
                    f" / sum_over_time({c.sli_events_record(300)}{sel}[{span}])"
                ),
            }
            results = {}
            for name, expr in forms.items():
                runs = [query(base, expr, end) for _ in range(args.repeats)]
                results[name] = (runs[0][0], runs[0][1], min(r[2] for r in runs))
                value, samples, best = results[name]
                print(
                    f"{name:9s} ratio {value:.5f}  samples loaded {samples:>10,d}  best of {args.repeats}: {best * 1000:.1f} ms"
                )
            raw, rec = results["raw"], results["recorded"]
            print(
                f"raw / recorded: samples x{raw[1] / rec[1]:.0f}, time x{raw[2] / rec[2]:.1f}; same ratio: {abs(raw[0] - rec[0]) < 1e-3}"
            )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
