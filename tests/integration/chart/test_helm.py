"""The Helm chart, rendered by the pinned helm (.tools/bin/helm, `make tools`).

- `helm lint --strict` with the default values and every ci/*-values.yaml;
- `helm template` of every case in scripts/sync_chart.py CASES equals its golden render in
  tests/golden/helm/, and deploy/kubernetes/ equals a fresh render (refresh both with
  scripts/sync-chart.sh);
- every rendered object validates offline against the Kubernetes schemas of the version it
  was rendered for (kubernetes-validate --strict); the Prometheus Operator objects, which have
  no schema there, are checked for their required fields here;
- what the chart promises: the Service reaches only the sidecar, a native sidecar from
  Kubernetes 1.29, probes on the admin port, a grace period longer than the drain, an
  environment the sidecar accepts (and that starts the real sidecar), the PrometheusRule
  carrying exactly the rules promtool tests, one dashboard ConfigMap per JSON file.

Skipped without helm locally; fails under CI=true.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import pytest
import yaml

from sidecar.config import load_settings
from sidecar.export import semconv
from tests.support.chart import CHART, ROOT, by_kind, render, render_error, sync
from tests.support.serve import bound_ports, start_simulator
from tests.support.skips import IN_CI

pytestmark = pytest.mark.integration


CASES = {case.name: case for case in sync.CASES}
FULL_CASES = [name for name in CASES if "monitoring-only" not in name]
CRD_KINDS = sync.MONITORING_KINDS


def require(condition: bool, message: str) -> None:
    if not condition:
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def helm_ok() -> None:
    require(sync.HELM.exists(), f"{sync.HELM} is missing (make tools: scripts/install-helm.sh)")


@pytest.fixture(scope="session")
def renders(helm_ok) -> dict[str, str]:
    """`helm template` output of every case, rendered once, in parallel."""
    with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
        futures = {name: pool.submit(sync.template, case.args()) for name, case in CASES.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="session")
def parsed(renders) -> dict[str, list[dict]]:
    """The objects of every case's render (read-only: copy before changing one)."""
    return {name: sync.objects(text) for name, text in renders.items()}


def one(objs: list[dict], kind: str) -> dict:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def client_service(objs: list[dict]) -> dict:
    """The Service clients use (not the admin port's <fullname>-metrics, a ServiceMonitor's)."""
    found = [o for o in by_kind(objs, "Service") if not o["metadata"]["name"].endswith("-metrics")]
    assert len(found) == 1, f"expected one clients' Service, got {len(found)}"
    return found[0]


def case_values(name: str) -> dict:
    """The values files of a case, merged (shallowly: enough for the top-level lists)."""
    out: dict = {}
    for v in CASES[name].values:
        out.update(yaml.safe_load((CHART / v).read_text(encoding="utf-8")))
    return out


def pod_spec(objs: list[dict]) -> dict:
    return one(objs, "Deployment")["spec"]["template"]["spec"]


def sidecar_container(spec: dict) -> dict:
    found = [
        c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "llm-sidecar"
    ]
    assert len(found) == 1
    return found[0]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def literal_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


# ------------------------------------------------------------------------------ lint and goldens


@pytest.mark.parametrize("values", [None] + sorted(p.name for p in (CHART / "ci").glob("*.yaml")))
def test_helm_lint_strict(helm_ok, values):
    image = ["--set", f"image.repository={sync.EXAMPLE_IMAGE}"]  # required: none is published
    args = ["lint", "--strict", *image, str(CHART)] + (
        ["-f", str(CHART / "ci" / values)] if values else []
    )
    out = sync.helm(*args)
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("name", list(CASES))
def test_render_matches_its_golden(renders, name):
    case = CASES[name]
    path = sync.golden_path(case)
    expected = sync.golden_text(case, renders[name])
    assert path.exists(), f"{path.relative_to(ROOT)} is missing; refresh with scripts/sync-chart.sh"
    assert path.read_text(encoding="utf-8") == expected, (
        f"{path.relative_to(ROOT)} differs from `{case.command()}`: review the change, then refresh with scripts/sync-chart.sh"
    )


def test_golden_dir_holds_exactly_the_cases(helm_ok):
    assert {p.name for p in sync.GOLDEN_DIR.glob("*.yaml")} == {
        sync.golden_path(c).name for c in sync.CASES
    }


def test_plain_manifests_are_a_fresh_render_of_the_chart(helm_ok):
    assert not sync.stale(sync.expected_chart_files(), complete=False), (
        "the chart's rules or dashboards are stale: scripts/sync-chart.sh"
    )
    want = sync.expected_manifests()
    have = set(sync.DEPLOY_DIR.glob("**/*.yaml"))
    assert have == set(want), "deploy/kubernetes/ holds only rendered files: scripts/sync-chart.sh"
    for path, text in want.items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)} is stale: scripts/sync-chart.sh"
        )


