"""Dashboards for many releases, rendered by the pinned helm.

- Two releases never overwrite each other's dashboards: Grafana keys a dashboard by its uid
  (and wants titles unique in a folder), kube-prometheus-stack's dashboard sidecar loads every
  labelled ConfigMap and writes each data key as a file into one folder (the last writer wins,
  and deleting a ConfigMap deletes its files), so each release's ConfigMaps, uids, titles and
  data keys must differ: two names in one namespace, one name in two namespaces, with and
  without one shared Grafana namespace; and the plain set's keys (`kubectl apply -k
  dashboards/`) are none of a release's.
- The SLO dashboard draws what the release's rules use: with the default values it is
  dashboards/llm-sidecar-slo.json itself (but for uid and title); with other objectives,
  windows or budget shares it is exactly what the generator draws for the spec those values
  describe; per-model overrides from values add their target lines, thresholds and colours.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests.support.chart import require_helm, sync
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

CHART = ROOT / "helm" / "llm-sidecar"
SPEC = ROOT / "deploy" / "slo" / "default.yaml"


@pytest.fixture(scope="module", autouse=True)
def helm_ok() -> None:
    require_helm()


def dashboards(release: str = "llm-sidecar", namespace: str = "llm", *sets: str) -> list[dict]:
    """The dashboard ConfigMaps of one release, each with its data key, the dashboards/ file it
    is the copy of, and its dashboard parsed."""
    args = [a for s in sets for a in ("--set", s)]
    text = sync.helm("template", release, str(CHART), "--namespace", namespace, "--kube-version", sync.KUBE_VERSION,
                     "--set", f"image.repository={sync.EXAMPLE_IMAGE}", "--show-only", "templates/dashboards.yaml", *args)  # fmt: skip
    out = []
    for cm in sync.objects(text):
        (key,) = cm["data"]
        source = cm["metadata"]["annotations"]["llm-sidecar/source"]
        out.append({"namespace": cm["metadata"].get("namespace", namespace), "name": cm["metadata"]["name"],
                    "key": key, "file": source.removeprefix("dashboards/"), "dashboard": json.loads(cm["data"][key])})  # fmt: skip
    assert out
    return out


def by_file(maps: list[dict]) -> dict[str, dict]:
    return {m["file"]: m["dashboard"] for m in maps}


# ------------------------------------------------------------------------------ many releases

PAIRS = {
    "two names, one namespace": (("a", "llm"), ("b", "llm"), ()),
    "one name, two namespaces": (("llm-sidecar", "team-a"), ("llm-sidecar", "team-b"), ()),
    "one name, two namespaces, one Grafana namespace": (
        ("llm-sidecar", "team-a"), ("llm-sidecar", "team-b"), ("grafana.dashboards.namespace=monitoring",)),
    "two names, Grafana's namespace is one's own": (
        ("a", "monitoring"), ("b", "team-b"), ("grafana.dashboards.namespace=monitoring",)),
}  # fmt: skip


def plain_keys() -> set[str]:
    """The data keys of `kubectl apply -k dashboards/`: kustomize's key of a `files` entry is
    its `key=` part, else the file's name."""
    k = yaml.safe_load((ROOT / "dashboards" / "kustomization.yaml").read_text(encoding="utf-8"))
    entries = [f for g in k["configMapGenerator"] for f in g["files"]]
    keys = {f.split("=", 1)[0] if "=" in f else f.rsplit("/", 1)[-1] for f in entries}
    assert len(keys) == len(entries) and keys
    return keys


@pytest.mark.parametrize("pair", list(PAIRS))
def test_two_releases_dashboards_cannot_overwrite_each_other(pair):
    (r1, n1), (r2, n2), sets = PAIRS[pair]
    one, two = dashboards(r1, n1, *sets), dashboards(r2, n2, *sets)
    # Kubernetes: no ConfigMap of one is the other's (same namespace and name).
    assert not {(m["namespace"], m["name"]) for m in one} & {
        (m["namespace"], m["name"]) for m in two
    }
    # Grafana's dashboard sidecar: no file of one is the other's, nor one of the plain set's
    # (it writes every ConfigMap's keys into one folder, whichever namespace they come from).
    keys_one, keys_two = {m["key"] for m in one}, {m["key"] for m in two}
    assert len(keys_one) == len(one) and len(keys_two) == len(two)
    assert not keys_one & keys_two
    assert not (keys_one | keys_two) & plain_keys()
    # Grafana: no uid, and no title, of one is the other's.
    assert not {m["dashboard"]["uid"] for m in one} & {m["dashboard"]["uid"] for m in two}
    assert not {m["dashboard"]["title"] for m in one} & {m["dashboard"]["title"] for m in two}
    for m in one + two:
        assert len(m["dashboard"]["uid"]) <= 40, "Grafana's uid limit"


