"""Every part build_sidecar wires is complete when its constructor returns: no hook,
name or budget is set on a label after it is built, no count is swapped into the series budget
later, and a Sidecar has its drain and both apps as it is made."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.app import SIDECAR, Sidecar, build_sidecar
from sidecar.base.labels import BoundedLabel, SeriesBudget
from sidecar.config import Settings

CHAT = "/v1/chat/completions"
WIRING = {
    BoundedLabel: {"on_overflow", "on_forget", "budget", "name"},
    SeriesBudget: {"max_series", "count", "cost", "reserve"},
}


@pytest.fixture
def refuse_late_wiring(monkeypatch):
    """Each part's wiring may be written by its own ``__init__`` only: a write after that
    raises (the ModelLabeler subclass and the tenant's BoundedLabel alike)."""
    built: set[int] = set()
    for cls, names in WIRING.items():
        init = cls.__init__

        def guarded_init(self, *args, _init=init, **kwargs):
            _init(self, *args, **kwargs)
            built.add(id(self))

        def guarded_setattr(self, name, value, _names=names):
            if id(self) in built and name in _names:
                raise AttributeError(f"{type(self).__name__}.{name} set after it was built")
            object.__setattr__(self, name, value)

        monkeypatch.setattr(cls, "__init__", guarded_init)
        monkeypatch.setattr(cls, "__setattr__", guarded_setattr)


def series(registry: CollectorRegistry, label: str, value: str) -> int:
    return sum(1 for f in registry.collect() for s in f.samples if s.labels.get(label) == value)


def test_the_labels_come_wired_and_report_to_the_page(refuse_late_wiring):
    registry = CollectorRegistry()
    sc = build_sidecar(
        Settings(
            upstream="http://127.0.0.1:9", tenant_header="X-Tenant", max_models=1, max_tenants=1
        ),
        registry,
        access_log=False,
    )
    models, tenants, metrics = sc.metrics.model_label, sc.tenants, sc.metrics
    assert tenants is not None and tenants.bound.name == "tenant" and models.name == "model"
    budget = metrics.budget
    assert (
        budget is not None and models.budget is budget and tenants.bound.budget is budget
    )  # one budget
    assert (
        metrics.gate is not None and budget.count() == metrics.gate.count()
    )  # the page as the gate counts it
    assert budget.fits("model") and budget.fits("tenant")

    assert models.settle("a", 200) == "a"
    metrics.requests.labels("a", CHAT, "200", "ok", "none", "unknown").inc()
    metrics.requests.labels("other", CHAT, "200", "ok", "none", "t1").inc()
    sc.capacity.trackers("a")  # its capacity bands
    assert models.settle("b", 200) == "other"  # max_models=1
    assert (
        registry.get_sample_value(
            "llm_label_overflow_total", {"label": "model", "reason": "max_values"}
        )
        == 1
    )
    assert tenants.settle({"X-Tenant": "t1"}, 200) == "t1"
    assert tenants.settle({"X-Tenant": "t2"}, 200) == "other"
    assert (
        registry.get_sample_value(
            "llm_label_overflow_total", {"label": "tenant", "reason": "max_values"}
        )
        == 1
    )

    assert series(registry, "model", "a") > 1  # requests and capacity
    models.vouch(["x"])  # the server lists another name: "a" has no room left and goes
    assert series(registry, "model", "a") == 0  # from SidecarMetrics and CapacityMetrics alike
    assert series(registry, "tenant", "t1") > 0
    tenants.bound.vouch(["t3"])
    assert series(registry, "tenant", "t1") == 0


def test_a_sidecar_has_its_drain_and_apps_when_made():
    built = build_sidecar(
        Settings(upstream="http://127.0.0.1:9"), CollectorRegistry(), access_log=False
    )
    sc = Sidecar(built.settings, built.registry, built.metrics, built.proxy, built.renderer)
    assert sc.admin_app[SIDECAR] is sc and sc.proxy.drain is sc.drain
    assert not sc.draining
    assert sc.admin_app is not built.admin_app  # its own app, not the other Sidecar's
