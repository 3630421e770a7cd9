"""The same fleet in VictoriaMetrics single-node + vmalert (Debian's ``victoria-metrics``).

VictoriaMetrics scrapes the fake pods with the scrape configuration Prometheus gets
(``-promscrape.config``: the same targets and labels), vmalert evaluates the same rule files
against it and writes what it records back into it (``-remoteWrite.url``), as a fleet running
that engine would; an empty VictoriaMetrics (no targets) beside it gives the memory baseline.
Both run with their defaults otherwise, ``-search.latencyOffset`` included (30 s: the newest
30 s of data are not queried, so each level of chained recording rules lags by as much).

Reported: VictoriaMetrics's RSS a pod, the series it holds (``vm_new_timeseries_created_total``:
every series it created, the recorded ones included, minus the empty one's), each group's evaluation time (the sum
of its rules' ``evaluationTime`` in vmalert's ``/api/v1/rules``: a group evaluates its rules
one after the other), and every dashboard query's time and series, with the samples it read
where the query trace (``trace=1``) counts them.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import orjson
import yaml

from bench.fleet_dashboards import Query, dashboard_queries
from bench.fleet_procs import Processes, free_port, loadavg, status_kb, wait_ready

_SAMPLES = re.compile(r"(?:samples=|with )(\d+) samples|samples=(\d+)")


class Engine:
    """One HTTP server process of the VictoriaMetrics package, on a loopback port."""

    def __init__(self, procs: Processes, name: str, argv: list[str], ready: str) -> None:
        for _ in range(5):  # cannot bind port 0: another process may take the port first
            self.port = free_port()
            self.proc = procs.spawn(name, [a.replace("{PORT}", str(self.port)) for a in argv])
            try:
                wait_ready(f"{self.base}{ready}", self.proc, name)
                return
            except RuntimeError:
                if self.proc.poll() is None:
                    raise
        raise RuntimeError(f"{name} did not start:\n{procs.log(name)}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 900.0, **params: str) -> dict:
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return orjson.loads(r.read())

    def own_metric(self, line_start: str) -> float | None:
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(line_start):
                    return float(line.rpartition(" ")[2])
        return None


def _trace_samples(node: dict | None) -> int | None:
    """Samples a query read, as far as its trace says (None when no message counts them)."""
    if not node:
        return None
    found = []

    def walk(n: dict) -> None:
        for m in _SAMPLES.finditer(n.get("message", "")):
            if "fetch" in n.get("message", "") or "unpack" in n.get("message", ""):
                found.append(int(m.group(1) or m.group(2)))
        for child in n.get("children", []) or []:
            walk(child)

    walk(node)
    return sum(found) if found else None


def timed_query(vm: Engine, q: Query, end: float, range_s: float) -> dict:
    t0 = time.perf_counter()
    if q.instant:
        doc = vm.get("/api/v1/query", query=q.expr, time=f"{end:.3f}", trace="1")
    else:
        aligned = end - end % q.step
        doc = vm.get(
            "/api/v1/query_range", query=q.expr, start=f"{aligned - range_s:.3f}",
            end=f"{aligned:.3f}", step=f"{q.step:g}", trace="1",
        )  # fmt: skip
    wall = time.perf_counter() - t0
    return {
        "panel": q.panel,
        "ref": q.ref,
        "instant": q.instant,
        "samples": _trace_samples(doc.get("trace")),
        "seconds": round(wall, 4),
        "series": len(doc.get("data", {}).get("result", [])),
        "error": doc.get("error"),
        "expr": q.expr,
    }


def run_vm(n: int, pages: Path, args: argparse.Namespace, procs: Processes, targets_for) -> dict:
    """``n`` pods in VictoriaMetrics + vmalert for ``args.duration`` seconds, then the queries."""
    print(f"  {n} pods: VictoriaMetrics + vmalert, {args.duration:g} s ...", file=sys.stderr)
    home = procs.workdir / f"vm-{n}"
    home.mkdir(parents=True, exist_ok=True)
    pods_port = free_port()
    pods = procs.spawn(
        f"vm-pods-{n}",
        [sys.executable, "-m", "bench.fleet_pods", "--pages", str(pages), "--pods", str(n),
         "--port", str(pods_port), "--seed", str(args.seed)],
    )  # fmt: skip
    wait_ready(f"http://127.0.0.1:{pods_port}/ready", pods, "the fake pods")
    scrape = {
        "global": {"scrape_interval": f"{args.scrape_interval:g}s",
                   "scrape_timeout": f"{min(args.scrape_interval, 10.0):g}s"},
        "scrape_configs": [{"job_name": "fleet", "static_configs": targets_for(pods_port)}],
    }  # fmt: skip
    (home / "scrape.yml").write_text(yaml.safe_dump(scrape, sort_keys=False))
    common = ["-httpListenAddr=127.0.0.1:{PORT}", "-loggerLevel=WARN"]
    empty = Engine(procs, f"vm-empty-{n}",
                   [args.victoria_metrics, f"-storageDataPath={home / 'empty'}", *common], "/health")  # fmt: skip
    vm = Engine(procs, f"vm-{n}",
                [args.victoria_metrics, f"-storageDataPath={home / 'data'}",
                 f"-promscrape.config={home / 'scrape.yml'}", *common], "/health")  # fmt: skip
    alert = Engine(procs, f"vmalert-{n}",
                   [args.vmalert, *(f"-rule={r}" for r in args.rules), f"-datasource.url={vm.base}",
                    f"-remoteWrite.url={vm.base}", f"-evaluationInterval={args.eval_interval:g}s",
                    f"-notifier.url=http://127.0.0.1:{pods_port}", *common], "/health")  # fmt: skip
    started = time.time()
    groups: dict[str, dict] = {}
    load_before = loadavg()
    try:
        while time.time() - started < args.duration:
            time.sleep(min(5.0, max(0.0, args.duration - (time.time() - started))))
            for p in (vm.proc, alert.proc, pods):
                if p.poll() is not None:
                    raise RuntimeError(f"a process exited:\n{procs.log(f'vm-{n}')}")
            for group in alert.get("/api/v1/rules")["data"]["groups"]:
                evaluated = [
                    r for r in group["rules"] if not r["lastEvaluation"].startswith("0001")
                ]
                if not evaluated:
                    continue
                seconds = sum(r.get("evaluationTime", 0.0) for r in group["rules"])
                g = groups.setdefault(
                    group["name"], {"last": 0.0, "max": 0.0, "seen": 0, "errors": 0}
                )
                g["last"], g["max"] = seconds, max(g["max"], seconds)
                g["errors"] = sum(bool(r.get("lastError")) for r in group["rules"])
                failed = [r["lastError"] for r in group["rules"] if r.get("lastError")]
                if failed:
                    g["last_error"] = failed[0][:500]
                slowest = max(group["rules"], key=lambda r: r.get("evaluationTime", 0.0))
                g["slowest_rule"] = {
                    "name": slowest["name"],
                    "seconds": slowest.get("evaluationTime"),
                }
                g["seen"] += 1
        rss = status_kb(vm.proc.pid, "VmRSS") / 1024
        rss_empty = status_kb(empty.proc.pid, "VmRSS") / 1024
        rss_alert = status_kb(alert.proc.pid, "VmRSS") / 1024
        created = vm.own_metric("vm_new_timeseries_created_total") or 0
        created_empty = empty.own_metric("vm_new_timeseries_created_total") or 0
        procs.stop(empty.proc)
        end = time.time()

        def fetch(selector: str, label: str) -> list[str]:
            params = {"start": f"{end - args.range:.0f}", "end": f"{end:.0f}"}
            if selector:
                params["match[]"] = selector
            return list(vm.get(f"/api/v1/label/{label}/values", **params)["data"])

        dashboards = {}
        for path in args.dashboard_files:
            queries = dashboard_queries(path, args.range, args.scrape_interval, fetch)
            results = [timed_query(vm, q, end, args.range) for q in queries]
            counted = [r["samples"] for r in results if r["samples"] is not None]
            dashboards[path.name] = {
                "queries": len(results),
                "seconds": round(sum(r["seconds"] for r in results), 3),
                "samples": sum(counted) if counted else None,
                "max_series": max((r["series"] for r in results), default=0),
                "errors": sum(bool(r["error"]) for r in results),
                "results": results,
            }
    finally:
        for p in (alert.proc, vm.proc, empty.proc, pods):
            if p.poll() is None:
                procs.stop(p)
    return {
        "pods": n,
        "series_created": created,
        "series_created_per_pod": round((created - created_empty) / n, 1),
        "rss_mb": round(rss, 1),
        "rss_empty_mb": round(rss_empty, 1),
        "rss_mb_per_pod": round((rss - rss_empty) / n, 3),
        "vmalert_rss_mb": round(rss_alert, 1),
        "rule_groups": groups,
        "rule_groups_seconds_last": round(sum(g["last"] for g in groups.values()), 4),
        "rule_groups_seconds_max": round(sum(g["max"] for g in groups.values()), 4),
        "dashboards": dashboards,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def print_vm(r: dict) -> None:
    print(f"\n{r['pods']} pods in VictoriaMetrics + vmalert (load average "
          f"{r['loadavg_before'][0]:.2f} -> {r['loadavg_after'][0]:.2f})")  # fmt: skip
    print(f"  series {r['series_created']:,.0f} ({r['series_created_per_pod']:,.0f} a pod); "
          f"RSS {r['rss_mb']:,.0f} MB (empty {r['rss_empty_mb']:,.0f} MB): "
          f"{r['rss_mb_per_pod']:.2f} MB a pod; vmalert {r['vmalert_rss_mb']:,.0f} MB")  # fmt: skip
    print(f"  {'rule group':<34} {'eval last s':>11} {'eval max s':>10} {'rule errors':>11}")
    for name, g in r["rule_groups"].items():
        print(f"  {name:<34} {g['last']:>11.4f} {g['max']:>10.4f} {g['errors']:>11}")
    print(f"  {'all groups':<34} {r['rule_groups_seconds_last']:>11.4f} "
          f"{r['rule_groups_seconds_max']:>10.4f}")  # fmt: skip
    print(
        f"  {'dashboard':<34} {'queries':>7} {'seconds':>8} {'samples':>13} {'max series':>10} {'errors':>6}"
    )
    for name, d in r["dashboards"].items():
        samples = "-" if d["samples"] is None else f"{d['samples']:,}"
        print(f"  {name:<34} {d['queries']:>7} {d['seconds']:>8.2f} {samples:>13} "
              f"{d['max_series']:>10} {d['errors']:>6}")  # fmt: skip
