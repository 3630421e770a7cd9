"""Pins every prometheus_client private name :mod:`sidecar.export.prometheus_internals`
reads, on the installed version: an upgrade that renames or reshapes one fails here by name,
and pyproject's upper bound stops at the next minor version nobody has checked."""

from __future__ import annotations

import math
import re
import tomllib
from importlib.metadata import version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.values import MutexValue

from sidecar.export import prometheus_internals as pi
from tests.support.paths import ROOT

PYPROJECT = ROOT / "pyproject.toml"


def test_the_private_names_exist_with_the_shapes_read():
    reg = CollectorRegistry()
    h = Histogram("h_seconds", "h", ["model"], buckets=(0.1, 1.0), registry=reg)
    child = h.labels("m")
    assert (
        type(child._sum) is MutexValue and hasattr(child._sum, "_lock") and child._sum._value == 0.0
    )
    assert list(child._upper_bounds) == [0.1, 1.0, math.inf]
    assert len(child._buckets) == 3 and all(type(b) is MutexValue for b in child._buckets)
    child._raise_if_not_observable()  # a child may observe
    for metric in (
        h,
        Counter("c", "c", ["model"], registry=reg),
        Gauge("g", "g", ["model"], registry=reg),
    ):
        assert metric._labelnames == ("model",) and metric._labelvalues == ()
        assert hasattr(metric._lock, "__enter__") and isinstance(metric._metrics, dict)


def test_the_readers_on_the_installed_version():
    reg = CollectorRegistry()
    c = Counter("c", "c", ["model", "route"], registry=reg)
    c.labels("a", "/x").inc()
    c.labels("a", "/y").inc()
    c.labels("b", "/x").inc()
    assert pi.is_labelled_parent(c) and not pi.is_labelled_parent(c.labels("a", "/x"))
    assert pi.label_names(c) == ("model", "route")
    assert sorted(pi.label_children(c)) == [("a", "/x"), ("a", "/y"), ("b", "/x")]
    assert pi.drop_label_value(c, "model", "a") == 2
    assert pi.label_children(c) == [("b", "/x")]
    h = Histogram("h_seconds", "h", buckets=(0.1, 1.0), registry=reg)
    assert pi.samples_per_child(h) == 5 and pi.samples_per_child(c) == 1  # as served: no _created
    assert pi.samples_per_child(h) == pi.page_samples(pi.WithoutCreated(h).collect())
    one = Histogram("one_seconds", "h", buckets=(0.1, 1.0), registry=reg)
    pi.observe_many(h, [0.05, 0.5, 2.0, 0.1])
    for v in (0.05, 0.5, 2.0, 0.1):
        one.observe(v)

    def samples(m):
        return [
            (s.name.split("_", 1)[1], s.labels, s.value)
            for s in m.collect()[0].samples
            if "created" not in s.name
        ]

    assert samples(h) == samples(one)


def test_the_gate_reads_the_registry_and_makes_children_as_prometheus_client_does():
    reg = CollectorRegistry()
    h = Histogram(
        "h_seconds", "h", ["model", "route"], buckets=(0.1, 1.0), namespace="llm", registry=reg
    )
    assert h in reg._collector_to_names and hasattr(reg._lock, "__enter__")
    assert (h._original_name, h._namespace, h._subsystem, h._unit) == ("h_seconds", "llm", "", "")
    assert h._kwargs == {"buckets": (0.1, 1.0)}
    gate = pi.SeriesGate(reg, 5, reserve=0)
    assert gate.guard() == 1 and gate.count() == 0
    child = h.labels("a", "/x")
    child.observe(0.5)
    assert gate.count() == 5 and h.labels(model="a", route="/x") is child
    lost = h.labels("b", "/x")  # no room: a child on no page
    lost.observe(0.5)
    assert gate.count() == 5 and pi.label_children(h) == [("a", "/x")]
    assert reg.get_sample_value("llm_h_seconds_count", {"model": "a", "route": "/x"}) == 1


def test_pyproject_caps_prometheus_client_at_the_next_unchecked_minor():
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("prometheus-client"))
    cap = re.search(r"<\s*([\d.]+)", spec)
    assert cap, f"no upper bound on prometheus-client: {spec}"
    major, minor, *_ = (int(x) for x in pi.CHECKED_PROMETHEUS_CLIENT.split("."))
    assert cap.group(1) == f"{major}.{minor + 1}", (spec, pi.CHECKED_PROMETHEUS_CLIENT)
    installed = tuple(int(x) for x in version("prometheus-client").split(".")[:2])
    assert installed <= (major, minor), (
        "a newer prometheus-client than checked: re-check the readers and bump"
    )
