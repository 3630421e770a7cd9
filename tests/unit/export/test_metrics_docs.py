"""docs/metrics.md and docs/design.md say what the code registers, both ways.

A sidecar is built with every option on (tenants, prompt classes, per-model objectives, OTLP
with its own metrics, as ``serve`` builds it), and its registry is read: every family, with
its label names, with the pod supervisor's own families (``--workers``). Then:

- every family is a row of the metrics table in docs/metrics.md *and* docs/design.md, with
  the same labels (``tenant`` apart: the opt-in label is named once, in the tenants
  paragraphs, which must list exactly the families that carry it);
- every family either table names exists in the code (no documented family that is gone);
- every label name has its row in metrics.md's "Label bounds" table, and the counts the
  docs give for the fixed sets (error types, routes) are the code's;
- every OTel instrument in the sidecar's own namespace is a row of docs/tracing.md.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sidecar.app import build_sidecar
from sidecar.base.outcomes import ERROR_TYPE_LABELS
from sidecar.base.routes import ROUTES
from sidecar.config import Settings
from sidecar.export import semconv as sc
from sidecar.export.otel_setup import providers_from_env
from sidecar.export.prometheus_internals import MetricWrapperBase
from sidecar.fleet.supervisor import Supervisor
from tests.support.paths import ROOT


class _Fixed:
    """One family as collected, registered as a custom collector."""

    def __init__(self, family) -> None:
        self._family = family

    def collect(self):
        return [self._family]


DOCS = ROOT / "docs"
TENANT = "tenant"


@pytest.fixture(scope="module")
def registered() -> dict[str, frozenset[str]]:
    """{exposed family name: label names} of a sidecar built with every option on."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }
    providers = providers_from_env(metrics=True, environ=env)
    reg = CollectorRegistry()
    settings = Settings(
        upstream="http://127.0.0.1:9",
        tenant_header="X-Tenant",
        ttft_prompt_classes=[1024, 8192],
        otel_metrics=True,
    )
    try:
        build_sidecar(settings, reg, access_log=False, providers=providers)
    finally:
        providers.shutdown(timeout=0.1)
    # A pod (--workers): the supervisor's own families join the workers' on its page.
    supervisor = Supervisor(settings, 2, Path(tempfile.mkdtemp()))
    supervisor.renderer.close()
    for family in supervisor.registry.collect():
        if not family.name.startswith("process_"):
            reg.register(_Fixed(family))
    families: dict[str, frozenset[str]] = {}
    for collector in list(reg._collector_to_names):
        if isinstance(collector, MetricWrapperBase):
            name = collector._name + ("_total" if collector._type == "counter" else "")
            families[name] = frozenset(collector._labelnames)
        else:  # custom collectors (process_*, OTLP failures): labels from their samples
            for family in collector.collect():
                name = family.name + ("_total" if family.type == "counter" else "")
                families[name] = frozenset(
                    label for sample in family.samples for label in sample.labels
                ) or frozenset(getattr(family, "_labelnames", ()))  # one read at scrape time
    return families


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _labels(cell: str) -> frozenset[str]:
    """``model, route, type (`input`, ...)`` -> {model, route, type}; ``—`` -> {}."""
    cell = re.sub(r"\([^)]*\)", "", cell)
    return frozenset(w.strip(" `") for w in cell.split(",") if w.strip(" `") not in ("", "—", "-"))


