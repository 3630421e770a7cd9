"""What Kubernetes users expect of a chart, rendered by the pinned helm (.tools/bin/helm):

- commonLabels and commonAnnotations on every object the chart renders (every template is
  rendered by one of the cases here, so a new template without them fails), commonLabels on
  the pods too, the chart's own labels winning (selectors keep working), prometheus.extraLabels
  on the monitor and the rules alone;
- a ServiceAccount of the release's own with no token mounted, or one of yours;
- a PodDisruptionBudget (maxUnavailable 1 by default, or minAvailable; a budget that allows no
  eviction is refused);
- topologySpreadConstraints (counting the release's pods unless told otherwise), extra
  containers, init containers, volumes and mounts, and sidecar.extraArgs after `serve`;
- `helm lint` and `helm template` print no warning (helm warns on stderr, e.g. about a symbolic
  link in the chart, on every run).

The chart's golden case `platform` (ci/platform-values.yaml) renders all of these together;
tests/integration/chart/test_kubelet_argv.py starts its sidecar with the extra arguments.
Skipped without helm locally; fails under CI=true.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.chart import CHART, ROOT, by_kind, render, render_error, require_helm, sync

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def helm_ok() -> None:
    require_helm()


COMMON = ("--set", "commonLabels.team=ml", "--set-string", "commonLabels.example\\.com/cost-center=4711",
          "--set", "commonAnnotations.example\\.com/owner=ml@example.com")  # fmt: skip
# Between them, every template the chart has that renders an object.
RENDERS = {
    "default": (),
    "servicemonitor": ("--set", "prometheus.monitor.kind=ServiceMonitor", "--set", "service.exposeAdminPort=true"),
    "monitoring-only": ("-f", str(CHART / "ci" / "monitoring-only-values.yaml")),
    "monitoring-only-servicemonitor": ("-f", str(CHART / "ci" / "monitoring-only-values.yaml"),
                                       "--set", "prometheus.monitor.kind=ServiceMonitor", "--set-json", "existingServer.namespaces=[]"),
    "dashboards-elsewhere": ("--set", "grafana.dashboards.namespace=monitoring"),
}  # fmt: skip


def template_text(*args: str) -> str:
    return sync.template(["--kube-version", sync.KUBE_VERSION, *args])


def sources(text: str) -> set[str]:
    """The templates a render's objects come from (helm's `# Source:` lines)."""
    return set(re.findall(r"^# Source: llm-sidecar/(templates/\S+)$", text, re.MULTILINE))


def one(objs: list[dict], kind: str) -> dict:
    (found,) = by_kind(objs, kind)
    return found


def pod(objs: list[dict]) -> dict:
    return one(objs, "Deployment")["spec"]["template"]


# ------------------------------------------------------------------------------ labels and annotations


def test_common_labels_and_annotations_are_on_every_object():
    rendered = {name: template_text(*args, *COMMON) for name, args in RENDERS.items()}
    templates = {str(p.relative_to(CHART)) for p in (CHART / "templates").glob("*.yaml")}
    # validate.yaml renders nothing; every other template is in one of the renders above.
    assert set().union(*map(sources, rendered.values())) == templates - {"templates/validate.yaml"}
    for name, text in rendered.items():
        objs = sync.objects(text)
        assert objs, name
        for obj in objs:
            meta, what = obj["metadata"], f"{name}: {obj['kind']}/{obj['metadata']['name']}"
            assert (
                meta["labels"].items() >= {"team": "ml", "example.com/cost-center": "4711"}.items()
            ), what
            assert meta["annotations"]["example.com/owner"] == "ml@example.com", what
            assert meta["labels"]["app.kubernetes.io/name"] == "llm-sidecar", what


def test_the_check_above_would_catch_an_object_without_them(tmp_path):
    chart = tmp_path / "llm-sidecar"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-bare.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bare\n  labels:\n"
        '    {{- include "llm-sidecar.ownLabels" . | nindent 4 }}\n', encoding="utf-8")  # fmt: skip
    objs = sync.objects(sync.template(["--kube-version", sync.KUBE_VERSION, *COMMON], chart=chart))
    bare = [o for o in objs if o["metadata"]["name"] == "bare"]
    assert bare and "team" not in bare[0]["metadata"]["labels"]


def test_common_labels_reach_the_pods_and_never_change_a_selector():
    objs = render(*COMMON, "--set", "podLabels.tier=gpu", "--set", "commonLabels.app\\.kubernetes\\.io/name=other",
                  "--set", "podLabels.team=pods-own")  # fmt: skip
    labels = pod(objs)["metadata"]["labels"]
    assert labels["tier"] == "gpu" and labels["example.com/cost-center"] == "4711"
    assert labels["team"] == "pods-own", "podLabels win over commonLabels on the pods"
    assert "example.com/owner" not in pod(objs)["metadata"].get("annotations", {}), (
        "annotations on the pods are podAnnotations alone"
    )
    deployment, service = one(objs, "Deployment"), one(objs, "Service")
    selector = {
        "app.kubernetes.io/name": "llm-sidecar",
        "app.kubernetes.io/instance": "llm-sidecar",
    }
    assert deployment["spec"]["selector"]["matchLabels"] == selector == service["spec"]["selector"]
    assert selector.items() <= labels.items()
    for obj in objs:
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "llm-sidecar", (
            "the chart's own wins"
        )


def test_extra_labels_go_to_the_monitor_and_rules_on_top_of_the_common_ones():
    objs = render("--set", "commonLabels.team=ml", "--set", "prometheus.extraLabels.team=sre",
                  "--set", "prometheus.extraLabels.prometheus=ops", "--set", "commonLabels.release=mine")  # fmt: skip
    for obj in objs:
        labels = obj["metadata"]["labels"]
        if obj["kind"] in sync.MONITORING_KINDS:
            assert (labels["team"], labels["prometheus"], labels["release"]) == (
                "sre",
                "ops",
                "kube-prometheus-stack",
            )
        else:
            assert (
                labels["team"] == "ml"
                and "prometheus" not in labels
                and labels["release"] == "mine"
            )


def test_label_keys_that_yaml_would_read_otherwise_stay_strings():
    objs = render("--set-string", "commonLabels.on=yes", "--set-string", "commonAnnotations.null=true",
                  "--show-only", "templates/service.yaml")  # fmt: skip
    meta = one(objs, "Service")["metadata"]
    assert meta["labels"]["on"] == "yes" and meta["annotations"]["null"] == "true"


# ------------------------------------------------------------------------------ ServiceAccount


def test_the_release_gets_its_own_service_account_with_no_token():
    objs = render(
        "--set",
        "serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=llm@p.iam.gserviceaccount.com",
    )
    account, spec = one(objs, "ServiceAccount"), pod(objs)["spec"]
    assert account["metadata"]["name"] == spec["serviceAccountName"] == "llm-sidecar"
    assert (
        account["automountServiceAccountToken"] is False
        and spec["automountServiceAccountToken"] is False
    )
    assert (
        account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
        == "llm@p.iam.gserviceaccount.com"
    )
    named = render(
        "--set", "serviceAccount.name=inference", "--set", "serviceAccount.automount=true"
    )
    assert (
        one(named, "ServiceAccount")["metadata"]["name"]
        == pod(named)["spec"]["serviceAccountName"]
        == "inference"
    )
    assert pod(named)["spec"]["automountServiceAccountToken"] is True


@pytest.mark.parametrize("name, expected", [("", None), ("theirs", "theirs")])
def test_or_uses_one_of_yours(name, expected):
    objs = render("--set", "serviceAccount.create=false", "--set", f"serviceAccount.name={name}")
    assert not by_kind(objs, "ServiceAccount")
    assert pod(objs)["spec"].get("serviceAccountName") == expected
    assert pod(objs)["spec"]["automountServiceAccountToken"] is False


# ------------------------------------------------------------------------------ PodDisruptionBudget


def test_disruption_budget_evicts_one_pod_at_a_time_by_default():
    pdb = one(render("--set", "replicaCount=3"), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"] == pod(render())["metadata"]["labels"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # The field exists from Kubernetes 1.27 on; before, the budget goes without it.
    (old,) = sync.objects(
        sync.template(
            ["--kube-version", "1.26.0", "--show-only", "templates/poddisruptionbudget.yaml"]
        )
    )
    assert "unhealthyPodEvictionPolicy" not in old["spec"] and old["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("sets, spec", [
    (("--set", "podDisruptionBudget.minAvailable=2", "--set", "replicaCount=3"), {"minAvailable": 2}),
    (("--set-string", "podDisruptionBudget.minAvailable=50%"), {"minAvailable": "50%"}),
    (("--set-string", "podDisruptionBudget.maxUnavailable=25%"), {"maxUnavailable": "25%"}),
])  # fmt: skip
def test_disruption_budget_takes_min_available_or_max_unavailable(sets, spec):
    pdb = one(render(*sets), "PodDisruptionBudget")
    assert {k: v for k, v in pdb["spec"].items() if k in ("minAvailable", "maxUnavailable")} == spec


@pytest.mark.parametrize("sets", [
    ("--set", "podDisruptionBudget.minAvailable=1"),  # one replica: never evictable
    ("--set-string", "podDisruptionBudget.minAvailable=100%"),
    ("--set", "podDisruptionBudget.maxUnavailable=0"),
])  # fmt: skip
def test_a_budget_that_allows_no_eviction_is_refused(sets):
    assert "a node drain would wait forever" in render_error(*sets)


def test_no_budget_when_off_or_for_pods_that_are_not_the_charts():
    assert not by_kind(render("--set", "podDisruptionBudget.enabled=false"), "PodDisruptionBudget")
    only = render("-f", str(CHART / "ci" / "monitoring-only-values.yaml"))
    assert {o["kind"] for o in only} <= {"PodMonitor", "PrometheusRule", "ConfigMap"}


# ------------------------------------------------------------------------------ the pod's extras


def test_topology_spread_counts_the_releases_pods_unless_told():
    objs = render("--set-json", 'topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"topology.kubernetes.io/zone","whenUnsatisfiable":"ScheduleAnyway"},'
                  '{"maxSkew":2,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"DoNotSchedule","labelSelector":{"matchLabels":{"tier":"gpu"}}}]')  # fmt: skip
    zone, host = pod(objs)["spec"]["topologySpreadConstraints"]
    assert zone == {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": one(objs, "Deployment")["spec"]["selector"]["matchLabels"]}}  # fmt: skip
    assert host["labelSelector"] == {"matchLabels": {"tier": "gpu"}} and host["maxSkew"] == 2
    assert "topologySpreadConstraints" not in pod(render())["spec"]


@pytest.mark.parametrize(
    "kube_version, native", [(sync.KUBE_VERSION, True), (sync.KUBE_VERSION_LEGACY, False)]
)
def test_extra_containers_volumes_mounts_and_args(kube_version, native):
    objs = sync.objects(
        sync.template(
            ["--kube-version", kube_version, "-f", str(CHART / "ci" / "platform-values.yaml")]
        )
    )
    spec = pod(objs)["spec"]
    init = [c["name"] for c in spec.get("initContainers", [])]
    containers = [c["name"] for c in spec["containers"]]
    assert init == ["fetch-weights", *(["llm-sidecar"] if native else [])], "yours run first"
    assert containers == ["model-server", *([] if native else ["llm-sidecar"]), "log-shipper"]
    (sidecar,) = [
        c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "llm-sidecar"
    ]
    assert sidecar["args"] == ["serve", "--max-connections", "2048"]
    assert sidecar["volumeMounts"] == [
        {"name": "ca-bundle", "mountPath": "/etc/ssl/corporate", "readOnly": True}
    ]
    volumes = {v["name"] for v in spec["volumes"]}
    mounted = {
        m["name"]
        for c in spec.get("initContainers", []) + spec["containers"]
        for m in c.get("volumeMounts", [])
    }
    assert {"weights", "ca-bundle"} <= volumes and mounted <= volumes
    default = [c for c in pod(render())["spec"]["initContainers"] if c["name"] == "llm-sidecar"]
    assert default[0]["args"] == ["serve"] and "volumeMounts" not in default[0]  # fmt: skip


def test_extra_args_reach_the_pasted_container_too():
    args = [
        "-f",
        str(CHART / "ci" / "monitoring-only-values.yaml"),
        "--set-json",
        'sidecar.extraArgs=["--max-connections","2048"]',
    ]
    snippet = sync.render_extra(
        sync.SNIPPET_TEMPLATE, ["--kube-version", sync.KUBE_VERSION, *args]
    )["container"]
    assert snippet["args"] == ["serve", "--max-connections", "2048"]


@pytest.mark.parametrize("which, name", [("extraContainers", "llm-sidecar"), ("extraInitContainers", "model-server"),
                                         ("extraContainers", "fetch-weights")])  # fmt: skip
def test_a_container_name_taken_twice_is_refused(which, name):
    sets = (
        ["--set-json", 'extraInitContainers=[{"name":"fetch-weights","image":"x"}]']
        if name == "fetch-weights" and which == "extraContainers"
        else []
    )
    error = render_error(*sets, "--set-json", f'{which}=[{{"name":"{name}","image":"x"}}]')
    assert f"a container named {name} is already in the pod" in error


# ------------------------------------------------------------------------------ helm says nothing more


def helm_run(*args: str, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
    """helm as sync_chart.py runs it, its stdout and stderr both kept."""
    env = {**os.environ, "HELM_CACHE_HOME": str(ROOT / ".tools" / "helm-cache"),
           "HELM_CONFIG_HOME": str(ROOT / ".tools" / "helm-config"), "HELM_DATA_HOME": str(ROOT / ".tools" / "helm-data")}  # fmt: skip
    return subprocess.run(
        [str(sync.HELM), *args], cwd=chart, capture_output=True, text=True, timeout=120, env=env
    )


IMAGE = ("--set", f"image.repository={sync.EXAMPLE_IMAGE}")
VALUES = [None, *sorted(p.name for p in (CHART / "ci").glob("*.yaml"))]


def lint_problems(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What `helm lint` says beyond its report: stderr, and any warning or error line."""
    noise = [ln for ln in done.stderr.splitlines() if ln.strip()]
    flagged = [ln for ln in done.stdout.splitlines() if re.match(r"\[(WARNING|ERROR)\]", ln)]
    return noise + flagged


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_and_template_print_no_warning(values):
    files = ["-f", str(CHART / "ci" / values)] if values else []
    lint = helm_run("lint", "--strict", *IMAGE, *files, str(CHART))
    assert lint.returncode == 0 and "1 chart(s) linted, 0 chart(s) failed" in lint.stdout
    assert not lint_problems(lint)
    done = helm_run("template", "llm-sidecar", str(CHART), "--namespace", "llm", *IMAGE, *files)
    assert done.returncode == 0 and done.stdout
    assert done.stderr == ""


def test_the_check_above_would_catch_a_symbolic_link(tmp_path):
    chart = tmp_path / "llm-sidecar"
    shutil.copytree(CHART, chart)
    shutil.rmtree(chart / "files" / "dashboards")
    (chart / "files" / "dashboards").symlink_to(ROOT / "dashboards")
    done = helm_run("template", "llm-sidecar", str(chart), *IMAGE, chart=chart)
    assert "found symbolic link" in done.stderr
    assert lint_problems(helm_run("lint", "--strict", *IMAGE, str(chart), chart=chart))
