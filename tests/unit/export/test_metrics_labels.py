"""Label values by name, each family's children resolved once, and observed as the library
would: the request families' label names are held to the family table (here and by the
type checker), a label set's child is made once and kept, a removal drops what was kept, and
the cells (sidecar/export/prometheus_internals.py, ``Count`` and ``Observed``) leave the page
exactly as ``inc`` and ``observe`` do."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sidecar.app import build_sidecar
from sidecar.base.buckets import TTFT_BUCKETS
from sidecar.config import Settings
from sidecar.export.capacity import BandLabels, CapacityMetrics
from sidecar.export.families import EVERY_FAMILY, FAMILIES, NAMESPACE, OWN_FAMILIES, family_row
from sidecar.export.in_flight import IN_PHASE, OLDEST, STALLED
from sidecar.export.metrics import LABELS, SidecarMetrics
from sidecar.export.otlp_health import ExportFailuresCollector
from sidecar.export.prometheus_internals import Children, Observed, count_of, label_names
from sidecar.measure.summary import summarize
from tests.support.paths import ROOT
from tests.support.timelines import ROUTE, streamed


def test_every_familys_labels_by_name_are_the_tables():
    assert set(LABELS) == {f.attr for f in FAMILIES}
    for family in FAMILIES:
        named = tuple(LABELS[family.attr].__annotations__)
        assert named == family.labels + (("tenant",) if family.tenant else ()), family.attr


@pytest.mark.parametrize("tenants", [False, True])
def test_every_family_is_resolved_by_name_in_its_own_label_order(tenants):
    metrics = SidecarMetrics(CollectorRegistry(), tenants=tenants)
    for family in FAMILIES:
        children = getattr(metrics, f"c_{family.attr}", None)
        if family.attr in ("overhead", "series_refused"):
            continue  # their few children are made when the metrics are
        assert isinstance(children, Children), family.attr
        assert children.family is getattr(metrics, family.attr)
        assert children.names == family.label_names(tenants)


def test_the_capacity_families_labels_by_name():
    capacity = CapacityMetrics(CollectorRegistry())
    for metric in (capacity.itl, capacity.seconds):
        assert label_names(metric) == tuple(BandLabels.__annotations__)


def test_a_misspelt_label_fails_the_type_checker(tmp_path):
    snippet = tmp_path / "misspelt.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from prometheus_client import CollectorRegistry
            from sidecar.export.metrics import SidecarMetrics

            m = SidecarMetrics(CollectorRegistry())
            m.c_duration.get({"model": "m", "outcome": "ok"}).observe(1.0)
            m.c_duration.get({"model": "m", "outcom": "ok"}).observe(1.0)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", str(snippet)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert errors and all("misspelt.py:7:" in line for line in errors), done.stdout
    assert any('"outcom"' in line for line in errors)


def test_a_label_sets_child_is_made_once():
    registry = CollectorRegistry()
    family = Counter("made", "doc", ("a", "b"), registry=registry)
    made: list[tuple[str, ...]] = []
    own = family.labels

    def labels(*values: str):
        made.append(values)
        return own(*values)

    family.labels = labels  # type: ignore[method-assign]
    children: Children[dict[str, str], object] = Children(family, count_of)  # type: ignore[type-var]
    for _ in range(3):
        children.get({"b": "y", "a": "x"}).add(2)
    assert made == [("x", "y")]
    assert registry.get_sample_value("made_total", {"a": "x", "b": "y"}) == 6


def test_a_forgotten_value_gets_a_new_series_and_loses_no_count():
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    labels = {"model": "m", "route": ROUTE, "code": "200", "outcome": "ok", "error_type": "none"}
    metrics.record(summarize(streamed([100.2, 100.3]), "m"))
    assert registry.get_sample_value("llm_requests_total", labels) == 1
    assert metrics.forget("model", "m") > 0
    assert registry.get_sample_value("llm_requests_total", labels) is None
    metrics.record(summarize(streamed([100.2, 100.3]), "m"))
    assert registry.get_sample_value("llm_requests_total", labels) == 1
    assert registry.get_sample_value("llm_inter_token_latency_seconds_count", {"model": "m"}) == 1


VALUES = [0.0, 0.05, 0.05, 0.1, 0.3, 2.0, 29.0, 1e9, math.inf, -1.0, math.nan, 0.25]


def _page(registry: CollectorRegistry) -> bytes:
    return b"\n".join(
        line for line in generate_latest(registry).splitlines() if b"_created" not in line
    )


def test_cells_leave_the_page_as_inc_and_observe_do():
    pages = []
    for through_cells in (False, True):
        registry = CollectorRegistry()
        hist = Histogram("h", "doc", ("m",), buckets=TTFT_BUCKETS, registry=registry)
        count = Counter("c", "doc", ("m",), registry=registry)
        gauge = Gauge("g", "doc", ("m",), registry=registry)
        for i, value in enumerate(VALUES):
            exemplar = {"trace_id": "abc"} if i == 3 else None
            if through_cells:
                Observed(hist.labels("x")).observe(value, exemplar)
                count_of(count.labels("x")).add(i)
                count_of(gauge.labels("x")).add(1 if i % 3 else -1)
            else:
                hist.labels("x").observe(value, exemplar)
                count.labels("x").inc(i)
                gauge.labels("x").inc(1 if i % 3 else -1)
        pages.append(_page(registry))
    assert pages[0] == pages[1]
    assert b'h_bucket{le="+Inf",m="x"} 11.0' in pages[1]  # NaN is in no bucket


def test_every_family_on_the_page_is_a_row_of_the_table():
    """The request figures, the sidecar's own health, the OTLP exports' health and the
    capacity view: each family on the page is made from its row (the live view's gauges,
    read at scrape time, and client_python's process_* aside)."""
    registry = CollectorRegistry()
    build_sidecar(Settings(upstream="http://127.0.0.1:9"), registry, access_log=False)
    rows = {f"{NAMESPACE}_{row.name}": row for row in EVERY_FAMILY}
    assert len(rows) == len(EVERY_FAMILY)
    (otlp,) = ExportFailuresCollector([]).collect()
    on_page = [*registry.collect(), otlp]
    seen = set()
    for metric in on_page:
        if metric.name.startswith("process_") or metric.name in (IN_PHASE, OLDEST, STALLED):
            continue
        row = rows[metric.name]
        assert (metric.type, metric.documentation) == (row.kind, row.help), metric.name
        seen.add(metric.name)
    workers = {f"{NAMESPACE}_{family_row(OWN_FAMILIES, a).name}" for a in ("restarts", "running")}
    assert seen | workers == set(rows)  # the workers' two are on the supervisor's page


def test_a_remembered_key_must_carry_every_label_value_in_order():
    registry = CollectorRegistry()
    family = Counter("keyed", "doc", ("a", "b"), registry=registry)
    children: Children[dict[str, str], object] = Children(family, count_of)  # type: ignore[type-var]
    with pytest.raises(ValueError):
        children.remember(("x",), {"a": "x", "b": "y"})  # "y" left out: two label sets alias
    with pytest.raises(ValueError):
        children.remember(("y", "x"), {"a": "x", "b": "y"})
    cell = children.remember(("x", "y"), {"a": "x", "b": "y"})
    assert children.memo[("x", "y")] is cell
    children.forget("a", "other")
    assert not children.memo  # a removal drops every remembered cell