def test_sync_check_agrees(helm_ok):
    """`scripts/sync-chart.sh --check` (what CI or a reviewer can run) sees everything in step."""
    done = subprocess.run(
        ["bash", "scripts/sync-chart.sh", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


def test_sync_check_reports_a_stale_render(helm_ok, monkeypatch, capsys):
    """A committed manifest that is not what the chart renders (edited by hand, say) fails."""
    want = sync.expected_manifests()
    path = sync.DEPLOY_DIR / "monitoring.yaml"
    want[path] += "# the chart changed\n"
    monkeypatch.setattr(sync, "expected_manifests", lambda: want)
    assert sync.main(["--check"]) == 1
    assert (
        "deploy/kubernetes/monitoring.yaml: differs from a fresh render" in capsys.readouterr().err
    )


# ------------------------------------------------------------------------------ schemas


@pytest.fixture(scope="session")
def kubernetes_validate():
    try:
        import kubernetes_validate  # noqa: PLC0415
    except ImportError:
        require(False, "kubernetes-validate is not installed (pip install -e '.[test]')")
    return kubernetes_validate


def schema_versions(case) -> list[str]:
    versions = [case.kube_version]
    if case.kube_version != sync.KUBE_VERSION_LEGACY:
        versions.append("1.29.0")  # the oldest release with native sidecars
    return versions


@pytest.mark.parametrize("name", list(CASES))
def test_every_object_validates_against_kubernetes_schemas(parsed, kubernetes_validate, name):
    objs = parsed[name]
    assert objs
    checked = 0
    for obj in objs:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in schema_versions(CASES[name]):
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{obj['kind']}/{obj['metadata']['name']} for Kubernetes {version}: {exc.message} at {list(exc.path)}"
                )
        checked += 1
    assert checked or name == "monitoring-only"


def test_the_schema_validation_would_catch_a_mistake(parsed, kubernetes_validate):
    deployment = copy.deepcopy(one(parsed["default"], "Deployment"))
    deployment["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, sync.KUBE_VERSION, strict=True)


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")


def check_endpoint(endpoint: dict, jobs: str, path: str = "/metrics") -> None:
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "relabelings"}
    assert endpoint["port"] == "metrics" and endpoint["path"] == path
    for key in ("interval", "scrapeTimeout"):
        if key in endpoint:
            assert DURATION.fullmatch(endpoint[key])
    assert {"action": "replace", "targetLabel": "job", "replacement": jobs} in endpoint[
        "relabelings"
    ]


def check_endpoints(endpoints: list[dict], values: dict) -> None:
    """The sidecar's /metrics, then the model server's own, relayed as /metrics/engine (by
    default not in monitoring-only mode: the team's server is likely scraped already)."""
    assert len(endpoints) == (2 if values.get("engine", True) else 1)
    check_endpoint(endpoints[0], values["job"])
    if len(endpoints) == 2:
        check_endpoint(endpoints[1], "llm-engine", "/metrics/engine")


def check_crd(obj: dict, values: dict) -> None:
    """Required fields of Prometheus Operator's monitoring.coreos.com/v1 kinds."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    meta = obj["metadata"]
    assert len(meta["name"]) <= 63 and DNS_LABEL.fullmatch(meta["name"])
    if values["release"]:
        assert meta["labels"]["release"] == values["release"], (
            "kube-prometheus-stack selects on release"
        )
    spec = obj["spec"]
    if obj["kind"] == "PodMonitor":
        assert set(spec) <= {"selector", "namespaceSelector", "podMetricsEndpoints"}
        assert spec["selector"]["matchLabels"]
        check_endpoints(spec["podMetricsEndpoints"], values)
    elif obj["kind"] == "ServiceMonitor":
        assert set(spec) <= {"selector", "namespaceSelector", "endpoints"}
        assert spec["selector"]["matchLabels"]
        check_endpoints(spec["endpoints"], values)
    elif obj["kind"] == "PrometheusRule":
        assert set(spec) == {"groups"} and spec["groups"]
        for group in spec["groups"]:
            assert set(group) <= {"name", "interval", "rules", "limit", "partial_response_strategy"}
            assert group["name"] and group["rules"]
            for rule in group["rules"]:
                assert set(rule) <= {
                    "record",
                    "alert",
                    "expr",
                    "for",
                    "labels",
                    "annotations",
                    "keep_firing_for",
                }
                assert ("record" in rule) != ("alert" in rule) and rule["expr"]
    else:
        raise AssertionError(obj["kind"])


CRD_EXPECTATIONS = {
    "default": {
        "release": "kube-prometheus-stack",
        "job": "llm-sidecar",
        "kinds": {"PodMonitor", "PrometheusRule"},
    },
    "default-k8s-1.28": {
        "release": "kube-prometheus-stack",
        "job": "llm-sidecar",
        "kinds": {"PodMonitor", "PrometheusRule"},
    },
    "default-k8s-1.29": {
        "release": "kube-prometheus-stack",
        "job": "llm-sidecar",
        "kinds": {"PodMonitor", "PrometheusRule"},
    },
    "model-server-liveness": {
        "release": "kube-prometheus-stack",
        "job": "llm-sidecar",
        "kinds": {"PodMonitor", "PrometheusRule"},
    },
    "monitoring-only": {
        "release": "kube-prometheus-stack",
        "job": "llm-sidecar",
        "kinds": {"PodMonitor", "PrometheusRule"},
        "engine": False,
    },
    "otel-slo": {
        "release": "prometheus",
        "job": "llm-sidecar",
        "kinds": {"ServiceMonitor", "PrometheusRule"},
    },
    "platform": {
        "release": "kube-prometheus-stack",
        "job": "llm-sidecar",
        "kinds": {"ServiceMonitor", "PrometheusRule"},
    },
}


@pytest.mark.parametrize("name", list(CASES))
def test_prometheus_operator_objects_have_their_required_fields(parsed, name):
    objs = parsed[name]
    crds = [o for o in objs if o["kind"] in CRD_KINDS]
    assert {o["kind"] for o in crds} == CRD_EXPECTATIONS[name]["kinds"]
    for obj in crds:
        check_crd(obj, CRD_EXPECTATIONS[name])
    core = {"Deployment", "Service", "ConfigMap", "ServiceAccount", "PodDisruptionBudget"}
    assert not {o["kind"] for o in objs} - CRD_KINDS - core


# ------------------------------------------------------------------------------ the pod


@pytest.mark.parametrize("name", FULL_CASES)
def test_every_request_to_the_service_passes_through_the_sidecar(parsed, name):
    objs = parsed[name]
    service, deployment = client_service(objs), one(objs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    spec = deployment["spec"]["template"]["spec"]
    sidecar = sidecar_container(spec)
    sidecar_ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert sidecar_ports == {"http": 8080, "metrics": 9464}
    all_ports = [
        p for c in spec.get("initContainers", []) + spec["containers"] for p in c.get("ports", [])
    ]
    assert len({p["name"] for p in all_ports}) == len(all_ports), "port names are unique in the pod"
    # The admin port (the engine's own metrics too) is not for clients: the monitors scrape it.
    targets = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert targets == {"http": 8080}, "every Service port lands on the sidecar, by number"
    # The model server listens on loopback only, on the port the sidecar forwards to.
    extras = [c["name"] for c in case_values(name).get("extraContainers", [])]
    server = [c for c in spec["containers"] if c["name"] not in ["llm-sidecar", *extras]]
    assert len(server) == 1
    args = server[0]["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    port = args[args.index("--port") + 1]
    assert literal_env(sidecar)["LLM_SIDECAR_UPSTREAM"] == f"http://127.0.0.1:{port}"
    assert server[0]["image"].startswith("vllm/vllm-openai:")
    assert args[:2] == ["--model", args[1]] and args[1]
    assert "nvidia.com/gpu" in server[0]["resources"]["limits"]
    assert "readinessProbe" not in server[0], "readiness comes from the sidecar's /readyz"


@pytest.mark.parametrize("name", FULL_CASES)
def test_native_sidecar_from_kubernetes_1_29_regular_container_before(parsed, name):
    spec = pod_spec(parsed[name])
    native = CASES[name].kube_version != sync.KUBE_VERSION_LEGACY
    sidecar = sidecar_container(spec)
    # Init containers of the values run first; extra containers come after the chart's.
    init = [c["name"] for c in case_values(name).get("extraInitContainers", [])]
    extras = [c["name"] for c in case_values(name).get("extraContainers", [])]
    if native:
        assert [c["name"] for c in spec["initContainers"]] == [*init, "llm-sidecar"]
        assert sidecar["restartPolicy"] == "Always"
        assert sidecar["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert [c["name"] for c in spec["containers"]] == ["model-server", *extras]
    else:
        assert [c["name"] for c in spec.get("initContainers", [])] == init
        assert "restartPolicy" not in sidecar
        assert [c["name"] for c in spec["containers"]] == ["model-server", "llm-sidecar", *extras]


@pytest.mark.parametrize(
    "kube_version, native, expected",
    [("1.28.15", "auto", False), ("1.29.0", "auto", True), ("v1.30.4-eks-a737599", "auto", True),
     ("1.33.0", "false", False), ("1.28.0", "true", True)],
)  # fmt: skip
def test_native_sidecar_switch(helm_ok, kube_version, native, expected):
    objs = sync.objects(
        sync.template(
            [
                "--kube-version",
                kube_version,
                "--set",
                f"sidecar.native={native}",
                "--show-only",
                "templates/deployment.yaml",
            ]
        )
    )
    assert ("initContainers" in pod_spec(objs)) is expected


@pytest.mark.parametrize("name", FULL_CASES)
def test_probes_ask_the_admin_port(parsed, name):
    sidecar = sidecar_container(pod_spec(parsed[name]))
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    admin = int(literal_env(sidecar)["LLM_SIDECAR_METRICS_LISTEN"].rsplit(":", 1)[1])
    assert ports["metrics"] == admin
    expected = {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    for probe, path in expected.items():
        assert sidecar[probe]["httpGet"] == {"path": path, "port": "metrics"}
    assert sidecar["readinessProbe"]["timeoutSeconds"] > float(
        load_settings({}, environ={**literal_env(sidecar)}).readiness_timeout
    ), "the probe outlasts the sidecar's own upstream check"


@pytest.mark.parametrize("name", FULL_CASES)
def test_sidecar_security_context(parsed, name):
    spec = pod_spec(parsed[name])
    ctx = sidecar_container(spec)["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] != 0
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", FULL_CASES)
def test_grace_period_outlasts_the_drain(parsed, name):
    spec = pod_spec(parsed[name])
    drain = float(literal_env(sidecar_container(spec))["LLM_SIDECAR_DRAIN_SECONDS"])
    server = [c for c in spec["containers"] if c["name"] == "model-server"][0]
    pre_stop = server["lifecycle"]["preStop"]
    slept = (
        pre_stop["sleep"]["seconds"] if "sleep" in pre_stop else int(pre_stop["exec"]["command"][1])
    )
    assert spec["terminationGracePeriodSeconds"] > slept + drain + 5, (
        "preStop, drain, then up to 5 s of trace flush"
    )


def test_grace_period_is_computed_or_refused(helm_ok):
    spec = pod_spec(
        render("--set", "sidecar.drainSeconds=100", "--show-only", "templates/deployment.yaml")
    )
    assert spec["terminationGracePeriodSeconds"] == 125  # 10 s preStop + 100 s drain + 15
    spec = pod_spec(
        render("--set", "sidecar.drainSeconds=12.5", "--show-only", "templates/deployment.yaml")
    )
    assert spec["terminationGracePeriodSeconds"] == 38
    spec = pod_spec(
        render("--set", "modelServer.preStopSeconds=0", "--show-only", "templates/deployment.yaml")
    )
    assert spec["terminationGracePeriodSeconds"] == 45
    assert "lifecycle" not in [c for c in spec["containers"] if c["name"] == "model-server"][0]
    error = render_error("--set", "terminationGracePeriodSeconds=40")
    assert (
        "terminationGracePeriodSeconds (40) must exceed sidecar.drainSeconds (30) plus modelServer.preStopSeconds (10)"
        in error
    )
    error = render_error("--set", "modelServer.preStopSeconds=30")
    assert "sidecar.drainSeconds must exceed modelServer.preStopSeconds" in error


@pytest.mark.parametrize("name", list(CASES))
def test_sidecar_environment_is_accepted_by_the_sidecar(parsed, name):
    """The chart's LLM_SIDECAR_* values load into the real Settings model, and the pod's
    identity comes from the downward API under the names sidecar/export/otel_env.py reads."""
    if name == "monitoring-only":
        container = sync.render_extra(sync.SNIPPET_TEMPLATE, CASES[name].args())["container"]
    else:
        container = sidecar_container(pod_spec(parsed[name]))
    env = env_of(container)
    settings = load_settings({}, environ=literal_env(container))
    assert settings.listen_addr == ("0.0.0.0", 8080) and settings.metrics_addr == ("0.0.0.0", 9464)
    field_refs = {
        n: e["valueFrom"]["fieldRef"]["fieldPath"] for n, e in env.items() if "valueFrom" in e
    }
    assert field_refs == {
        "K8S_POD_NAME": "metadata.name",
        "K8S_POD_UID": "metadata.uid",
        "K8S_NAMESPACE_NAME": "metadata.namespace",
        "K8S_NODE_NAME": "spec.nodeName",
    }
    known = {var for var, _ in semconv.K8S_ENV_ATTRIBUTES}
    k8s_env = {n for n in env if n.startswith("K8S_")}
    assert k8s_env <= known
    assert k8s_env == known - ({"K8S_DEPLOYMENT_NAME"} if name == "monitoring-only" else set())


def test_custom_thresholds_and_otel_reach_the_sidecar(parsed):
    sidecar = sidecar_container(pod_spec(parsed["otel-slo"]))
    env = literal_env(sidecar)
    settings = load_settings({}, environ=env)
    assert (settings.slo_ttft_seconds, settings.slo_tpot_seconds, settings.slo_e2e_seconds) == (
        5.0,
        0.05,
        120.0,
    )
    assert settings.drain_seconds == 120 and settings.read_timeout == 900
    assert (
        settings.model_allowlist == ["meta-llama/Llama-3.1-8B-Instruct"]
        and settings.otel_metrics is True
    )
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4317"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert env["OTEL_SERVICE_NAME"] == "llm-sidecar-llama-8b"
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "deployment.environment=prod"
    default = literal_env(sidecar_container(pod_spec(parsed["default"])))
    assert not [k for k in default if k.startswith("OTEL_")], "no exporter unless asked"


def test_rendered_environment_starts_the_real_sidecar(parsed, tmp_path):
    """Run `llm-sidecar serve` with the Deployment's environment (ports moved to free ones)
    beside the simulator, and ask what the kubelet and a client would ask."""
    sidecar = sidecar_container(pod_spec(parsed["otel-slo"]))
    env = literal_env(sidecar)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT")  # no collector here
    env.pop("LLM_SIDECAR_OTEL_METRICS")
    exe = shutil.which("llm-sidecar", path=str(Path(sys.executable).parent)) or "llm-sidecar"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_SIDECAR_", "OTEL_"))}
    server, upstream = start_simulator(
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--ttft", "0.01", "--tpot", "0.001", "--tokens", "4",
        command=(exe,), env=base_env,
    )  # fmt: skip
    env.update(
        LLM_SIDECAR_UPSTREAM=f"http://127.0.0.1:{upstream}",
        LLM_SIDECAR_LISTEN="127.0.0.1:0",  # the ports it bound are in its started line
        LLM_SIDECAR_METRICS_LISTEN="127.0.0.1:0",
        K8S_POD_NAME="llm-sidecar-0",
        K8S_NAMESPACE_NAME="llm",
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [exe, "serve"],
        env={**base_env, **env},
        stdout=out.open("w"),
        stderr=(tmp_path / "err").open("w"),
    )
    try:

        async def exercise() -> None:
            async with aiohttp.ClientSession() as http:
                deadline = time.monotonic() + 30
                status = None
                while time.monotonic() < deadline:
                    if (ports := bound_ports(out.read_text())) is None:
                        await asyncio.sleep(0.05)
                        continue
                    proxy, admin = ports
                    try:
                        async with http.get(f"http://127.0.0.1:{admin}/readyz") as r:
                            status = r.status
                            if status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
                assert status == 200, (tmp_path / "err").read_text()
                async with http.get(f"http://127.0.0.1:{admin}/healthz") as r:
                    assert r.status == 200
                body = {
                    "model": "meta-llama/Llama-3.1-8B-Instruct",
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                }
                async with http.post(
                    f"http://127.0.0.1:{proxy}/v1/chat/completions", json=body
                ) as r:
                    assert r.status == 200
                    assert b"[DONE]" in await r.read()
                async with http.get(f"http://127.0.0.1:{admin}/metrics") as r:
                    text = await r.text()
                assert (
                    'llm_requests_total{code="200",error_type="none",model="meta-llama/Llama-3.1-8B-Instruct"'
                    in text
                )

        asyncio.run(exercise())
    finally:
        for p in (proc, server):
            p.terminate()
        for p in (proc, server):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# ------------------------------------------------------------------------------ monitoring


def test_prometheus_rule_carries_exactly_the_rules_promtool_tests(parsed):
    """Each PrometheusRule's spec is the rules of the spec the promtool unit tests load, as
    the release applies it (scoped to its namespace and deployment, severities mapped)."""
    from sidecar.tools.slo import load_spec, render_rules
    from sidecar.tools.slo.helm import SHIPPED, release_rules

    rules = by_kind(parsed["default"], "PrometheusRule")
    sources = {r["metadata"]["annotations"]["llm-sidecar/source"]: r for r in rules}
    shipped = {str(p.relative_to(ROOT)) for p in (ROOT / "deploy" / "prometheus").glob("*.yaml")}
    assert set(sources) == shipped
    tested = set()
    for test_file in (ROOT / "tests" / "promtool").glob("*.yaml"):
        for rule_file in yaml.safe_load(test_file.read_text(encoding="utf-8"))["rule_files"]:
            tested.add(str((test_file.parent / rule_file).resolve().relative_to(ROOT)))
    assert tested <= shipped and tested
    for source, rule in sources.items():
        spec = load_spec(str(ROOT / SHIPPED[source.rsplit("/", 1)[1]]))
        want = render_rules(release_rules(spec, sync.NAMESPACE, sync.RELEASE))
        assert rule["spec"] == yaml.safe_load(want), source


def test_dashboard_configmaps_equal_the_dashboards(parsed):
    maps = [o for o in by_kind(parsed["default"], "ConfigMap")]
    shipped = sorted((ROOT / "dashboards").glob("*.json"))
    assert len(maps) == len(shipped)
    for cm, path in zip(maps, shipped, strict=True):
        assert cm["metadata"]["annotations"]["llm-sidecar/source"] == f"dashboards/{path.name}"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        # The release's own copy: its key (the file Grafana's sidecar writes), uid and title
        # name the release (test_helm_dashboards.py).
        assert list(cm["data"]) == [f"llm_llm-sidecar_{path.name}"]
        (text,) = cm["data"].values()
        got, want = json.loads(text), json.loads(path.read_text(encoding="utf-8"))
        assert (
            got["uid"].startswith(want["uid"] + "-")
            and got["title"] == f"{want['title']} (llm/llm-sidecar)"
        )
        assert {
            **got,
            "uid": want["uid"],
            "title": want["title"],
            "templating": want["templating"],
        } == want
        assert len(json.dumps(cm).encode()) < 1 << 20, "a ConfigMap holds at most 1 MiB"


def test_the_packaged_chart_holds_the_dashboards_themselves(helm_ok, tmp_path):
    """files/dashboards is a copy of dashboards/ (scripts/sync-chart.sh): `helm package` (what
    the release publishes) stores exactly those files."""
    sync.helm("package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("llm-sidecar-*.tgz")
    with tarfile.open(package) as tar:
        stored = {
            m.name: tar.extractfile(m).read()
            for m in tar.getmembers()
            if "/files/dashboards/" in m.name
        }
    shipped = {
        f"llm-sidecar/files/dashboards/{p.name}": p.read_bytes()
        for p in (ROOT / "dashboards").glob("*.json")
    }
    assert shipped and stored == shipped


@pytest.mark.parametrize("count", [0, 1, 3])
def test_one_dashboard_configmap_per_json_file(helm_ok, tmp_path, count):
    chart = tmp_path / "llm-sidecar"
    shutil.copytree(CHART, chart)
    dashboards = (
        chart / "files" / "dashboard-templates"
    )  # what the chart renders (tests/integration/chart/test_helm_dashboards.py)
    shutil.rmtree(dashboards)
    dashboards.mkdir()
    names = ["llm-sidecar-overview.json", "Token_Throughput.json", "a b.json"][:count]
    for i, name in enumerate(names):
        (dashboards / name).write_text(
            json.dumps({"title": name, "panels": [{"id": i}]}, indent=2) + "\n"
        )
    (dashboards / "README.md").write_text("not a dashboard\n")
    objs = sync.objects(
        sync.template(["--kube-version", sync.KUBE_VERSION, "--set", "grafana.dashboards.folder=Models",
                       "--set", "grafana.dashboards.namespace=monitoring", "--show-only", "templates/dashboards.yaml"]
                      if count else ["--kube-version", sync.KUBE_VERSION], chart=chart)
    )  # fmt: skip
    maps = by_kind(objs, "ConfigMap")
    assert len(maps) == count
    for cm in maps:
        meta = cm["metadata"]
        assert DNS_LABEL.fullmatch(meta["name"]) and len(meta["name"]) <= 63
        assert meta["labels"]["grafana_dashboard"] == "1"
        assert meta["annotations"]["grafana_folder"] == "Models"
        assert meta["namespace"] == "monitoring"
        (key,) = cm["data"]
        assert re.fullmatch(r"[-._a-zA-Z0-9]+", key)
        source = meta["annotations"]["llm-sidecar/source"].removeprefix("dashboards/")
        assert cm["data"][key] == (dashboards / source).read_text()
    assert len({cm["metadata"]["name"] for cm in maps}) == count


def test_monitoring_only_renders_only_monitoring_objects(parsed):
    objs = parsed["monitoring-only"]
    assert {o["kind"] for o in objs} <= CRD_KINDS | {"ConfigMap"}
    podmonitor = one(objs, "PodMonitor")
    assert podmonitor["spec"]["selector"]["matchLabels"] == {"app": "my-vllm"}
    assert podmonitor["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}


def test_monitoring_only_notes_print_the_snippet(helm_ok):
    """What `helm install` prints in monitoring-only mode is the container in
    deploy/kubernetes/snippets/, from the same template."""
    args = [*CASES["monitoring-only"].args()]
    notes = sync.render_extra(sync.NOTES_TEMPLATE, args)["text"]
    printed = yaml.safe_load(
        notes.split("pod template", 1)[1].split("\n\n", 1)[1].split("\n\n", 1)[0]
    )
    snippet = yaml.safe_load(
        (sync.DEPLOY_DIR / "snippets" / "sidecar-container.yaml").read_text(encoding="utf-8")
    )
    assert printed == snippet
    assert (
        "targetPort at the sidecar's port number, 8080" in notes
        and "terminationGracePeriodSeconds: 55" in notes
    )
    full = sync.render_extra(sync.NOTES_TEMPLATE, CASES["default"].args())["text"]
    assert "a native sidecar" in full and "port-forward svc/llm-sidecar 8000:8000" in full


def test_monitoring_only_with_a_servicemonitor_adds_a_metrics_service(helm_ok):
    # A Service selects pods of its own namespace only: the values' other namespace is refused with it.
    objs = render("-f", str(CHART / "ci" / "monitoring-only-values.yaml"), "--set", "prometheus.monitor.kind=ServiceMonitor",
                  "--set-json", "existingServer.namespaces=[]")  # fmt: skip
    service, monitor = one(objs, "Service"), one(objs, "ServiceMonitor")
    assert service["spec"]["selector"] == {"app": "my-vllm"}
    assert [(p["name"], p["targetPort"]) for p in service["spec"]["ports"]] == [("metrics", 9464)]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert not by_kind(objs, "Deployment")


def test_monitoring_only_needs_the_servers_pod_labels(helm_ok):
    assert "set existingServer.podSelector" in render_error("--set", "mode=monitoring-only")


@pytest.mark.parametrize("name", ["otel-slo", "platform"])
def test_servicemonitor_selects_the_metrics_service_and_its_admin_port_alone(parsed, name):
    """The ServiceMonitor scrapes through a Service: the chart's <fullname>-metrics, which
    carries the admin port and selects the release's pods; the clients' Service stays
    without it, and the monitor does not select it."""
    objs = parsed[name]
    monitor, client = one(objs, "ServiceMonitor"), client_service(objs)
    (metrics,) = [s for s in by_kind(objs, "Service") if s is not client]
    selector = monitor["spec"]["selector"]["matchLabels"].items()
    assert metrics["metadata"]["name"] == "llm-sidecar-metrics"
    assert selector <= metrics["metadata"]["labels"].items()
    assert not selector <= client["metadata"]["labels"].items()
    assert [(p["name"], p["port"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [
        ("metrics", 9464, 9464)
    ]
    assert metrics["spec"]["type"] == "ClusterIP"
    assert metrics["spec"]["selector"] == client["spec"]["selector"]
    assert [p["name"] for p in client["spec"]["ports"]] == ["http"]


def test_the_admin_port_is_on_the_clients_service_only_when_asked(helm_ok):
    def ports(*args: str) -> dict[str, list[str]]:
        return {s["metadata"]["name"]: [p["name"] for p in s["spec"]["ports"]]
                for s in by_kind(render(*args), "Service")}  # fmt: skip

    assert ports() == {"llm-sidecar": ["http"]}, "the PodMonitor scrapes the pods"
    assert ports("--set", "prometheus.monitor.kind=ServiceMonitor") == {
        "llm-sidecar": ["http"],
        "llm-sidecar-metrics": ["metrics"],
    }
    assert ports("--set", "service.exposeAdminPort=true") == {"llm-sidecar": ["http", "metrics"]}
    assert ports("--set", "prometheus.monitor.kind=ServiceMonitor",
                 "--set", "prometheus.monitor.enabled=false", "--set", "prometheus.rules.enabled=false") == {
        "llm-sidecar": ["http"]}  # fmt: skip


def test_podmonitor_selects_the_pods_and_their_metrics_port(parsed):
    objs = parsed["default"]
    monitor, deployment = one(objs, "PodMonitor"), one(objs, "Deployment")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert "metrics" in [p["name"] for p in sidecar_container(pod_spec(objs))["ports"]]


def test_each_monitoring_object_can_be_switched_off(helm_ok):
    objs = render(
        "--set", "prometheus.monitor.enabled=false", "--set", "prometheus.rules.enabled=false",
        "--set", "grafana.dashboards.enabled=false",
    )  # fmt: skip
    assert {o["kind"] for o in objs} == {
        "Deployment", "Service", "ServiceAccount", "PodDisruptionBudget"}  # fmt: skip
    objs = render("--set", "prometheus.release=", "--set", "prometheus.extraLabels.team=ml")
    for obj in objs:
        if obj["kind"] in CRD_KINDS:
            assert "release" not in obj["metadata"]["labels"]
            assert obj["metadata"]["labels"]["team"] == "ml"
        else:
            assert "team" not in obj["metadata"]["labels"], (
                "extraLabels: the monitor and rules only"
            )


def test_bad_values_are_refused_at_render_time(helm_ok):
    assert "ttftSeconds" in render_error("--set", "sidecar.slo.ttftSeconds=2.2")
    assert "settings" in render_error("--set", "sidecar.settings.no_such_setting=1")
    assert "must differ" in render_error("--set", "sidecar.port=8000")


# ------------------------------------------------------------------------------ rollouts and probes


def resolves(target, pod: dict, kube_version: str) -> bool:
    """Whether Kubernetes gives a Service port with this targetPort an endpoint on this pod.
    A number always resolves (the endpoint is pod IP:number; here it must also be a port a
    container declares, or nothing listens). A name resolves only if a container declares
    it, and before 1.32 only a regular container: names on init containers, native sidecars
    included, were not looked up (kubernetes#127958, fixed in 1.32)."""
    regular = [p for c in pod["containers"] for p in c.get("ports", [])]
    init = [p for c in pod.get("initContainers", []) for p in c.get("ports", [])]
    if isinstance(target, int):
        return target in {p["containerPort"] for p in regular + init}
    major, minor = (int(x) for x in kube_version.split(".")[:2])
    declared = regular + (init if (major, minor) >= (1, 32) else [])
    return target in {p.get("name") for p in declared}


@pytest.mark.parametrize(
    "kube_version", ["1.28.0", "1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0"]
)
def test_services_resolve_on_every_kubernetes_version(helm_ok, kube_version):
    for sets in (
        [],
        [
            "--set",
            "prometheus.monitor.kind=ServiceMonitor",
            "--set",
            "service.exposeAdminPort=true",
        ],
    ):
        objs = sync.objects(sync.template(["--kube-version", kube_version, *sets]))
        pod = pod_spec(objs)
        ports = [p for s in by_kind(objs, "Service") for p in s["spec"]["ports"]]
        assert len(ports) == (1 if not sets else 3)
        for port in ports:
            assert resolves(port["targetPort"], pod, kube_version), (kube_version, port)
    monitoring = sync.objects(
        sync.template(["--kube-version", kube_version, "-f", str(CHART / "ci" / "monitoring-only-values.yaml"),
                       "--set", "prometheus.monitor.kind=ServiceMonitor", "--set-json", "existingServer.namespaces=[]"])
    )  # fmt: skip
    snippet = sync.render_extra(sync.SNIPPET_TEMPLATE, CASES["monitoring-only"].args())["container"]
    as_native = {"containers": [], "initContainers": [snippet]}
    for port in one(monitoring, "Service")["spec"]["ports"]:
        assert resolves(port["targetPort"], as_native, kube_version), (kube_version, port)


@pytest.mark.parametrize(
    "kube_version, expected", [("1.29.0", False), ("1.31.0", False), ("1.32.0", True)]
)
def test_the_resolution_check_catches_named_ports_on_native_sidecars(
    helm_ok, kube_version, expected
):
    """Today's chart before this fix: `targetPort: http` on a native sidecar has no endpoint
    before 1.32; the check above would have failed on it."""
    pod = pod_spec(
        sync.objects(
            sync.template(
                ["--kube-version", kube_version, "--show-only", "templates/deployment.yaml"]
            )
        )
    )
    assert "initContainers" in pod
    assert resolves("http", pod, kube_version) is expected
    legacy = pod_spec(
        sync.objects(
            sync.template(["--kube-version", "1.28.0", "--show-only", "templates/deployment.yaml"])
        )
    )
    assert resolves("http", legacy, "1.28.0")


@pytest.mark.parametrize(
    "kube_version, action",
    [("1.28.0", {"exec": {"command": ["sleep", "10"]}}), ("1.29.0", {"exec": {"command": ["sleep", "10"]}}),
     ("1.30.0", {"sleep": {"seconds": 10}}), ("1.33.0", {"sleep": {"seconds": 10}})],
)  # fmt: skip
def test_model_server_keeps_serving_while_endpoints_are_removed(helm_ok, kube_version, action):
    """A preStop sleep on the model server (the kubelet's sleep action from 1.30, `sleep`
    before); the sidecar gets none: it follows the server down (sidecar/relay/server/drain.py)."""
    pod = pod_spec(
        sync.objects(
            sync.template(
                ["--kube-version", kube_version, "--show-only", "templates/deployment.yaml"]
            )
        )
    )
    server = [c for c in pod["containers"] if c["name"] == "model-server"][0]
    assert server["lifecycle"] == {"preStop": action}
    assert "lifecycle" not in sidecar_container(pod)


def test_model_server_liveness_is_off_by_default_and_asks_the_sidecar_when_on(parsed):
    server = [c for c in pod_spec(parsed["default"])["containers"] if c["name"] == "model-server"][
        0
    ]
    assert "livenessProbe" not in server and "startupProbe" not in server
    pod = pod_spec(parsed["model-server-liveness"])
    server = [c for c in pod["containers"] if c["name"] == "model-server"][0]
    admin = int(literal_env(sidecar_container(pod))["LLM_SIDECAR_METRICS_LISTEN"].rsplit(":", 1)[1])
    for probe in ("startupProbe", "livenessProbe"):
        # A number: the kubelet resolves a named probe port in the probed container only.
        assert server[probe]["httpGet"] == {"path": "/upstreamz", "port": admin}
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 1800, "the load allowance"
    assert (
        server["livenessProbe"]["failureThreshold"] * server["livenessProbe"]["periodSeconds"] == 60
    )
    own = pod_spec(render("--set", "modelServer.liveness.enabled=true", "--set-string", "modelServer.livenessProbe.exec.command={true}",
                          "--show-only", "templates/deployment.yaml"))  # fmt: skip
    server = [c for c in own["containers"] if c["name"] == "model-server"][0]
    assert server["livenessProbe"] == {"exec": {"command": ["true"]}}, "an explicit probe wins"


def test_engine_metrics_scrape_can_be_switched_off(helm_ok):
    monitor = one(render("--set", "prometheus.monitor.engine.enabled=false"), "PodMonitor")
    assert [e["path"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["/metrics"]


@pytest.mark.parametrize(
    ("sets", "workers"),
    [
        ((), "1"),  # the default request, 100m
        (("sidecar.resources.requests.cpu=1500m",), "2"),
        (("sidecar.resources.requests.cpu=2",), "2"),
        (("sidecar.resources.requests.cpu=0.5",), "1"),
        (("sidecar.resources.requests.cpu=4", "sidecar.workers=3"), "3"),
        (("sidecar.workers=auto",), "auto"),
    ],
)
def test_workers_follow_the_sidecars_cpu_request(helm_ok, sets, workers):
    """One worker per requested core, rounded up, unless ``sidecar.workers`` says; the value
    the sidecar then reads is a valid ``--workers``."""
    args = [a for s in sets for a in ("--set", s)]
    env = literal_env(sidecar_container(pod_spec(render(*args))))
    assert env["LLM_SIDECAR_WORKERS"] == workers
    settings = load_settings({}, environ={"LLM_SIDECAR_UPSTREAM": "http://x:1", **env})
    assert settings.workers == (int(workers) if workers.isdigit() else workers)


def test_workers_below_one_are_refused(helm_ok):
    assert "sidecar.workers" in render_error("--set", "sidecar.workers=0")
