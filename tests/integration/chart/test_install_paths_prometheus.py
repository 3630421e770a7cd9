"""Every documented Kubernetes install path, as a user installs it, in a real Prometheus.

The paths (docs/kubernetes.md "Install paths"), all at once in one Prometheus, as a fleet:

- the full chart, twice under one name: release ``chat`` in team-a and in team-b (two
  releases of the same name in two namespaces);
- monitoring-only beside a server in the release's namespace: ``watch`` in inference,
  ``existingServer.podSelector.app=vllm-a``;
- monitoring-only beside a server in another namespace: ``watch`` in monitoring,
  ``podSelector.app=vllm-b``, ``existingServer.namespaces={inference}``;
- the plain manifests, deploy/kubernetes/ as committed, applied with ``kubectl apply -n prod``
  (not the docs' example namespace, llm); in the enforcing Prometheus only, once more in
  staging (the plain rules select their name in any namespace, so two plain installs judge
  apart only where each PrometheusRule sees its own namespace);
- ``prometheus.monitor.kind=ServiceMonitor``: the full chart (``chat`` in team-c) and
  monitoring-only (``watch`` in serving, its metrics Service), scraped through the endpoints
  role as the operator's ``generateServiceMonitorConfig`` writes it.

Each pod is a real ``llm-sidecar serve`` process in front of one ``llm-sidecar simulate``;
each rendered PodMonitor (or ServiceMonitor) becomes the scrape jobs the Prometheus Operator would write for it
(tests/support/prometheus_operator.py, followed from prometheus-operator v0.93.0, commit
f8fafd475f3d132e239432ae6172de60a6cb6516, pkg/prometheus/promcfg.go), over every pod of the
namespaces it watches, so the operator's own relabelings pick the pods; each rendered
PrometheusRule is loaded as its rules file. Two Debian Prometheus processes scrape the same
sidecars: one as a Prometheus without ``enforcedNamespaceLabel``, one with
``enforcedNamespaceLabel: namespace`` (series and rules changed as the operator changes them).

Windows: scrape and evaluation every second. A Prometheus started seconds ago holds seconds of
data, so every window from 5m to 30d reads the same few seconds; with steady traffic each
window's ratio is the one it would have after a whole window of that traffic, which is what
the burn-rate arms compare. The requests carry two tokens (one inter-token gap each) and stay
under 100 per sidecar, so the capacity records (100 gaps per concurrency band) stay empty:
capacity is not what this judges.

Then, in both Prometheus at once:

1. healthy traffic through every sidecar: each path's targets are its own pods with its own
   ``llm_release``, every SLO recording series of every release is there (with the pods'
   namespace, or the monitor's where enforced), no critical or warning alert is firing or
   pending, every rule evaluates without error, and no series carries ``deployment``;
2. a TTFT regression in team-b's ``chat``: its own page (critical LLMTTFTBurnRate) fires and
   every critical or warning alert is its own (team-a's ``chat``, same name, stays quiet);
3. the cross-namespace monitoring-only sidecar stopped: LLMSidecarDown for it alone.

With rules pinned to namespace="<release namespace>" and the PodMonitor's
``deployment`` label), step 1 fails: the cross-namespace monitoring-only release and the plain
manifests in prod record no SLO series, and LLMSidecarDown (absent) and LLMNoTrafficData are
pending for both; the series carry ``deployment``.
Skipped without helm or prometheus locally; fails under CI=true.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from sidecar.tools.slo.helm import LABEL_RELEASE
from tests.support import prometheus_operator as operator
from tests.support.chart import CHART, render_release, sync
from tests.support.processes import start_prometheus
from tests.support.serve import ServeProcess, start_simulator
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

DEPLOY = sync.DEPLOY_DIR
HEALTHY = {"x-sim-ttft": "0.01", "x-sim-tpot": "0.002", "x-sim-tokens": "2"}
SLOW = {
    "x-sim-ttft": "2.2",
    "x-sim-tpot": "0.002",
    "x-sim-tokens": "2",
}  # over the 2 s TTFT objective
ACTIVE = ("critical", "warning")


@dataclass
class InstallPath:
    key: str
    namespace: str
    """Where its objects are applied (helm -n, kubectl -n)."""
    fullname: str
    objects: list[dict]
    pods: list[tuple[str, dict[str, str], list[dict], list[dict]]]
    """(namespace, labels, containers, init containers) of each pod it serves."""
    enforced_only: bool = False
    """Only where Prometheus enforces namespaces (a second plain install of the same name)."""

    @property
    def release(self) -> str:
        return f"{self.namespace}/{self.fullname}"

    def of_kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    @property
    def pool(self) -> str:
        """The scrape job of its sidecar endpoint."""
        (monitor,) = self.of_kind("PodMonitor") + self.of_kind("ServiceMonitor")
        kind = "podMonitor" if monitor["kind"] == "PodMonitor" else "serviceMonitor"
        return f"{kind}/{self.namespace}/{monitor['metadata']['name']}/0"

    def services(self) -> list[operator.Service]:
        return [
            operator.Service(o["metadata"]["name"], self.namespace, o["metadata"].get("labels", {}), o["spec"]["selector"],
                             tuple((p["name"], int(p["targetPort"])) for p in o["spec"]["ports"]))
            for o in self.of_kind("Service")
        ]  # fmt: skip


def _in_namespace(objects: list[dict], namespace: str) -> list[dict]:
    """``objects`` as ``kubectl apply -n namespace`` (or helm -n) creates them."""
    out = []
    for obj in objects:
        obj = copy.deepcopy(obj)
        assert obj["metadata"].get("namespace", namespace) == namespace, "kubectl would refuse -n"
        obj["metadata"]["namespace"] = namespace
        out.append(obj)
    return out


def _template(objects: list[dict]) -> tuple[dict[str, str], list[dict], list[dict]]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    return (
        pod["metadata"]["labels"],
        pod["spec"]["containers"],
        pod["spec"].get("initContainers", []),
    )


def _helm(release: str, namespace: str, *sets: str, chart: Path = CHART) -> list[dict]:
    return _in_namespace(render_release(release, namespace, sets, chart), namespace)


def install_paths(chart: Path = CHART, deploy: Path = DEPLOY) -> list[InstallPath]:
    snippet = yaml.safe_load(
        (deploy / "snippets" / "sidecar-container.yaml").read_text(encoding="utf-8")
    )
    server = {"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}
    theirs = [
        server,
        *snippet,
    ]  # a team's own vLLM pod with the printed sidecar container pasted in
    paths = []
    for ns in ("team-a", "team-b"):
        objs = _helm("chat", ns, chart=chart)
        paths.append(
            InstallPath(f"full-{ns}", ns, "chat-llm-sidecar", objs, [(ns, *_template(objs))])
        )
    same = _helm(
        "watch",
        "inference",
        "mode=monitoring-only",
        "existingServer.podSelector.app=vllm-a",
        chart=chart,
    )
    paths.append(InstallPath("monitoring-only-same-ns", "inference", "watch-llm-sidecar", same,
                             [("inference", {"app": "vllm-a"}, theirs, [])]))  # fmt: skip
    other = _helm("watch", "monitoring", "mode=monitoring-only", "existingServer.podSelector.app=vllm-b",
                  "existingServer.namespaces={inference}", chart=chart)  # fmt: skip
    paths.append(InstallPath("monitoring-only-other-ns", "monitoring", "watch-llm-sidecar", other,
                             [("inference", {"app": "vllm-b"}, theirs, [])]))  # fmt: skip
    plain = [
        o
        for f in ("llm-sidecar.yaml", "monitoring.yaml")
        for o in yaml.safe_load_all((deploy / f).read_text(encoding="utf-8"))
        if o
    ]
    plain = _in_namespace(plain, "prod")
    paths.append(
        InstallPath(
            "plain-manifests-prod", "prod", "llm-sidecar", plain, [("prod", *_template(plain))]
        )
    )
    # prometheus.monitor.kind=ServiceMonitor: the full chart, and monitoring-only (its metrics Service).
    sm = "prometheus.monitor.kind=ServiceMonitor"
    full = _helm("chat", "team-c", sm, chart=chart)
    paths.append(
        InstallPath(
            "servicemonitor-full",
            "team-c",
            "chat-llm-sidecar",
            full,
            [("team-c", *_template(full))],
        )
    )
    only = _helm(
        "watch",
        "serving",
        "mode=monitoring-only",
        "existingServer.podSelector.app=vllm-c",
        sm,
        chart=chart,
    )
    paths.append(InstallPath("servicemonitor-monitoring-only", "serving", "watch-llm-sidecar", only,
                             [("serving", {"app": "vllm-c"}, theirs, [])]))  # fmt: skip
    # The plain rules select their name in any namespace: a second plain install judges apart
    # from the first only where each PrometheusRule sees its own namespace (docs/kubernetes.md).
    staging = _in_namespace(
        [
            {**o, "metadata": {k: v for k, v in o["metadata"].items() if k != "namespace"}}
            for o in plain
        ],
        "staging",
    )
    paths.append(
        InstallPath(
            "plain-manifests-staging",
            "staging",
            "llm-sidecar",
            staging,
            [("staging", *_template(staging))],
            True,
        )
    )
    return paths


def _containers(
    specs: list[dict], init: bool, sidecar: ServeProcess, upstream: str
) -> list[operator.Container]:
    out = []
    for c in specs:
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if p.get("name")}
        if c["name"] == "llm-sidecar":
            where = {
                "http": f"127.0.0.1:{sidecar.port}",
                "metrics": f"127.0.0.1:{sidecar.admin_port}",
            }
        else:
            where = dict.fromkeys(ports, upstream)
        out.append(operator.Container(c["name"], {n: where[n] for n in ports}, ports, init))
    return out


async def _api(session: aiohttp.ClientSession, base: str, path: str, **params) -> dict | list:
    async with session.get(f"{base}/api/v1/{path}", params=params) as r:
        doc = await r.json()
        assert r.status == 200 and doc["status"] == "success", f"{path} {params}: {r.status} {doc}"
        return doc["data"]


async def _stream(session: aiohttp.ClientSession, url: str, model: str, headers: dict) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()


@dataclass
class Prom:
    name: str
    enforced: bool
    proc: subprocess.Popen
    base: str
    paths: list[InstallPath]

    def namespace(self, path: InstallPath, pod_namespace: str) -> str:
        """The ``namespace`` a series of ``path`` carries: the pod's, or with
        enforcedNamespaceLabel the PodMonitor's (the release's)."""
        return path.namespace if self.enforced else pod_namespace

    async def active(self, session: aiohttp.ClientSession) -> list[dict]:
        """Labels of every critical or warning alert, pending or firing."""
        alerts = (await _api(session, self.base, "alerts"))["alerts"]
        return [
            a["labels"] | {"state": a["state"]}
            for a in alerts
            if a["labels"].get("severity") in ACTIVE
        ]

    async def query(self, session: aiohttp.ClientSession, expr: str) -> list[dict]:
        return (await _api(session, self.base, "query", query=expr))["result"]


def _slo_records(path: InstallPath) -> set[tuple[str, str]]:
    """(record, slo) of every SLO recording rule of the path's PrometheusRule, with the
    requests group's goodput and requests records (which any answered traffic writes)."""
    (rule,) = path.of_kind("PrometheusRule")
    return {
        (r["record"], r.get("labels", {}).get("slo", ""))
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "record" in r
        and (
            g["name"].startswith("llm-sidecar-slo-")
            or r["record"].startswith(("llm:goodput:", "llm:requests_by_error_type:"))
        )
    }


