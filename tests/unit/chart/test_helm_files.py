"""The image and chart files that need no helm binary: Dockerfile, .dockerignore, the chart's
rules (rendered) and dashboards (a copy), values.yaml against values.schema.json, and the values
that must agree with the rest of the repo (settings, buckets, SLO spec, versions).

Rendering tests (helm lint, helm template, goldens, Kubernetes schemas) are in
tests/integration/chart/test_helm.py.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import jsonschema
import pytest
import yaml

from sidecar.base.buckets import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from sidecar.config import Settings, parse_host_port
from tests.support.chart import CHART, ROOT, sync
from tests.support.image import dockerfile_instructions, final_stage, image_entrypoint_and_cmd

# ------------------------------------------------------------------------------ Dockerfile


def test_dockerfile_is_multi_stage_on_slim_python_311():
    args = {
        a.split("=", 1)[0]: a.split("=", 1)[1]
        for i, a in dockerfile_instructions()
        if i == "ARG" and "=" in a
    }
    froms = [a for i, a in dockerfile_instructions() if i == "FROM"]
    assert len(froms) >= 2, "a build stage and a runtime stage"
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base), base
    assert all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)
    build_name = froms[0].split()[-1]
    copies = [a for i, a in final_stage() if i == "COPY"]
    assert any(c.startswith(f"--from={build_name} ") for c in copies), (
        "the runtime stage takes the build's venv"
    )
    # No compiler or pip install in the runtime stage: it only copies the built virtualenv.
    assert not [a for i, a in final_stage() if i == "RUN" and "pip install" in a]


def test_dockerfile_runs_as_a_non_root_numeric_user_matching_the_chart():
    users = [a for i, a in final_stage() if i == "USER"]
    assert users, "the runtime stage sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can verify it"
    assert gid.isdigit() and int(gid) != 0
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    ctx = values["sidecar"]["securityContext"]
    assert (ctx["runAsUser"], ctx["runAsGroup"]) == (int(uid), int(gid))
    assert ctx["runAsNonRoot"] and ctx["readOnlyRootFilesystem"]


def test_dockerfile_entrypoint_is_the_program_and_cmd_the_subcommand():
    """One source of truth for the command line: the image names the program, the chart's
    `args` (which replace CMD) name the subcommand; tests/integration/chart/test_kubelet_argv.py
    runs what the two compose."""
    entry, cmd = image_entrypoint_and_cmd()
    assert entry == ["llm-sidecar"] and cmd == ["serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]
    assert "llm-sidecar" in scripts


def test_dockerfile_ports_match_the_settings():
    exposed = {int(p) for i, a in final_stage() if i == "EXPOSE" for p in a.split()}
    proxy_port = parse_host_port(Settings.model_fields["listen"].default)[1]
    admin_port = parse_host_port(Settings.model_fields["metrics_listen"].default)[1]
    assert exposed == {proxy_port, admin_port}


def test_dockerfile_healthcheck_asks_healthz_on_the_admin_port():
    checks = [a for i, a in final_stage() if i == "HEALTHCHECK"]
    assert checks, "Docker gets a HEALTHCHECK; Kubernetes uses the chart's probes"
    assert "/healthz" in checks[-1] and "LLM_SIDECAR_METRICS_LISTEN" in checks[-1]
    env = " ".join(a for i, a in final_stage() if i == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "nothing written on a read-only root filesystem"


def dockerignore_excludes(path: str) -> bool:
    """Docker's rules: patterns in order, the last match wins, `!` re-includes, a pattern
    that matches a parent directory matches everything under it, `**` spans directories."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        if any(re.fullmatch(regex, p) for p in prefixes):
            excluded = not negate
    return excluded


@pytest.mark.parametrize(
    "path",
    [".venv/bin/python", ".git/HEAD", ".tools/bin/helm", "tests/conftest.py", "helm/llm-sidecar/Chart.yaml",
     "node_modules/x/package.json", "sidecar/__pycache__/app.cpython-311.pyc", ".pytest_cache/v/x", "dashboards/a.json"],
)  # fmt: skip
def test_dockerignore_keeps_out(path):
    assert dockerignore_excludes(path)


def test_dockerignore_keeps_everything_the_build_copies():
    sources = []
    for instruction, args in dockerfile_instructions():
        if instruction == "COPY" and not args.startswith("--from"):
            sources += shlex.split(args)[:-1]
    assert sources
    for source in sources:
        path = ROOT / source
        assert path.exists(), source
        files = [p for p in path.rglob("*.py")] if path.is_dir() else [path]
        for f in files:
            assert not dockerignore_excludes(str(f.relative_to(ROOT))), f


# ------------------------------------------------------------------------------ chart files


