"""The one series budget: every family counted before a series is made, a series
that does not fit recorded under ``other`` or not at all, the in-flight gauge balanced on the
row it started on, the page served without ``_created``, and the listing's bodies decoded
within their bound (sidecar/export/prometheus_internals.py, sidecar/relay/control/model_discovery.py)."""

from __future__ import annotations

import gzip
import zlib

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import generate_latest

from sidecar.app import build_sidecar
from sidecar.config import Settings
from sidecar.export.otel_setup import providers_from_env
from sidecar.export.prometheus_internals import SeriesGate, WithoutCreated
from sidecar.relay.control.model_discovery import MAX_LISTING_BYTES, decoded_listing
from tests.support.exposition import count_series

CHAT = "/v1/chat/completions"


def page_count(registry) -> int:
    return count_series(generate_latest(WithoutCreated(registry)))


def test_the_count_is_the_page_every_family_and_collector_alike():
    reg = CollectorRegistry()
    c = Counter("c", "c", ["model", "route"], registry=reg)
    h = Histogram("h_seconds", "h", ["model"], buckets=(0.1, 1.0), registry=reg)
    Gauge("g", "g", registry=reg).set(1)
    ProcessCollector(registry=reg)
    gate = SeriesGate(reg, 10_000)
    gate.guard()
    for i in range(5):
        c.labels(f"m{i}", CHAT).inc()
        h.labels(f"m{i}").observe(0.5)
    assert gate.count() == page_count(reg)
    assert b"_created" not in generate_latest(WithoutCreated(reg))
    assert b"c_created" in generate_latest(reg)  # the registry itself is unchanged


def test_a_series_past_the_budget_goes_to_other_then_nowhere_and_is_counted():
    reg = CollectorRegistry()
    fates: list[str] = []
    c = Counter("c", "c", ["model", "route", "tenant"], registry=reg)
    plain = Counter("p", "p", ["route"], registry=reg)
    gate = SeriesGate(reg, 6, reserve=2, on_refused=fates.append)
    gate.guard()
    for i in range(4):  # valued series may take 6 - 2
        c.labels(f"m{i}", CHAT, "t").inc()
    assert fates == [] and gate.count() == 4
    c.labels("m9", CHAT, "t").inc()  # past the line: the other row (model and tenant folded)
    c.labels("m8", CHAT, "u").inc()  # the same other row, which exists now
    assert fates == ["other", "other"]
    assert (
        reg.get_sample_value("c_total", {"model": "other", "route": CHAT, "tenant": "other"}) == 2
    )
    plain.labels("/a").inc()  # a family without model or tenant may use the reserve
    assert gate.count() == 6
    plain.labels("/b").inc()  # full: nothing to fold, recorded nowhere
    c.labels("m7", "/v1/completions", "t").inc()  # its other row does not fit either
    assert fates == ["other", "other", "dropped", "dropped"]
    assert gate.count() == page_count(reg) == 6
    assert c.labels("m0", CHAT, "t") is c.labels("m0", CHAT, "t")  # existing series: as before


def test_a_sidecar_page_never_passes_max_series_and_in_flight_ends_on_its_own_row():
    reg = CollectorRegistry()
    sc = build_sidecar(
        Settings(upstream="http://127.0.0.1:9", max_series=600), reg, access_log=False
    )
    metrics = sc.metrics

    def in_flight() -> dict[str, float]:
        return {
            s.labels["model"]: s.value
            for f in reg.collect()
            if f.name == "llm_requests_in_flight"
            for s in f.samples
        }

    for i in range(80):  # fill the page
        metrics.duration.labels(f"m{i}", "ok").observe(0.1)
    assert page_count(reg) <= 600
    metrics.started("late", CHAT)  # no room for its row: it counts under other
    assert in_flight() == {"other": 1}
    for idle in ("m0", "m1"):  # room again (idle labels gave their series back)
        metrics.forget("model", idle)
    metrics.started("late", CHAT)  # a second request gets the row of its own
    assert in_flight() == {"other": 1, "late": 1}
    metrics.ended("late", CHAT)
    metrics.ended("late", CHAT)
    assert in_flight() == {"other": 0, "late": 0}  # each ended on the row it started on: never -1
    assert reg.get_sample_value("llm_series_refused_total", {"fate": "other"}) >= 1
    assert page_count(reg) <= 600


