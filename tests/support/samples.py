"""A sidecar's Prometheus samples, read the way a test needs them: from a ``/metrics`` text
page, or summed by outcome from a registry."""

from __future__ import annotations

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
