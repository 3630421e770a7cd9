"""A fleet in one Prometheus: what N pods of the sidecar cost the Prometheus that scrapes them.

    .venv/bin/python -m bench.fleet --pods 50,200 --json fleet.json
    .venv/bin/python -m bench.fleet --quick                      # seconds; the smoke test
    .venv/bin/python -m bench.fleet --tree /tmp/other-checkout --pods 50,200
    .venv/bin/python -m bench.fleet --engines prometheus --pages pages.json   # a kept recording

1. **Record a page** (:mod:`bench.fleet_record`): the production sidecar of ``--tree`` (its
   ``sidecar`` package, run with the chart's defaults) in front of simulated servers for three
   models, under a realistic mix (chat and completions, 80 % streamed, 500s, streams cut and
   cancelled, unknown models) at ``--rate`` requests a second for ``--record-seconds``; its
   ``/metrics`` read every ``--page-every`` seconds.
2. **Serve N pods** (:mod:`bench.fleet_pods`): one process serves that page as N pods, each with
   its own phase, its counters advancing at the recorded rate. Prometheus gives each target the
   labels the chart's PodMonitor gets from the Prometheus Operator: ``namespace`` (one of
   ``--namespaces``), ``pod``, ``container="llm-sidecar"``, ``endpoint="metrics"``,
   ``job="llm-sidecar"``, ``instance`` (a pod address) and ``llm_release`` (one release per
   ``--replicas`` pods).
3. **Scrape them** with a real Prometheus (``prometheus`` on the PATH, Debian's in CI) loading the
   tree's rule files, for ``--duration`` seconds at ``--scrape-interval``; beside it an empty
   Prometheus (the same rules, no targets) whose memory is the baseline. Then, where Debian's
   ``victoria-metrics`` is installed, the same pods into VictoriaMetrics + vmalert
   (:mod:`bench.fleet_vm`).
4. **Report**, per pod count: the series a pod exports (from the recorded page: total, share
   of ``_bucket``, share never moved from zero, buckets holding no observation of their own, the
   largest families, the series of model ``other``) and Prometheus's head series a pod;
   Prometheus's RSS a pod (its ``VmRSS`` minus the empty one's, over N); each rule group's
   evaluation time (``/api/v1/rules`` ``evaluationTime``, the last and the largest seen) and
   the samples one evaluation reads (every rule's expression as an instant query with
   ``stats=all``: ``totalQueryableSamples``); every dashboard query of ``--dashboards``
   (variables at All, the last ``--range`` seconds, expanded as Grafana would:
   :mod:`bench.fleet_dashboards`), its samples read, its time, the CPU time Prometheus spent
   on it (its ``/proc`` utime + stime across the query: on a busy machine the wall time
   waits for the CPU, the CPU time much less) and the series it returns, and each
   dashboard's total.

What the tree is (its package, rule files, dashboards) is an argument, so one checkout measures
another: ``--tree`` runs that tree's sidecar (the recording's processes start in it with
``PYTHONPATH`` set to it), and ``--rules`` and ``--dashboards`` default to its files. Figures
are measurements on a shared machine: the report records the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import orjson
import yaml

from bench.fleet_dashboards import Query, dashboard_queries
from bench.fleet_pods import parse_page
from bench.fleet_procs import Processes, cpu_seconds, free_port, loadavg, status_kb, wait_ready
from bench.fleet_record import record
from bench.fleet_vm import print_vm, run_vm

ROOT = Path(__file__).resolve().parent.parent
POLL_SECONDS = 5.0


# ------------------------------------------------------------------ the page


def page_census(text: str) -> dict:
    """What one pod's page holds: series, buckets, series never moved, families, model other."""
    _, samples = parse_page(text)
    total = len(samples)
    buckets = [s for s in samples if s.kind == "histogram" and s.name.endswith("_bucket")]
    never = [s for s in samples if s.counts and s.value == 0]
    # A bucket holds an observation of its own when its count exceeds the bucket below it.
    idle_buckets = 0
    previous: dict[str, float] = {}
    for s in buckets:
        series = re.sub(r'(^|[{,])le="[^"]*"', r"\1", s.key)
        below = previous.get(series, 0.0)
        if s.value <= below:
            idle_buckets += 1
        previous[series] = s.value
    families: dict[str, int] = {}
    for s in samples:
        families[s.family] = families.get(s.family, 0) + 1
    other = sum('model="other"' in s.key for s in samples)
    return {
        "series": total,
        "bucket_series": len(buckets),
        "bucket_share": round(len(buckets) / total, 3) if total else None,
        "never_moved": len(never),
        "never_moved_share": round(len(never) / total, 3) if total else None,
        "never_moved_buckets": sum(1 for s in never if s.name.endswith("_bucket")),
        "buckets_without_own_observation": idle_buckets,
        "model_other_series": other,
        "families": dict(sorted(families.items(), key=lambda kv: -kv[1])),
    }