def test_chart_rules_and_dashboards_are_a_fresh_render_and_copy():
    drift = sync.stale(sync.expected_chart_files(), complete=False)
    assert not drift, "refresh with scripts/sync-chart.sh:\n" + "\n".join(drift)


def test_chart_dashboards_are_a_copy_of_the_repos_dashboards():
    """helm warns about a symbolic link in a chart on every run (walk.go "found symbolic link"),
    so files/dashboards is a directory holding a copy of each dashboards/*.json, byte for byte,
    and nothing else (`helm package` ships it; tests/integration/chart/test_helm.py)."""
    copy = CHART / "files" / "dashboards"
    assert copy.is_dir() and not copy.is_symlink()
    shipped = {p.name: p.read_bytes() for p in (ROOT / "dashboards").glob("*.json")}
    assert shipped and {p.name: p.read_bytes() for p in copy.iterdir()} == shipped


def test_the_chart_holds_no_symbolic_link():
    links = [str(p.relative_to(CHART)) for p in CHART.rglob("*") if p.is_symlink()]
    assert not links, f"helm warns about each on every run: {links}"


def test_a_link_or_a_stale_copy_is_reported(monkeypatch, tmp_path):
    """The staleness check sees a dashboard edited without the copy, and a link in its place."""
    want = sync.expected_chart_files()
    edited = {p: (t + " " if p.parent == sync.CHART_DASHBOARDS else t) for p, t in want.items()}
    assert any("files/dashboards/" in d for d in sync.stale(edited, complete=False))
    link = tmp_path / "dashboards"
    link.symlink_to(ROOT / "dashboards")
    monkeypatch.setattr(sync, "CHART_DASHBOARDS", link)
    monkeypatch.setattr(sync, "ROOT", tmp_path)
    assert any("a link" in d for d in sync.stale({}, complete=False))


def test_chart_renders_every_rules_file_the_repo_ships():
    rules = sorted(p.name for p in (ROOT / "deploy" / "prometheus").glob("*.yaml"))
    assert rules, "an empty rules directory would render no PrometheusRule"
    assert sorted(p.name for p in (CHART / "files" / "rules").glob("*.yaml")) == rules


def schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))


def chart_values(*files: str) -> dict:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    for f in files:
        values = deep_merge(values, yaml.safe_load((CHART / f).read_text(encoding="utf-8")))
    return values


def deep_merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            deep_merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


@pytest.mark.parametrize(
    "values_file", [None] + sorted(p.name for p in (CHART / "ci").glob("*.yaml"))
)
def test_values_files_satisfy_the_schema(values_file):
    values = chart_values(*([f"ci/{values_file}"] if values_file else []))
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.Draft7Validator(schema()).validate(values)


@pytest.mark.parametrize(
    "path, bad",
    [
        (("sidecar", "slo", "ttftSeconds"), 2.2),
        (("sidecar", "slo", "tpotSeconds"), 0.11),
        (("mode",), "sidecar-only"),
        (("sidecar", "settings"), {"no_such_setting": 1}),
        (("prometheus", "monitor", "kind"), "Probe"),
        (("sidecar", "drainSeconds"), -1),
        (("terminationGracePeriodSeconds",), 0),
        (("sidecar", "nope"), 1),
        (("prometheus", "rules", "windows", "page-fast", "long"), "1 hour"),
        (("prometheus", "rules", "windows", "page-fast", "budgetPercent"), 0),
        (
            ("prometheus", "rules", "windows", "page-medium"),
            {"long": "3h", "short": "15m", "budgetPercent": 3},
        ),
        (("prometheus", "rules", "modelOverrides"), [{"objective": "ttft", "model": "a"}]),
        (
            ("prometheus", "rules", "modelOverrides"),
            [{"objective": "ttft", "model": "a", "thresholdSeconds": 1.7}],
        ),
        (
            ("prometheus", "rules", "modelOverrides"),
            [{"objective": "availability", "model": "a", "thresholdSeconds": 2.0}],
        ),
        (
            ("prometheus", "rules", "modelOverrides"),
            [{"objective": "ttft", "model": "a b", "target": 90}],
        ),
        (("commonLabels",), {"team": 1}),
        (("commonLabels",), {"bad key": "x"}),
        (("commonLabels",), {"team": "not a label value"}),
        (("commonAnnotations",), {"owner": ["a"]}),
        (("serviceAccount", "create"), "yes"),
        (("serviceAccount", "name"), "Not_A_Name"),
        (("serviceAccount", "nope"), 1),
        (("podDisruptionBudget", "minAvailable"), "50"),
        (("podDisruptionBudget", "maxUnavailable"), -1),
        (("podDisruptionBudget", "maxUnavailable"), None),
        (("podDisruptionBudget", "unhealthyPodEvictionPolicy"), "Always"),
        (("podDisruptionBudget", "nope"), 1),
        (("topologySpreadConstraints",), [{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}]),
        (
            ("topologySpreadConstraints",),
            [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}],
        ),
        (("extraContainers",), [{"name": "shipper"}]),
        (("extraInitContainers",), [{"name": "Fetch", "image": "x"}]),
        (("volumes",), [{"emptyDir": {}}]),
        (("sidecar", "extraArgs"), ["--max-connections", 2048]),
        (("sidecar", "volumeMounts"), [{"name": "ca"}]),
        (("service", "exposeAdminPort"), "yes"),
    ],
)
def test_schema_refuses_bad_values(path, bad):
    values = chart_values()
    node = values
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema()).validate(values)