def test_the_metrics_page_and_its_name_filter_have_no_created_samples():
    reg = CollectorRegistry()
    sc = build_sidecar(Settings(upstream="http://127.0.0.1:9"), reg, access_log=False)
    sc.metrics.requests.labels("m", CHAT, "200", "ok", "none").inc()
    whole = generate_latest(sc.renderer._registry)
    some = generate_latest(sc.renderer._registry.restricted_registry(["llm_requests_total"]))
    assert b"llm_requests_total{" in whole and b"llm_requests_total{" in some
    assert b"_created" not in whole + some


def test_listing_bodies_are_decoded_within_the_bound():
    doc = b'{"data": [{"id": "m"}]}'
    assert decoded_listing(doc, "") == doc
    assert decoded_listing(doc, "identity") == doc
    assert decoded_listing(gzip.compress(doc), "gzip") == doc
    assert decoded_listing(gzip.compress(doc), "x-gzip") == doc
    assert decoded_listing(zlib.compress(doc), "deflate") == doc
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert (
        decoded_listing(raw.compress(doc) + raw.flush(), "deflate") == doc
    )  # as many servers send it
    assert decoded_listing(gzip.compress(gzip.compress(doc)), "gzip, gzip") == doc
    assert decoded_listing(doc, "br") is None  # not understood: not taken
    assert decoded_listing(gzip.compress(doc)[:-6], "gzip") is None  # truncated
    bomb = gzip.compress(b" " * (MAX_LISTING_BYTES + 1))
    assert (
        len(bomb) < 10_000 and decoded_listing(bomb, "gzip") is None
    )  # never expanded past the bound


@pytest.mark.parametrize("otlp", [False, True], ids=["otlp-off", "otlp-on"])
def test_every_labelled_family_of_a_built_sidecar_is_gated(otlp, monkeypatch):
    """Whoever adds a family (in SidecarMetrics, CapacityMetrics or after them), it counts
    against the budget before its series exist: a family registered after the gate's
    guard() in build_sidecar would fail here. With OTLP on (built as ``serve`` builds it),
    ``llm_sidecar_otlp_export_failures_total`` too, which is registered with the exporters."""
    from sidecar.export.prometheus_internals import MetricWrapperBase, is_labelled_parent

    at_guard: list[set] = []
    guard = SeriesGate.guard

    def spy(gate):
        at_guard.append(set(gate._collectors()))
        return guard(gate)

    monkeypatch.setattr(SeriesGate, "guard", spy)
    providers = None
    if otlp:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        providers = providers_from_env(metrics=True, environ=env)
        assert providers.tracer_provider is not None and providers.meter_provider is not None
    reg = CollectorRegistry()
    try:
        build_sidecar(
            Settings(upstream="http://127.0.0.1:9", tenant_header="X-Tenant", otel_metrics=otlp),
            reg,
            access_log=False,
            providers=providers,
        )
    finally:
        if providers is not None:
            providers.shutdown(timeout=0.1)
    families = {family.name for family in reg.collect()}
    assert ("llm_sidecar_otlp_export_failures" in families) is otlp
    assert len(at_guard) == 1
    late = [[f.name for f in c.collect()] for c in reg._collector_to_names if c not in at_guard[0]]
    assert not late, late  # every family exists before the gate is set up
    labelled = [
        c
        for c in reg._collector_to_names
        if isinstance(c, MetricWrapperBase) and is_labelled_parent(c)
    ]
    assert len(labelled) > 20
    ungated = [c._name for c in labelled if "labels" not in vars(c)]
    assert not ungated, ungated