def test_a_release_names_its_keys_namespace_fullname_file():
    """<namespace>_<fullname>_<file>: neither a namespace nor a fullname (DNS names) holds "_",
    so the key says whose file it is, and no plain file name (none holds "_") is one."""
    for release, namespace, fullname in (
        ("llm-sidecar", "llm", "llm-sidecar"),
        ("chat", "team-a", "chat-llm-sidecar"),
    ):
        for m in dashboards(release, namespace):
            assert m["key"] == f"{namespace}_{fullname}_{m['file']}"
    assert not [k for k in plain_keys() if "_" in k]
    assert {m["file"] for m in dashboards()} == plain_keys(), "one release copy per plain file"


def test_a_release_keeps_its_uids_across_upgrades():
    """The uid and the key follow the release, not the values: an upgrade updates the same
    dashboard, in the same file."""
    before = {(m["key"], m["dashboard"]["uid"]) for m in dashboards("a", "llm")}
    after = {
        (m["key"], m["dashboard"]["uid"])
        for m in dashboards("a", "llm", "prometheus.rules.objectives.ttft.target=99")
    }
    assert before == after


# ------------------------------------------------------------------------------ the release's objectives


def plain(spec_data: dict) -> dict[str, dict]:
    from sidecar.tools.dashboards import build_dashboards  # noqa: PLC0415
    from sidecar.tools.slo.spec import parse_spec  # noqa: PLC0415

    return build_dashboards(parse_spec(spec_data))


def release_variable(d: dict) -> dict:
    (variable,) = [v for v in d["templating"]["list"] if v["name"] == "llm_release"]
    return variable


def without_release(d: dict, like: dict) -> dict:
    """``d`` with ``like``'s uid, title and release variable: what a release changes."""
    d = copy.deepcopy(d)
    release_variable(d)["current"] = release_variable(like)["current"]
    return {**d, "uid": like["uid"], "title": like["title"]}


def test_with_the_default_values_each_is_the_committed_dashboard():
    for name, got in by_file(dashboards()).items():
        want = json.loads((ROOT / "dashboards" / name).read_text(encoding="utf-8"))
        assert (
            got["uid"].startswith(want["uid"] + "-")
            and got["title"] == f"{want['title']} (llm/llm-sidecar)"
        )
        # It opens on its own release (the label its monitors give its series), not on All.
        assert release_variable(got)["current"]["value"] == ["llm/llm-sidecar"]
        assert release_variable(want)["current"]["value"] == "$__all"
        assert without_release(got, want) == want, name


