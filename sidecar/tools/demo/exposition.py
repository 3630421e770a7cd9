"""The sidecar's ``/metrics`` text -> one :class:`Snapshot`: the series the demo reads,
summed over every label set. Pure: no I/O, tested with hand-written expositions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "HISTOGRAMS",
    "ITL",
    "TPOT",
    "TTFT",
    "BandFigures",
    "Buckets",
    "Snapshot",
    "parse_snapshot",
]

TTFT = "llm_time_to_first_token_seconds"
ITL = "llm_inter_token_latency_seconds"
TPOT = "llm_time_per_output_token_seconds"
HISTOGRAMS = (TTFT, ITL, TPOT)
ITL_BY_BAND = "llm_inter_token_latency_by_concurrency_seconds"
TOKENS_BY_BAND = ITL_BY_BAND + "_count"  # one gap per output token after a stream's first
SECONDS_BY_BAND = "llm_decode_seconds_by_concurrency_total"
TOKEN_SOURCES = "llm_token_count_source_total"

Buckets = tuple[tuple[float, float], ...]
"""Cumulative histogram buckets ``((le, count), ...)`` sorted by ``le``, ending at +Inf."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape of the sidecar's ``/metrics``, summed over every label set."""

    at: float
    """Monotonic seconds when the scrape was taken."""
    requests: float = 0.0
    """``llm_requests_total``, all outcomes."""
    errors: float = 0.0
    """``llm_requests_total{outcome="error"}``."""
    cancelled: float = 0.0
    """``llm_requests_total{outcome="cancelled"}``."""
    in_flight: float = 0.0
    """``llm_requests_in_flight`` (a gauge: the value now, not a delta)."""
    output_tokens: float = 0.0
    """``llm_tokens_total{type="output"}``."""
    histograms: Mapping[str, Buckets] = field(default_factory=dict)
    """Cumulative buckets of each histogram in :data:`HISTOGRAMS`."""
    bands: Mapping[str, BandFigures] = field(default_factory=dict)
    """The throughput-latency curve so far, by decode-concurrency band (docs/capacity.md)."""
    token_sources: Mapping[str, float] = field(default_factory=dict)
    """``llm_token_count_source_total`` by ``source``: where each request's token counts
    came from (``usage``, ``engine``, ``estimated``, ``none``)."""


@dataclass(frozen=True, slots=True)
class BandFigures:
    """One band of the curve, cumulative: ITL buckets, decode tokens and decode seconds."""

    itl: Buckets = ()
    tokens: float = 0.0
    seconds: float = 0.0


def parse_snapshot(text: str, at: float, histograms: Iterable[str] = HISTOGRAMS) -> Snapshot:
    """Prometheus text exposition -> :class:`Snapshot`, summing series across labels.

    Summing buckets across ``model``/``route`` series is what
    ``sum by (le) (rate(x_bucket[w]))`` does; it is valid because every series of one
    histogram shares the same bounds. A metric with no series yet counts as zero.
    """
    wanted = set(histograms)
    requests = errors = cancelled = in_flight = output_tokens = 0.0
    buckets: dict[str, dict[float, float]] = {name: {} for name in wanted}
    band_buckets: dict[str, dict[float, float]] = {}
    band_tokens: dict[str, float] = {}
    band_seconds: dict[str, float] = {}
    sources: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name, labels, value = s.name, s.labels, s.value
            if name == ITL_BY_BAND + "_bucket":
                per_le = band_buckets.setdefault(labels["concurrency"], {})
                le = float(labels["le"])
                per_le[le] = per_le.get(le, 0.0) + value
            elif name == TOKENS_BY_BAND:
                band_tokens[labels["concurrency"]] = (
                    band_tokens.get(labels["concurrency"], 0.0) + value
                )
            elif name == SECONDS_BY_BAND:
                band_seconds[labels["concurrency"]] = (
                    band_seconds.get(labels["concurrency"], 0.0) + value
                )
            elif name == TOKEN_SOURCES:
                sources[labels["source"]] = sources.get(labels["source"], 0.0) + value
            elif name == "llm_requests_total":
                requests += value
                outcome = labels.get("outcome")
                if outcome == "error":
                    errors += value
                elif outcome == "cancelled":
                    cancelled += value
            elif name == "llm_requests_in_flight":
                in_flight += value
            elif name == "llm_tokens_total" and labels.get("type") == "output":
                output_tokens += value
            elif family.name in wanted and name == family.name + "_bucket":
                le = float(labels["le"])
                per_le = buckets[family.name]
                per_le[le] = per_le.get(le, 0.0) + value
    return Snapshot(
        at=at,
        requests=requests,
        errors=errors,
        cancelled=cancelled,
        in_flight=in_flight,
        output_tokens=output_tokens,
        histograms={name: tuple(sorted(b.items())) for name, b in buckets.items()},
        bands={
            band: BandFigures(
                tuple(sorted(per_le.items())),
                band_tokens.get(band, 0.0),
                band_seconds.get(band, 0.0),
            )
            for band, per_le in band_buckets.items()
        },
        token_sources=sources,
    )