def metric_table(page: str) -> dict[str, frozenset[str]]:
    """{family: labels} from the page's table whose header is ``| metric | type | labels | ...``."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    start = next(
        i for i, line in enumerate(lines) if _cells(line)[:3] == ["metric", "type", "labels"]
    )
    rows: dict[str, frozenset[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        names, _, labels, *_ = _cells(line)
        for name in re.findall(r"`([a-z_:]+)`", names):
            rows[name] = _labels(labels)
    return rows


def bounds_table() -> dict[str, str]:
    """{label: its bound} from metrics.md's ``| label | on | values |`` table."""
    lines = (DOCS / "metrics.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if _cells(line)[:3] == ["label", "on", "values"])
    out: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        labels, _, values = _cells(line)[:3]
        for label in re.findall(r"`([a-z_]+)`", labels):
            out[label] = values
    return out


@pytest.mark.parametrize("page", ["metrics.md", "design.md"])
def test_every_registered_family_is_documented_with_its_labels(registered, page):
    documented = metric_table(page)
    # design.md lists the process collector's families with "...": the llm_ families must all be there.
    must = (
        {n for n in registered if n.startswith("llm_")} if page == "design.md" else set(registered)
    )
    missing = sorted(must - set(documented))
    assert not missing, f"docs/{page} has no row for {missing}"
    wrong = {
        name: (sorted(documented[name]), sorted(registered[name] - {TENANT}))
        for name in must
        if documented[name] != registered[name] - {TENANT}
    }
    assert not wrong, f"docs/{page}: documented vs registered labels: {wrong}"


@pytest.mark.parametrize("page", ["metrics.md", "design.md"])
def test_every_documented_family_is_registered(registered, page):
    gone = sorted(set(metric_table(page)) - set(registered))
    assert not gone, f"docs/{page} documents families the code does not register: {gone}"


def test_the_tenant_paragraphs_name_exactly_the_families_with_the_label(registered):
    with_tenant = {name for name, labels in registered.items() if TENANT in labels}
    assert with_tenant  # the fixture turned tenants on
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    paragraph = text[text.index("**Tenants (opt-in).**") :].split("\n\n", 1)[0]
    named = set(re.findall(r"`(llm_[a-z_]+)`", paragraph))
    assert named == with_tenant, (
        f"metrics.md's tenants paragraph names {sorted(named)}, the code {sorted(with_tenant)}"
    )


def test_every_label_has_its_bound(registered):
    bounds = bounds_table()
    labels = set().union(*registered.values())
    missing = sorted(labels - set(bounds))
    assert not missing, f"docs/metrics.md 'Label bounds' has no row for {missing}"
    extra = sorted(set(bounds) - labels)
    assert not extra, f"docs/metrics.md 'Label bounds' has rows for labels no family has: {extra}"


def test_the_counts_the_docs_give_are_the_codes():
    n_types, n_routes = len(ERROR_TYPE_LABELS), len(ROUTES)
    metrics = (DOCS / "metrics.md").read_text(encoding="utf-8")
    design = (DOCS / "design.md").read_text(encoding="utf-8")
    assert re.findall(r"or was cancelled: (\d+) values", metrics) == [str(n_types)]
    assert re.findall(r"a fixed set of (\d+) values", design) == [str(n_types)]
    assert f"the fixed set of {n_types} " in bounds_table()["error_type"]
    assert f"the {n_routes} API routes" in bounds_table()["route"]


def test_every_own_otel_instrument_is_documented():
    names = {v for k, v in vars(sc).items() if k.startswith("METRIC_OWN_")}
    assert len(names) == 7
    tracing = (DOCS / "tracing.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(llm_sidecar\.client\.[a-z_.]+)` \|", tracing, re.MULTILINE))
    assert rows == names


def test_every_recording_rule_is_documented():
    """Each record the shipped rules make is named in docs/slo.md, docs/capacity.md or (the
    dashboards' records) docs/dashboards.md (a windowed family by its ``<W>`` pattern)."""
    rules = (ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml").read_text(encoding="utf-8")
    docs = "".join(
        (DOCS / name).read_text(encoding="utf-8")
        for name in ("slo.md", "capacity.md", "dashboards.md")
    )
    records = set(re.findall(r"^\s*- record: (\S+)$", rules, re.MULTILINE))
    assert len(records) > 10
    missing = sorted(
        r for r in records if r not in docs and re.sub(r"rate\d+[mhd]$", "rate<W>", r) not in docs
    )
    assert not missing, (
        f"records named in none of docs/slo.md, capacity.md, dashboards.md: {missing}"
    )


def _values(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def test_the_documented_values_of_the_fixed_labels_are_the_codes():
    """The bounds table's value lists, and the error-type table, against the sets the code
    folds into (a value added on one side only fails)."""
    from sidecar.base.finish_reason import _LABELS as FINISH
    from sidecar.export.metrics import _METHODS, SERIES_REFUSED_FATES
    from sidecar.measure.cache_class import CACHE_CLASSES
    from sidecar.measure.objectives import OBJECTIVES

    bounds = bounds_table()
    assert _values(bounds["finish_reason"]) == {*FINISH.values(), "other"}
    assert _values(bounds["method"]) == {*_METHODS, "other"}
    # unknown (no cached count reported) is a class of the spans, not a series of the page.
    assert _values(bounds["cache"]) == set(CACHE_CLASSES) - {"unknown"}
    assert _values(bounds["objective"]) == {*OBJECTIVES, "met", "missed"}
    assert _values(bounds["fate"]) == set(SERIES_REFUSED_FATES)
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    table = text[text.index("| outcome | error_type | what happened |") :].split("\n\n", 1)[0]
    documented = {_cells(line)[1].strip("`") for line in table.splitlines()[2:]}
    assert documented == set(ERROR_TYPE_LABELS)