VALUES_CASES = {
    "ttft threshold 5s": ({"prometheus.rules.objectives.ttft.thresholdSeconds": "5.0"}, {"ttft": {"threshold_seconds": 5.0}}, {}),
    "targets and a threshold": (
        {"prometheus.rules.objectives.ttft.target": "99", "prometheus.rules.objectives.availability.target": "99.9",
         "prometheus.rules.objectives.tpot.thresholdSeconds": "0.05"},
        {"ttft": {"target": 99}, "availability": {"target": 99.9}, "tpot": {"threshold_seconds": 0.05}}, {}),
    "windows and budget shares": (
        {"prometheus.rules.windows.page-fast.long": "2h", "prometheus.rules.windows.page-fast.short": "10m",
         "prometheus.rules.windows.ticket-slow.budgetPercent": "12.5"},
        {}, {"page-fast": {"long": "2h", "short": "10m"}, "ticket-slow": {"budget_percent": 12.5}}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(VALUES_CASES))
def test_the_slo_dashboard_draws_the_objectives_the_values_give(case):
    """What the generator draws for the spec these values describe, exactly."""
    sets, objectives, windows = VALUES_CASES[case]
    data = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    for o in data["objectives"]:
        o.update(objectives.get(o["name"], {}))
    if windows:
        data["windows"] = windows
    want = plain(data)
    for name, got in by_file(
        dashboards("llm-sidecar", "llm", *(f"{k}={v}" for k, v in sets.items()))
    ).items():
        assert without_release(got, want[name]) == want[name], name


def test_ttft_threshold_from_values_is_the_one_drawn():
    """The issue's example: --set ...ttft.thresholdSeconds=5.0 left "<= 2s" drawn."""
    slo = by_file(
        dashboards("llm-sidecar", "llm", "prometheus.rules.objectives.ttft.thresholdSeconds=5.0")
    )["llm-sidecar-slo.json"]
    text = json.dumps(slo)
    assert "time to first token <= 5s for 95% of streamed requests" in text
    assert "time to first token <= 2s" not in text
    assert 'le=\\"5.0\\"' in text and 'le=\\"2.0\\"' not in text


def panels(d: dict):
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def test_per_model_overrides_from_values_are_drawn():
    sets = ("prometheus.rules.modelOverrides[0].objective=ttft", "prometheus.rules.modelOverrides[0].model=big-405b",
            "prometheus.rules.modelOverrides[0].target=90", "prometheus.rules.modelOverrides[0].thresholdSeconds=10.0")  # fmt: skip
    slo = by_file(dashboards("llm-sidecar", "llm", *sets))["llm-sidecar-slo.json"]
    default = by_file(dashboards())["llm-sidecar-slo.json"]
    byt = {p["title"]: p for p in panels(slo)}
    assert (
        "SLO ttft: time to first token <= 2s for 95% of streamed requests, over 30d (1 per-model override)"
        in byt
    )
    line = next(
        q["expr"] for q in byt["ttft: SLI vs target"]["targets"] if q["expr"].startswith("(0 * ")
    )
    assert line.startswith("(0 * llm:sli_error:ratio_rate30d{") and 'model="big-405b"' in line
    assert "} + 0.9) or 0 * llm:sli_error:ratio_rate30d{" in line and line.endswith(" + 0.95")
    (breakdown,) = [q["expr"] for q in byt["ttft: bad-event share by pod and route"]["targets"]]
    override_part, _, default_part = breakdown.partition(") or ")
    assert (
        'model="big-405b"' in override_part
        and 'le="10.0"' in override_part
        and 'le="2.0"' in default_part
    )
    (colour,) = byt["ttft: SLI over 30d"]["fieldConfig"]["overrides"]
    assert colour["matcher"] == {"id": "byRegexp", "options": "^(.* )?big-405b$"}
    assert colour["properties"][0]["value"]["steps"][-1] == {"color": "green", "value": 0.9}
    assert (
        "Per-model overrides: model big-405b: time to first token <= 10s for 90% of streamed requests."
        in byt["ttft: SLI over 30d"]["description"]
    )
    # Nothing else changes: the other objectives' panels are the default render's.
    others = [p for p in panels(slo) if not p["title"].startswith(("ttft", "SLO ttft"))]
    assert others == [p for p in panels(default) if not p["title"].startswith(("ttft", "SLO ttft"))]


def test_an_override_of_the_target_alone_keeps_the_objectives_threshold():
    sets = ("prometheus.rules.modelOverrides[0].objective=ttft", "prometheus.rules.modelOverrides[0].model=m",
            "prometheus.rules.modelOverrides[0].target=90")  # fmt: skip
    slo = by_file(dashboards("llm-sidecar", "llm", *sets))["llm-sidecar-slo.json"]
    byt = {p["title"]: p for p in panels(slo)}
    (breakdown,) = [q["expr"] for q in byt["ttft: bad-event share by pod and route"]["targets"]]
    assert ") or " not in breakdown  # the default scope's threshold is the model's own
    assert (
        "model m: time to first token <= 2s for 90% of streamed requests"
        in byt["ttft: SLI over 30d"]["description"]
    )
    assert (
        copy.deepcopy(byt["ttft: SLI over 30d"]["fieldConfig"]["overrides"])[0]["matcher"][
            "options"
        ]
        == "^(.* )?m$"
    )
