"""A sidecar's samples, read the way a test needs them: Prometheus samples from a ``/metrics``
text page or a registry (summed over the labels a test is not about), and OTel metric points
from an in-memory reader."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

CHAT = "/v1/chat/completions"


def sample_of(text: str, name: str, **labels) -> float | None:
    """A sample's value from a Prometheus text exposition (a ``/metrics`` page), or None."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def outcome_counts(registry, route: str = CHAT) -> dict[str, float]:
    """``llm_requests_total`` of ``route`` summed by outcome."""
    counts: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "llm_requests_total" and sample.labels.get("route") == route:
                outcome = sample.labels["outcome"]
                counts[outcome] = counts.get(outcome, 0) + sample.value
    return counts


def per_model(labels: dict[str, str]) -> dict[str, str]:
    """A counter's labels as a distribution's: histograms are per model, without ``route``."""
    return {k: v for k, v in labels.items() if k != "route"}


def sample_value(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    """``registry.get_sample_value``, except that ``llm_requests_total`` asked without an
    ``error_type`` is summed over its error types (None when no series matches): tests that
    are not about why a request failed need not spell it out."""
    if name != "llm_requests_total" or "error_type" in labels:
        return registry.get_sample_value(name, labels)
    values = [
        s.value
        for family in registry.collect()
        if family.name == "llm_requests"
        for s in family.samples
        if s.name == name and {k: v for k, v in s.labels.items() if k != "error_type"} == labels
    ]
    return sum(values) if values else None


def in_flight_total(registry: CollectorRegistry) -> float:
    """``llm_requests_in_flight`` summed over its label sets: a request counts in flight under
    the label it started with, which for a model not yet vouched for is ``other``."""
    return sum(
        sample.value
        for family in registry.collect()
        if family.name == "llm_requests_in_flight"
        for sample in family.samples
    )


def metric_points(reader) -> dict[str, list]:
    """An in-memory OTel metric reader's data points by instrument name (every resource and scope)."""
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out