def test_schema_accepts_a_model_override_and_changed_windows():
    values = chart_values()
    rules = values["prometheus"]["rules"]
    rules["modelOverrides"] = [
        {
            "objective": "ttft",
            "model": "meta-llama/Llama-3.1-405B-Instruct",
            "thresholdSeconds": 5.0,
            "target": 90,
        },
        {"objective": "availability", "model": "qwen", "target": "99.9"},
    ]
    rules["windows"]["page-fast"] = {"long": "2h", "short": "10m", "budgetPercent": "2.5"}
    jsonschema.Draft7Validator(schema()).validate(values)


def test_schema_admits_what_a_platform_team_sets():
    """Each of the chart's Kubernetes conventions, with its types (ci/platform-values.yaml has
    them all; the defaults, and these alternatives too)."""
    validator = jsonschema.Draft7Validator(schema())
    values = chart_values("ci/platform-values.yaml")
    validator.validate(values)
    assert {"commonLabels", "commonAnnotations", "serviceAccount", "podDisruptionBudget",
            "topologySpreadConstraints", "extraContainers", "extraInitContainers", "volumes"} <= values.keys()  # fmt: skip
    assert values["sidecar"]["extraArgs"] and values["sidecar"]["volumeMounts"]
    for pdb in ({"minAvailable": 2}, {"maxUnavailable": "25%"}, {"unhealthyPodEvictionPolicy": ""},
                {"enabled": False, "minAvailable": None}):  # fmt: skip
        v = chart_values()
        v["podDisruptionBudget"].update(pdb)
        validator.validate(v)
    v = chart_values()
    v["serviceAccount"] = {"create": False, "name": "", "automount": True, "annotations": {}}
    v["service"]["exposeAdminPort"] = True
    validator.validate(v)


def test_schema_slo_thresholds_are_exactly_the_bucket_bounds():
    slo = schema()["properties"]["sidecar"]["properties"]["slo"]["properties"]
    for key, buckets in (
        ("ttftSeconds", TTFT_BUCKETS),
        ("tpotSeconds", ITL_BUCKETS),
        ("e2eSeconds", E2E_BUCKETS),
    ):
        numbers = [v for v in slo[key]["enum"] if not isinstance(v, str)]
        strings = [v for v in slo[key]["enum"] if isinstance(v, str)]
        assert [float(v) for v in numbers] == list(buckets), key
        assert [float(v) for v in strings] == list(buckets), f"{key}: --set passes strings"


def test_every_sidecar_setting_has_a_way_in_through_the_chart():
    """Settings the templates set themselves, plus those `sidecar.settings` accepts, are
    exactly the sidecar's settings: a new setting must be added to the schema."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    templated = {m.lower() for m in re.findall(r"LLM_SIDECAR_([A-Z0-9_]+)", helpers) if m != "%S"}
    passthrough = set(
        schema()["properties"]["sidecar"]["properties"]["settings"]["propertyNames"]["enum"]
    )
    assert not templated & passthrough, "a setting must not be settable twice"
    assert templated | passthrough == set(Settings.model_fields)


def test_default_job_label_is_the_one_the_rules_alert_on():
    spec = yaml.safe_load((ROOT / "deploy" / "slo" / "default.yaml").read_text(encoding="utf-8"))
    assert (
        chart_values()["prometheus"]["monitor"]["jobLabel"] == spec["alerts"]["target_down"]["job"]
    )


def test_default_slo_values_are_the_sidecars_defaults():
    slo = chart_values()["sidecar"]["slo"]
    assert slo["ttftSeconds"] == Settings.model_fields["slo_ttft_seconds"].default
    assert slo["tpotSeconds"] == Settings.model_fields["slo_tpot_seconds"].default
    assert slo["e2eSeconds"] == Settings.model_fields["slo_e2e_seconds"].default
    assert (
        chart_values()["sidecar"]["drainSeconds"] == Settings.model_fields["drain_seconds"].default
    )


def test_helm_tools_dir_is_gitignored():
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    # ".tools", not ".tools/": a worktree's .tools may be a link to a shared cache, and the
    # pattern with a slash matches only a directory (a committed link once deleted a cache).
    assert ".tools" in ignored