# ------------------------------------------------------------------ Prometheus


class Prometheus:
    """A real Prometheus on a loopback port, with its own data directory."""

    def __init__(self, binary: str, procs: Processes, name: str, config: dict) -> None:
        self.name = name
        home = procs.workdir / name
        home.mkdir(parents=True, exist_ok=True)
        (home / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        for _ in range(5):  # it cannot bind port 0: another process may take the port first
            self.port = free_port()
            self.proc = procs.spawn(
                name,
                [binary, f"--config.file={home / 'prometheus.yml'}",
                 f"--storage.tsdb.path={home / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                 "--log.level=warn", "--query.max-samples=500000000", "--query.timeout=10m"],
            )  # fmt: skip
            try:
                wait_ready(f"{self.base}/-/ready", self.proc, f"prometheus {name}")
                return
            except RuntimeError:
                if self.proc.poll() is None:
                    raise
        raise RuntimeError(f"prometheus {name} did not start:\n{procs.log(name)}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, timeout: float = 900.0, **params: str) -> dict:
        data = urllib.parse.urlencode(params).encode() if params else None
        with urllib.request.urlopen(f"{self.base}{path}", data=data, timeout=timeout) as r:
            doc = orjson.loads(r.read())
        if doc.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {doc}")
        return doc["data"]

    def own_metric(self, name: str) -> float | None:
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rpartition(" ")[2])
        return None

    def rss_mb(self) -> float:
        return status_kb(self.proc.pid, "VmRSS") / 1024

    def peak_rss_mb(self) -> float:
        return status_kb(self.proc.pid, "VmHWM") / 1024


def pod_labels(i: int, namespaces: int, replicas: int, address: str) -> dict[str, str]:
    """What the chart's PodMonitor gives pod ``i`` through the operator's relabelings."""
    release = i // replicas
    namespace = f"team-{release % namespaces:02d}"
    fullname = f"llm-{release:03d}-llm-sidecar"
    return {
        "namespace": namespace,
        "pod": f"{fullname}-6d8f7c9b5-{i:05x}",
        "container": "llm-sidecar",
        "endpoint": "metrics",
        "job": "llm-sidecar",
        "instance": address,
        "llm_release": f"{namespace}/{fullname}",
    }


def fleet_targets(n: int, pods_port: int, args: argparse.Namespace) -> list[dict]:
    """The scrape targets of ``n`` fake pods, each with its pod's labels."""
    return [
        {
            "targets": [f"127.0.0.1:{pods_port}"],
            "labels": {
                "__metrics_path__": f"/pods/{i}/metrics",
                **pod_labels(
                    i, args.namespaces, args.replicas, f"10.42.{i // 250}.{i % 250 + 2}:9464"
                ),
            },
        }
        for i in range(n)
    ]


def prometheus_config(
    rules: list[Path], interval: float, eval_interval: float, targets: list[dict]
) -> dict:
    config: dict = {
        "global": {
            "scrape_interval": f"{interval:g}s",
            "scrape_timeout": f"{min(interval, 10.0):g}s",
            "evaluation_interval": f"{eval_interval:g}s",
        },
        "rule_files": [str(r) for r in rules],
    }
    if targets:
        config["scrape_configs"] = [{"job_name": "fleet", "static_configs": targets}]
    return config


# ------------------------------------------------------------------ measuring


def timed_query(prom: Prometheus, q: Query, end: float, range_s: float) -> dict:
    """One dashboard query as Grafana sends it, with Prometheus's own statistics."""
    cpu0, t0 = cpu_seconds(prom.proc.pid), time.perf_counter()
    if q.instant:
        data = prom.api("/api/v1/query", query=q.expr, time=f"{end:.3f}", stats="all")
    else:
        aligned = end - end % q.step
        data = prom.api(
            "/api/v1/query_range", query=q.expr, start=f"{aligned - range_s:.3f}",
            end=f"{aligned:.3f}", step=f"{q.step:g}", stats="all",
        )  # fmt: skip
    wall, cpu = time.perf_counter() - t0, cpu_seconds(prom.proc.pid) - cpu0
    stats = data.get("stats", {})
    return {
        "panel": q.panel,
        "ref": q.ref,
        "instant": q.instant,
        "samples": stats.get("samples", {}).get("totalQueryableSamples"),
        "peak_samples": stats.get("samples", {}).get("peakSamples"),
        "seconds": round(wall, 4),
        "cpu_seconds": round(cpu, 3),
        "eval_seconds": stats.get("timings", {}).get("evalTotalTime"),
        "series": len(data.get("result", [])),
        "expr": q.expr,
    }


def label_fetcher(prom: Prometheus, start: float, end: float):
    def fetch(selector: str, label: str) -> list[str]:
        params = {"start": f"{start:.0f}", "end": f"{end:.0f}"}
        if selector:
            params["match[]"] = selector
        return list(prom.api(f"/api/v1/label/{label}/values", **params))

    return fetch


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def recorded_names(rules: list[Path]) -> set[str]:
    """The series the rule files record."""
    names = set()
    for path in rules:
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            names |= {r["record"] for r in group.get("rules", []) if "record" in r}
    return names


def measure_dashboards(prom: Prometheus, paths: list[Path], args: argparse.Namespace) -> dict:
    end = time.time()
    recorded = recorded_names(args.rules)
    fetch = label_fetcher(prom, end - args.range, end)
    out = {}
    for path in paths:
        queries = dashboard_queries(path, args.range, args.scrape_interval, fetch)
        results = [timed_query(prom, q, end, args.range) for q in queries]
        out[path.name] = {
            "queries": len(results),
            "samples": sum(r["samples"] or 0 for r in results),
            "seconds": round(sum(r["seconds"] for r in results), 3),
            "cpu_seconds": round(sum(r["cpu_seconds"] for r in results), 2),
            "max_series": max((r["series"] for r in results), default=0),
            "bucket_queries": sum("_bucket" in r["expr"] for r in results),
            "bucket_samples": sum(r["samples"] or 0 for r in results if "_bucket" in r["expr"]),
            "recorded_queries": sum(
                bool(recorded & set(_NAME.findall(r["expr"]))) for r in results
            ),
            "results": results,
        }
    return out


def measure_rule_reads(prom: Prometheus) -> dict:
    """Samples one evaluation of each group reads: every rule's expression as an instant query."""
    now = time.time()
    out = {}
    for group in prom.api("/api/v1/rules")["groups"]:
        rules = []
        cpu0 = cpu_seconds(prom.proc.pid)
        for rule in group["rules"]:
            t0 = time.perf_counter()
            data = prom.api("/api/v1/query", query=rule["query"], time=f"{now:.3f}", stats="all")
            rules.append({
                "name": rule.get("name"),
                "samples": data.get("stats", {}).get("samples", {}).get("totalQueryableSamples"),
                "seconds": round(time.perf_counter() - t0, 4),
            })  # fmt: skip
        top = max(rules, key=lambda r: r["samples"] or 0, default=None)
        out[group["name"]] = {
            "samples": sum(r["samples"] or 0 for r in rules),
            "queried_seconds": round(sum(r["seconds"] for r in rules), 3),
            "queried_cpu_seconds": round(cpu_seconds(prom.proc.pid) - cpu0, 2),
            "top_rule": top,
            "rules": rules,
        }
    return out


def run_fleet(
    n: int, pages: Path, args: argparse.Namespace, procs: Processes, census: dict
) -> dict:
    print(f"  {n} pods: serving, scraping for {args.duration:g} s ...", file=sys.stderr, flush=True)
    pods_port = free_port()
    pods = procs.spawn(
        f"pods-{n}",
        [sys.executable, "-m", "bench.fleet_pods", "--pages", str(pages), "--pods", str(n),
         "--port", str(pods_port), "--seed", str(args.seed)],
    )  # fmt: skip
    wait_ready(f"http://127.0.0.1:{pods_port}/ready", pods, "the fake pods")
    targets = fleet_targets(n, pods_port, args)
    empty = Prometheus(args.prometheus, procs, f"prometheus-empty-{n}",
                       prometheus_config(args.rules, args.scrape_interval, args.eval_interval, []))  # fmt: skip
    prom = Prometheus(args.prometheus, procs, f"prometheus-{n}",
                      prometheus_config(args.rules, args.scrape_interval, args.eval_interval, targets))  # fmt: skip
    load_before = loadavg()
    cpu0 = cpu_seconds(prom.proc.pid)
    started = time.time()
    groups: dict[str, dict] = {}
    rss_peak = 0.0
    try:
        while time.time() - started < args.duration:
            time.sleep(min(POLL_SECONDS, max(0.0, args.duration - (time.time() - started))))
            if prom.proc.poll() is not None or pods.poll() is not None:
                raise RuntimeError(
                    f"a process exited during the run:\n{procs.log(prom.name)}\n{procs.log(f'pods-{n}')}"
                )
            for group in prom.api("/api/v1/rules")["groups"]:
                if group.get("lastEvaluation", "").startswith("0001"):
                    continue  # not evaluated yet
                g = groups.setdefault(
                    group["name"], {"last": 0.0, "max": 0.0, "seen": 0, "evaluations": {}}
                )
                g["last"] = group["evaluationTime"]
                g["max"] = max(g["max"], group["evaluationTime"])
                g["seen"] += 1
                # Each evaluation once (a poll can see the same one twice), by its start.
                if time.time() - started >= args.duration / 2:
                    g["evaluations"][group["lastEvaluation"]] = group["evaluationTime"]
            rss_peak = max(rss_peak, prom.rss_mb())
        cpu = cpu_seconds(prom.proc.pid) - cpu0
        elapsed = time.time() - started
        rss, rss_empty = prom.rss_mb(), empty.rss_mb()
        head = prom.own_metric("prometheus_tsdb_head_series") or 0
        head_empty = empty.own_metric("prometheus_tsdb_head_series") or 0
        up = prom.api("/api/v1/query", query='count(up{job="llm-sidecar"} == 1)')["result"]
        scrape = prom.api("/api/v1/query", query='avg(scrape_duration_seconds{job="llm-sidecar"})')
        procs.stop(empty.proc)
        print(f"  {n} pods: dashboard queries ...", file=sys.stderr, flush=True)
        dashboards = measure_dashboards(prom, args.dashboard_files, args)
        print(f"  {n} pods: rule expressions ...", file=sys.stderr, flush=True)
        reads = measure_rule_reads(prom)
    finally:
        procs.stop(prom.proc)
        procs.stop(pods)
        if empty.proc.poll() is None:
            procs.stop(empty.proc)
    for name, g in groups.items():
        g.update(reads.get(name, {}))
        # The median of the evaluations in the run's second half: one evaluation's time on a
        # shared machine is noise of the order of the figures; the median is steadier.
        times = sorted(g.pop("evaluations").values())
        g["median"] = times[len(times) // 2] if times else g["last"]
        g["evaluations_measured"] = len(times)
    return {
        "pods": n,
        "targets_up": int(float(up[0]["value"][1])) if up else 0,
        "scrape_seconds_avg": float(scrape["result"][0]["value"][1]) if scrape["result"] else None,
        "scraped_seconds": round(elapsed, 1),
        "head_series": head,
        "head_series_per_pod": round((head - head_empty) / n, 1),
        "page_series_per_pod": census["series"],
        "rss_mb": round(rss, 1),
        "rss_empty_mb": round(rss_empty, 1),
        "rss_peak_mb": round(max(rss_peak, prom.peak_rss_mb()), 1),
        "rss_mb_per_pod": round((rss - rss_empty) / n, 3),
        "prometheus_cpu_pct_core": round(100 * cpu / elapsed, 1) if elapsed else None,
        "rule_groups": groups,
        "rule_groups_seconds_last": round(sum(g["last"] for g in groups.values()), 4),
        "rule_groups_seconds_median": round(sum(g["median"] for g in groups.values()), 4),
        "rule_groups_seconds_max": round(sum(g["max"] for g in groups.values()), 4),
        "rule_groups_samples": sum(g.get("samples", 0) for g in groups.values()),
        "dashboards": dashboards,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


# ------------------------------------------------------------------ report


def _n(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_census(c: dict, requests: dict) -> None:
    print(f"\none pod's page after the recording (requests: {requests})")
    print(f"  series {c['series']:,}, _bucket {c['bucket_series']:,} ({c['bucket_share']:.0%}), "
          f"never moved from zero {c['never_moved']:,} ({c['never_moved_share']:.0%}; "
          f"{c['never_moved_buckets']:,} buckets), buckets without an observation of their own "
          f"{c['buckets_without_own_observation']:,}, model=\"other\" {c['model_other_series']:,}")  # fmt: skip
    top = list(c["families"].items())[:8]
    print("  largest families: " + ", ".join(f"{k} {v}" for k, v in top))


def print_fleet(r: dict) -> None:
    n = r["pods"]
    print(f"\n{n} pods ({r['targets_up']} up, scraped {r['scraped_seconds']:g} s, "
          f"load average {r['loadavg_before'][0]:.2f} -> {r['loadavg_after'][0]:.2f})")  # fmt: skip
    print(f"  head series {r['head_series']:,.0f} ({r['head_series_per_pod']:,.0f} a pod; the page "
          f"{r['page_series_per_pod']:,})")  # fmt: skip
    print(f"  Prometheus RSS {r['rss_mb']:,.0f} MB (empty {r['rss_empty_mb']:,.0f} MB, peak "
          f"{r['rss_peak_mb']:,.0f} MB): {r['rss_mb_per_pod']:.2f} MB a pod; CPU "
          f"{r['prometheus_cpu_pct_core']}% of a core")  # fmt: skip
    print(
        f"  {'rule group':<34} {'eval median s':>13} {'eval last s':>11} {'eval max s':>10} "
        f"{'samples read':>13}  top rule"
    )
    for name, g in r["rule_groups"].items():
        top = g.get("top_rule") or {}
        print(f"  {name:<34} {g['median']:>13.4f} {g['last']:>11.4f} {g['max']:>10.4f} "
              f"{_n(g.get('samples')):>13}  {top.get('name', '')} ({_n(top.get('samples'))})")  # fmt: skip
    print(f"  {'all groups':<34} {r['rule_groups_seconds_median']:>13.4f} "
          f"{r['rule_groups_seconds_last']:>11.4f} {r['rule_groups_seconds_max']:>10.4f} "
          f"{_n(r['rule_groups_samples']):>13}")  # fmt: skip
    print(f"  {'dashboard':<34} {'queries':>7} {'seconds':>8} {'CPU s':>6} {'samples':>13} "
          f"{'bucket q':>8} {'bucket samples':>14} {'recorded q':>10} {'max series':>10}")  # fmt: skip
    for name, d in r["dashboards"].items():
        print(f"  {name:<34} {d['queries']:>7} {d['seconds']:>8.2f} {d['cpu_seconds']:>6.2f} "
              f"{d['samples']:>13,} {d['bucket_queries']:>8} {d['bucket_samples']:>14,} "
              f"{d['recorded_queries']:>10} {d['max_series']:>10}")  # fmt: skip
        slow = sorted(d["results"], key=lambda q: -q["seconds"])[:3]
        for q in slow:
            print(
                f"      {q['seconds']:6.2f} s {_n(q['samples']):>12} samples  {q['panel']} [{q['ref']}]"
            )


# ------------------------------------------------------------------ entry


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--pods", default="50,200", help="pod counts, a comma list (default 50,200)")
    p.add_argument("--tree", type=Path, default=ROOT,
                   help="the checkout whose sidecar package is recorded (default: this one)")  # fmt: skip
    p.add_argument("--rules", type=Path, action="append", default=None,
                   help="a rule file Prometheus loads (repeatable; default: the tree's deploy/prometheus/*.yaml)")  # fmt: skip
    p.add_argument("--dashboards", type=Path, default=None,
                   help="the directory of dashboard JSON files (default: the tree's dashboards/)")  # fmt: skip
    p.add_argument("--record-seconds", type=float, default=60.0, help="seconds of load recorded")
    p.add_argument("--rate", type=float, default=6.0, help="requests a second of the mix")
    p.add_argument("--page-every", type=float, default=5.0, help="seconds between recorded pages")
    p.add_argument("--pages", type=Path, default=None,
                   help="replay this recording (a --save-pages file) instead of recording")  # fmt: skip
    p.add_argument("--save-pages", type=Path, default=None, help="keep the recording here")
    p.add_argument("--duration", type=float, default=360.0,
                   help="seconds Prometheus scrapes each fleet before the queries (default 360: "
                        "a full 5-minute dashboard range and its rate window)")  # fmt: skip
    p.add_argument("--scrape-interval", type=float, default=15.0,
                   help="seconds; also Grafana's data source scrape interval (default 15)")  # fmt: skip
    p.add_argument("--eval-interval", type=float, default=15.0, help="rule evaluation seconds")
    p.add_argument("--range", type=float, default=300.0, help="dashboard time range, seconds")
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--replicas", type=int, default=5, help="pods a release")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prometheus", default=None, help="the prometheus binary (default: on PATH)")
    p.add_argument("--engines", default=None,
                   help="prometheus and/or victoria-metrics, a comma list (default: prometheus, and "
                        "victoria-metrics when victoria-metrics and vmalert are installed)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="tiny: 3 pods, 6 s recorded, 1 s scrapes for 12 s (the smoke test)")  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="also write the full report here")
    p.add_argument("--keep-logs", type=Path, default=None, help="work directory to keep")
    args = p.parse_args(argv)
    if args.quick:
        args.pods, args.record_seconds, args.page_every = "3", 6.0, 2.0
        args.duration, args.scrape_interval, args.eval_interval = 12.0, 1.0, 1.0
    args.pod_counts = [int(x) for x in str(args.pods).split(",") if x.strip()]
    args.tree = args.tree.resolve()
    if args.rules is None:
        args.rules = sorted((args.tree / "deploy" / "prometheus").glob("*.yaml"))
    args.rules = [r.resolve() for r in args.rules]
    args.dashboards = (args.dashboards or args.tree / "dashboards").resolve()
    args.dashboard_files = sorted(args.dashboards.glob("*.json"))
    args.prometheus = args.prometheus or shutil.which("prometheus")
    args.victoria_metrics = shutil.which("victoria-metrics")
    args.vmalert = shutil.which("vmalert")
    vm_installed = bool(args.victoria_metrics and args.vmalert)
    if args.engines is None:
        args.engines = "prometheus" + (",victoria-metrics" if vm_installed else "")
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    if set(args.engine_list) - {"prometheus", "victoria-metrics"}:
        p.error(f"unknown engine in --engines {args.engines}")
    if "victoria-metrics" in args.engine_list and not vm_installed:
        p.error(
            "victoria-metrics and vmalert are not installed (Debian's victoria-metrics package)"
        )
    return args


def _interrupted(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prometheus is None and "prometheus" in args.engine_list:
        print(
            "prometheus is not installed (scripts/system-deps.sh installs Debian's)",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _interrupted)
    workdir = args.keep_logs or Path(tempfile.mkdtemp(prefix="llm-sidecar-fleet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Processes(workdir)
    versions = {}
    for engine, binary in (
        ("prometheus", args.prometheus),
        ("victoria-metrics", args.victoria_metrics),
    ):
        if engine in args.engine_list and binary:
            flag = "--version" if engine == "prometheus" else "-version"
            done = subprocess.run([binary, flag], capture_output=True, text=True, check=False)
            versions[engine] = ((done.stdout or done.stderr).splitlines() or [""])[0]
    report: dict = {
        "config": {
            "tree": str(args.tree), "rules": [str(r) for r in args.rules],
            "dashboards": [str(d) for d in args.dashboard_files], "pods": args.pod_counts,
            "record_seconds": args.record_seconds, "rate": args.rate, "duration_s": args.duration,
            "scrape_interval_s": args.scrape_interval, "eval_interval_s": args.eval_interval,
            "range_s": args.range, "namespaces": args.namespaces, "replicas": args.replicas,
            "seed": args.seed, "quick": args.quick, "engines": args.engine_list,
        },
        "machine": {"cpus": os.cpu_count(), "loadavg": loadavg(), **versions},
        "fleets": [],
        "victoria_metrics": [],
    }  # fmt: skip
    try:
        if args.pages:
            recording = orjson.loads(args.pages.read_bytes())
            pages = args.pages.resolve()
        else:
            print(f"recording {args.record_seconds:g} s of the mix through {args.tree} ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            recording = record(args.tree, workdir, args.record_seconds, args.rate,
                               args.page_every, args.seed)  # fmt: skip
            pages = args.save_pages or workdir / "pages.json"
            pages.write_bytes(orjson.dumps(recording))
        census = page_census(recording["pages"][-1]["text"])
        report["recording"] = {"requests": recording["requests"], "config": recording["config"],
                               "pages": len(recording["pages"])}  # fmt: skip
        report["page"] = census
        print_census(census, recording["requests"])
        for n in args.pod_counts:
            if "prometheus" in args.engine_list:
                result = run_fleet(n, pages, args, procs, census)
                report["fleets"].append(result)
                print_fleet(result)
            if "victoria-metrics" in args.engine_list:
                vm = run_vm(n, pages, args, procs, lambda port, n=n: fleet_targets(n, port, args))
                report["victoria_metrics"].append(vm)
                print_vm(vm)
    finally:
        procs.stop_all()
        if not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
