"""Load-conditioned decode metrics: the throughput-latency curve from live traffic.

- ``llm_inter_token_latency_by_concurrency_seconds{model, concurrency}``: every gap that
  ``llm_inter_token_latency_seconds`` observes, again, labelled by the band of this
  sidecar's streams of that model decoding when the gap ended (sidecar/measure/concurrency.py).
  Its counts per model sum to the plain ITL histogram's count, and one gap is one output
  token after a stream's first, so its ``_count`` is also the decode tokens at the band.
- ``llm_decode_seconds_by_concurrency_total``: wall time with at least one stream decoding,
  at the band. Throughput per band = the ITL count / seconds.

Gaps are grouped by band when the request is recorded, so the hot path pays only the
integer read the timeline does per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from prometheus_client import CollectorRegistry, Counter, Histogram

from ..measure.concurrency import BANDS, DecodeTrackers, band
from ..measure.summary import RequestSummary
from .families import CAPACITY_FAMILIES
from .prometheus_internals import (
    Children,
    Count,
    Observed,
    count_of,
    drop_label_value,
    label_children,
    samples_per_child,
)

__all__ = ["CapacityMetrics"]


class BandLabels(TypedDict):
    """The label values of every family here, by name."""

    model: str
    concurrency: str


class CapacityMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        made = {row.attr: row.make(registry, False) for row in CAPACITY_FAMILIES}
        itl, seconds = made["itl"], made["seconds"]
        assert isinstance(itl, Histogram) and isinstance(seconds, Counter), "the table's kinds"
        self.itl, self.seconds = itl, seconds
        self.c_itl: Children[BandLabels, Observed] = Children(self.itl, Observed)
        self._made: dict[str, set[str]] = {}  # model label -> bands whose series exist
        self.trackers = DecodeTrackers(self._sink_for)

    def _sink_for(self, label: str) -> Callable[[str, float], None]:
        """Called once per model label, when a request of it starts. Nothing is made then: a
        label whose requests never decode (a 404 for a model nobody serves, filed under
        ``other``) must not cost a series. The first time a stream of it has decoded (the
        first report of wall time at a band), the three lowest bands' series of both
        metrics are made, at zero, and each band's first use makes the band above it
        (:meth:`_ahead`).

        Why at zero and ahead of the load: a series that appeared only with its first
        observations would enter Prometheus already holding them, and ``rate``/``increase``
        never count a series' first sample, so the capacity rules' 1h window would lose a
        band's first requests (enough to flip a band's p95 verdict: docs/performance.md,
        "Figures behind the code"). The
        decoding count moves one stream at a time, and a band's first report comes when
        the load leaves the band's lowest count, so the band above is made at least one
        stream before the load can reach it (band 8 when the load leaves 3 streams, entered
        at 5; band 16 when it leaves 5, entered at 9); bands 2 and 4, a count or two away from the first
        stream, are made with band 1. Only the model's first stream lands in series made as
        it ends. Two bands ahead would add a band of every model that never reaches it."""
        made = self._made.setdefault(label, set())
        seconds: dict[str, Count] = {}

        def sink(b: str, elapsed: float) -> None:
            child = seconds[b] if b in seconds else None
            if child is None:
                if not made:
                    self._ahead(label, BANDS[0], made, above=2)
                self._ahead(label, b, made)
                child = seconds[b] = count_of(self.seconds.labels(label, b))
            child.add(elapsed)  # elapsed > 0: DecodeConcurrency reports no other

        return sink

    def _ahead(self, label: str, b: str, made: set[str], above: int = 1) -> None:
        """Band ``b`` of ``label`` and the ``above`` bands above it exist, at zero where new."""
        at = BANDS.index(b)
        for ahead in BANDS[at : at + 1 + above]:
            if ahead not in made:
                made.add(ahead)
                self.itl.labels(label, ahead)
                self.seconds.labels(label, ahead)

    def series_count(self) -> int:
        """Samples these metrics expose now (without ``_created``): each model label brings
        the bands it reached and the two above, of each."""
        return sum(len(label_children(m)) * samples_per_child(m) for m in (self.itl, self.seconds))

    def forget(self, label: str) -> int:
        """An idle model label gave its slot back (sidecar/base/labels.py): drop its series
        of both metrics and its tracker, so a label that comes back starts afresh (and
        its series are made again when it next decodes). Without this, every model ever
        labelled kept its 9 bands of series for good. Returns the series removed."""
        self.trackers.forget(label)
        self._made.pop(label, None)
        self.c_itl.forget("model", label)
        return sum(drop_label_value(m, "model", label) for m in (self.itl, self.seconds))

    def record(self, t: RequestSummary) -> None:
        """Observe one finished request's gaps by band (a recorder, called once)."""
        gaps, streams = t.gaps, t.gap_streams
        if not gaps or len(gaps) != len(streams):
            return
        model_label = t.model_label
        runs = t.gap_runs
        lowest, highest = band(min(streams)), band(max(streams))
        made = self._made.get(model_label)
        if made is not None and (lowest not in made or highest not in made):
            # the bands it reached, and the band above each, exist from now
            for b in {lowest, highest} - made:
                self._ahead(model_label, b, made)
        if lowest == highest:
            # The usual case: the load stayed within one band for the whole stream (bands are
            # ranges of n, so the extremes tell), and the gaps go in as one batch, without a
            # Python step per gap.
            labels: BandLabels = {"model": model_label, "concurrency": lowest}
            key = (model_label, lowest)
            itl = self.c_itl.memo.get(key) or self.c_itl.remember(key, labels)
            itl.observe_many(gaps)
            for index, count in runs:
                itl.observe_repeated(gaps[index], count - 1)
            return
        by_band: dict[str, list[float]] = {}
        for gap, n in zip(gaps, streams, strict=True):
            b = band(n)
            values = by_band.get(b)
            if values is None:
                by_band[b] = [gap]
            else:
                values.append(gap)
        for b, values in by_band.items():
            labels = {"model": model_label, "concurrency": b}
            self.c_itl.get(labels).observe_many(values)
        for index, count in runs:  # k tokens of one event: the surplus of their one entry
            labels = {"model": model_label, "concurrency": band(streams[index])}
            self.c_itl.get(labels).observe_repeated(gaps[index], count - 1)