async def _until(check, what: str, timeout: float = 45.0, every: float = 1.0, traffic=None):
    """Poll ``check()`` (a list of problems; empty = done), sending ``traffic()`` between polls."""
    deadline = time.monotonic() + timeout
    problems: list = ["never checked"]
    while time.monotonic() < deadline:
        if traffic is not None:
            await traffic()
        problems = await check()
        if not problems:
            return
        await asyncio.sleep(every)
    pytest.fail(f"{what}: " + "; ".join(map(str, problems[:20])))


@pytest.fixture(scope="module")
def tools():
    if not sync.HELM.exists():
        require_tool(str(sync.HELM))
    return require_tool("prometheus")


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        # A Service selects pods of its own namespace only.
        (("mode=monitoring-only", "existingServer.podSelector.app=x", "existingServer.namespaces={inference}",
          "prometheus.monitor.kind=ServiceMonitor"), "needs prometheus.monitor.kind=PodMonitor"),
        # Rules without the monitor that labels their series would page for ever.
        (("prometheus.monitor.enabled=false",), "prometheus.rules.enabled needs prometheus.monitor.enabled"),
    ],
    ids=["servicemonitor-other-namespace", "rules-without-monitor"],
)  # fmt: skip
def test_chart_refuses_what_cannot_judge_its_pods_in_one_line(tools, sets, says):
    with pytest.raises(sync.SyncError) as err:
        render_release("watch", "monitoring", sets)
    lines = [ln for ln in str(err.value).splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and says in lines[0] and len(lines[0]) < 250, lines


def test_generated_scrape_job_labels_as_the_operator_would(tools, tmp_path):
    """The generator on one rendered PodMonitor, read back by promtool's own relabelling
    (``promtool check service-discovery``): only the monitor's pod and port are kept, and of
    that port name only the sidecar's container's (the server's own ``metrics`` port would be
    a target that is no sidecar: a down target and a false LLMSidecarDown)."""
    promtool = require_tool("promtool")
    other = _helm("watch", "monitoring", "mode=monitoring-only", "existingServer.podSelector.app=vllm-b",
                  "existingServer.namespaces={inference}")  # fmt: skip
    (monitor,) = [o for o in other if o["kind"] == "PodMonitor"]
    pods = [
        operator.Pod("vllm-b-1", "inference", {"app": "vllm-b"},
                     (operator.Container("vllm", {"http": "127.0.0.1:1", "metrics": "127.0.0.1:6"}, {"http": 8000, "metrics": 8001}),
                      operator.Container("llm-sidecar", {"http": "127.0.0.1:2", "metrics": "127.0.0.1:3"}, {"http": 8080, "metrics": 9464}))),
        operator.Pod("vllm-a-1", "inference", {"app": "vllm-a"}, (operator.Container("llm-sidecar", {"metrics": "127.0.0.1:4"}),)),
        operator.Pod("vllm-b-2", "monitoring", {"app": "vllm-b"}, (operator.Container("llm-sidecar", {"metrics": "127.0.0.1:5"}),)),
    ]  # fmt: skip
    for enforced in ("", "namespace"):
        (job, *_) = operator.podmonitor_scrape_configs(monitor, pods, enforced)
        assert job["job_name"] == "podMonitor/monitoring/watch-llm-sidecar/0"
        config = tmp_path / f"sd-{enforced or 'plain'}.yml"
        config.write_text(yaml.safe_dump({"scrape_configs": [job]}), encoding="utf-8")
        done = subprocess.run([promtool, "check", "service-discovery", "--timeout=1s", str(config), job["job_name"]],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        kept = [t["labels"] for t in json.loads(done.stdout) if t.get("labels")]
        assert len(kept) == 1, kept
        labels = kept[0]
        assert (
            labels["pod"] == "vllm-b-1"
            and labels["container"] == "llm-sidecar"
            and labels["endpoint"] == "metrics"
        )
        assert (
            labels["job"] == "llm-sidecar"
            and labels[LABEL_RELEASE] == "monitoring/watch-llm-sidecar"
        )
        assert labels["namespace"] == ("monitoring" if enforced else "inference")


def test_enforce_expr_reaches_every_selector():
    e = 'sum by (a) (rate(x{a="1",namespace="q"}[5m])) / absent(up) or group by (a) (y[1d] offset 29d) unless on (a) z{b=~"}"}'
    assert operator.enforce_expr(e, "namespace", "p") == (
        'sum by (a) (rate(x{a="1",namespace="p"}[5m])) / absent(up{namespace="p"}) or group by (a) '
        '(y{namespace="p"}[1d] offset 29d) unless on (a) z{b=~"}",namespace="p"}'
    )
    assert operator.enforce_expr(
        'label_replace(vector(0), "a", "x{y}", "", "")', "namespace", "p"
    ) == ('label_replace(vector(0), "a", "x{y}", "", "")')


async def test_every_install_path_pages_right_in_a_real_prometheus(tools, tmp_path):
    paths = install_paths()
    simulator, up_port = start_simulator("--jitter", "0", "--tokens-spread", "0")
    upstream = f"127.0.0.1:{up_port}"
    sidecars: dict[tuple[str, int], ServeProcess] = {}
    proms: list[Prom] = []
    try:
        for path in paths:
            for i, _ in enumerate(path.pods):
                sidecars[path.key, i] = ServeProcess(f"http://{upstream}", clean_env=True)
        for sc in sidecars.values():
            sc.ports()
        pods = [
            (path, operator.Pod(f"{path.fullname}-7f9c{i}-x{n}", ns, labels,
                                tuple(_containers(containers, False, sidecars[path.key, i], upstream)
                                      + _containers(init, True, sidecars[path.key, i], upstream))))
            for n, path in enumerate(paths)
            for i, (ns, labels, containers, init) in enumerate(path.pods)
        ]  # fmt: skip
        for enforced in (False, True):
            label = "namespace" if enforced else ""
            work = tmp_path / ("enforced" if enforced else "plain")
            work.mkdir()
            mine = [p for p in paths if enforced or not p.enforced_only]
            cluster = [pod for path, pod in pods if path in mine]
            services = [svc for path in mine for svc in path.services()]
            files, jobs = [], []
            for path in mine:
                for monitor in path.of_kind("PodMonitor"):
                    jobs += operator.podmonitor_scrape_configs(monitor, cluster, label)
                for monitor in path.of_kind("ServiceMonitor"):
                    jobs += operator.servicemonitor_scrape_configs(
                        monitor, services, cluster, label
                    )
                (rule,) = path.of_kind("PrometheusRule")
                spec = (
                    operator.enforce_rules(rule["spec"], label, path.namespace)
                    if enforced
                    else rule["spec"]
                )
                file = work / f"{path.key}.yaml"
                file.write_text(
                    yaml.safe_dump(spec, sort_keys=False, width=10**9), encoding="utf-8"
                )
                files.append(str(file))
            config = {
                "global": {
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "evaluation_interval": "1s",
                },
                "rule_files": files,
                "scrape_configs": jobs,
            }
            proc, port = start_prometheus(tools, work, config)
            name = "enforcedNamespaceLabel" if enforced else "no enforcedNamespaceLabel"
            proms.append(Prom(name, enforced, proc, f"http://127.0.0.1:{port}", mine))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            async with session.get(f"http://{upstream}/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
            await _run(session, paths, sidecars, proms, model)
    finally:
        for prom in proms:
            prom.proc.terminate()
            prom.proc.wait(timeout=10)
        for sc in sidecars.values():
            sc.stop()
        simulator.kill()
        simulator.communicate(timeout=10)


async def _run(session, paths: list[InstallPath], sidecars, proms: list[Prom], model: str) -> None:
    by_key = {p.key: p for p in paths}
    for prom in proms:
        await _until(lambda prom=prom: _not_ready(session, prom), f"{prom.name} ready", timeout=60)
    live = dict(sidecars)

    async def healthy() -> None:
        await asyncio.gather(*(_stream(session, sc.url, model, HEALTHY) for sc in live.values()))

    # 1. Healthy: targets, records and quiet alerts, in both Prometheus.
    for prom in proms:
        await _until(
            lambda prom=prom: _targets_wrong(session, prom),
            f"{prom.name}: targets",
            traffic=healthy,
        )
        await _until(
            lambda prom=prom: _records_missing(session, prom),
            f"{prom.name}: SLO records",
            traffic=healthy,
        )
        await _until(
            lambda prom=prom: prom.active(session),
            f"{prom.name}: healthy, yet alerts",
            traffic=healthy,
        )
        await _until(
            lambda prom=prom: _rules_unhealthy(session, prom),
            f"{prom.name}: rules",
            traffic=healthy,
        )
        assert await prom.query(session, 'count({deployment!=""})') == [], (
            f"{prom.name}: a series carries deployment"
        )

    # 2. A TTFT regression in team-b's chat: its own page, nobody else's.
    regressed = by_key["full-team-b"]
    slow = live.pop((regressed.key, 0))  # from now on it gets slow requests only
    for _ in range(3):
        await asyncio.gather(
            healthy(), *(_stream(session, slow.url, model, SLOW) for _ in range(16))
        )

    def paged(prom: Prom):
        async def check() -> list:
            active = await prom.active(session)
            mine = [
                a
                for a in active
                if a["alertname"] == "LLMTTFTBurnRate"
                and a["severity"] == "critical"
                and a[LABEL_RELEASE] == regressed.release
            ]
            others = [a for a in active if a.get(LABEL_RELEASE) != regressed.release]
            return (["no page for " + regressed.release] if not mine else []) + [
                ("not its own", a) for a in others
            ]

        return check

    for prom in proms:
        await _until(
            paged(prom), f"{prom.name}: regression in {regressed.release}", traffic=healthy
        )

    # 3. The cross-namespace monitoring-only sidecar stops: its own down alert only.
    stopped = by_key["monitoring-only-other-ns"]
    live.pop((stopped.key, 0)).stop()

    def down(prom: Prom):
        async def check() -> list:
            active = await prom.active(session)
            mine = [
                a
                for a in active
                if a["alertname"] == "LLMSidecarDown" and a[LABEL_RELEASE] == stopped.release
            ]
            health = [
                a
                for a in active
                if a["alertname"] in ("LLMSidecarDown", "LLMNoTrafficData")
                and a[LABEL_RELEASE] != stopped.release
            ]
            strays = [
                a
                for a in active
                if a.get(LABEL_RELEASE) not in (stopped.release, regressed.release)
            ]
            return (["no LLMSidecarDown for " + stopped.release] if not mine else []) + [
                ("not its own", a) for a in health + strays
            ]

        return check

    for prom in proms:
        await _until(down(prom), f"{prom.name}: {stopped.release} stopped", traffic=healthy)


async def _not_ready(session: aiohttp.ClientSession, prom: Prom) -> list:
    assert prom.proc.poll() is None, f"{prom.name} exited"
    try:
        async with session.get(f"{prom.base}/-/ready") as r:
            return [] if r.status == 200 else ["not ready"]
    except aiohttp.ClientConnectionError:
        return ["not listening"]


async def _targets_wrong(session: aiohttp.ClientSession, prom: Prom) -> list:
    """Each path's sidecar job scrapes exactly its own pods, up, with the operator's labels."""
    targets = (await _api(session, prom.base, "targets", state="active"))["activeTargets"]
    problems = []
    for path in prom.paths:
        pool = path.pool
        got = sorted(
            (t["labels"]["namespace"], t["labels"].get(LABEL_RELEASE), t["labels"]["job"], t["labels"]["container"],
             t["labels"]["endpoint"], t["health"])
            for t in targets if t["scrapePool"] == pool
        )  # fmt: skip
        want = sorted(
            (prom.namespace(path, ns), path.release, "llm-sidecar", "llm-sidecar", "metrics", "up")
            for ns, *_ in path.pods
        )
        if got != want:
            problems.append((path.key, got, want))
    return problems


async def _rules_unhealthy(session: aiohttp.ClientSession, prom: Prom) -> list:
    """Every rule of every release evaluated without error (the enforced ones too)."""
    groups = (await _api(session, prom.base, "rules"))["groups"]
    assert len({g["file"] for g in groups}) == len(prom.paths)
    return [
        (g["file"].rsplit("/", 1)[-1], r.get("name"), r.get("health"), r.get("lastError"))
        for g in groups
        for r in g["rules"]
        if r.get("health") != "ok"
    ]


async def _records_missing(session: aiohttp.ClientSession, prom: Prom) -> list:
    problems = []
    for path in prom.paths:
        (ns, *_), *_ = path.pods
        result = await prom.query(
            session,
            f'group by (__name__, slo, namespace) ({{__name__=~"llm:.+",{LABEL_RELEASE}="{path.release}"}})',
        )
        got = {(s["metric"]["__name__"], s["metric"].get("slo", "")) for s in result}
        missing = _slo_records(path) - got
        namespaces = {s["metric"].get("namespace") for s in result}
        if missing or namespaces != {prom.namespace(path, ns)}:
            problems.append((path.key, sorted(missing)[:5], namespaces))
    return problems
