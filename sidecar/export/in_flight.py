"""The requests in flight, seen while they run: a Prometheus collector read at scrape time.

Every other family is observed when a request ends, so an engine that hangs (its API still
answers ``/health``, no token comes and no request ends) stays invisible to them until
``--read-timeout`` turns each stuck stream into an error. This view reads the records the
relay holds open (``RecordBook.open_records``) when the page is rendered, and costs the relay
nothing per token: each record already keeps its times, and the upstream connection the time
of its last read.

Each request is in one phase:

- ``head``: its response head has not come (the upstream is queueing or prefilling a
  request that will answer whole, or has not answered a stream yet);
- ``first_token``: a streamed response's head came, its first token has not;
- ``decode``: the tokens are coming (or a whole response's body is being relayed).

Families (``model``: the label the request started under, ``route``, ``phase``), present only
for the combinations that have a request in flight, so an idle pod exports none of them:

- ``llm_requests_in_phase``: how many;
- ``llm_requests_in_phase_oldest_seconds``: the oldest one's age (since its head came in);
- ``llm_streams_stalled``: streams the upstream has sent nothing for at least
  ``--stall-seconds``, only for the combinations with such a stream (absent, not 0, while
  every stream moves: the alert and panels read a missing series as none). A stream is a
  streamed response, or a request that asked to stream (``"stream": true``) whose head has
  not come; a request answered whole is never stalled, however long it takes, nor one whose
  client stopped reading (the upstream is paused then, on the client's account).

The page is rendered in a worker thread (sidecar/export/scrape.py): the set of records is
copied in one call and each record's fields are read as they are, never written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import structlog
from prometheus_client import Metric
from prometheus_client.core import GaugeMetricFamily

from ..measure.record import RecordBook, RequestRecord
from .families import NAMESPACE

__all__ = [
    "PHASES",
    "IN_PHASE",
    "OLDEST",
    "STALLED",
    "LABELS",
    "InFlightView",
    "Snapshot",
    "StallWatch",
    "phase_of",
    "silence_of",
    "stall_probe",
]

PHASES = ("head", "first_token", "decode")
"""The phases of a request in flight, in order (the module doc)."""

IN_PHASE = f"{NAMESPACE}_requests_in_phase"
OLDEST = f"{NAMESPACE}_requests_in_phase_oldest_seconds"
STALLED = f"{NAMESPACE}_streams_stalled"
LABELS = ("model", "route", "phase")
"""The gauges' labels (each series carries all three)."""

_Key = tuple[str, str, str]
_log = structlog.get_logger("sidecar.in_flight")


def phase_of(record: RequestRecord) -> str:
    """The phase a request is in now (the module doc)."""
    timeline = record.timeline
    if timeline.first_byte is None:
        return "head"
    if timeline.streamed and timeline.first_token is None:
        return "first_token"
    return "decode"


def silence_of(record: RequestRecord, now: float) -> float | None:
    """Seconds the upstream has sent nothing for this request, ``now`` on the records'
    clock; None when the request is no stream (answered whole) or not sent upstream yet
    (the wait is the client's: its body is still coming)."""
    timeline = record.timeline
    if timeline.first_byte is None:
        if timeline.request_stream is not True or timeline.upstream_sent is None:
            return None
        return max(0.0, now - timeline.upstream_sent)
    if not timeline.streamed:
        return None
    upstream = record.upstream
    if upstream is not None:
        return upstream.silent_seconds()
    last = timeline.last_token or timeline.first_byte
    return max(0.0, now - last)


@dataclass(slots=True)
class Snapshot:
    """The requests in flight at one moment, per (model, route, phase)."""

    counts: dict[_Key, int] = field(default_factory=dict)
    oldest: dict[_Key, float] = field(default_factory=dict)
    stalled: dict[_Key, int] = field(default_factory=dict)
    stalled_records: list[tuple[RequestRecord, float, str]] = field(default_factory=list)
    """Each stalled stream, its silence (seconds) and phase."""
    now: float = 0.0
    """When it was taken, on the records' clock."""
    in_flight: int = 0
    least_silence: float | None = None
    """The shortest silence among the requests in flight that have one: how recently the
    upstream sent anything for any of them (None when none has one)."""
    longest_silence: float = 0.0

    @property
    def stalled_total(self) -> int:
        return len(self.stalled_records)


class InFlightView:
    """A Prometheus collector (``registry.register(view)``) over ``book``'s open records;
    :meth:`snapshot` is also what the stall probe and the OTel gauge read.
    ``stall_seconds``: the silence after which a stream counts as stalled."""

    def __init__(
        self,
        book: RecordBook,
        stall_seconds: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if stall_seconds <= 0:
            raise ValueError(f"stall_seconds must be positive, got {stall_seconds!r}")
        self.book = book
        self.stall_seconds = stall_seconds
        self._clock = clock if clock is not None else book.clock

    def snapshot(self, stall_seconds: float | None = None) -> Snapshot:
        """Every open record read once; ``stall_seconds`` (default the view's) is the
        silence that counts as stalled."""
        threshold = self.stall_seconds if stall_seconds is None else stall_seconds
        records = list(self.book.open_records)  # one C-level copy: safe from another thread
        now = self._clock()
        out = Snapshot(now=now)
        counts, oldest, stalled = out.counts, out.oldest, out.stalled
        for record in records:
            if record.closed:
                continue
            out.in_flight += 1
            phase = phase_of(record)
            key = (record.label, record.route, phase)
            counts[key] = counts.get(key, 0) + 1
            age = max(0.0, now - record.timeline.start)
            if age > oldest.get(key, -1.0):
                oldest[key] = age
            silence = silence_of(record, now)
            stalled.setdefault(key, 0)
            if silence is None:
                continue
            if out.least_silence is None or silence < out.least_silence:
                out.least_silence = silence
            out.longest_silence = max(out.longest_silence, silence)
            if silence >= threshold:
                stalled[key] += 1
                out.stalled_records.append((record, silence, phase))
        return out

    # -- the Prometheus collector ------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        """The families' names, so a ``name[]`` scrape and the registry's duplicate check
        know them without a snapshot."""
        return list(_families())

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot()
        in_phase, oldest, stalled = _families()
        for key in sorted(snap.counts):
            labels = list(key)
            in_phase.add_metric(labels, snap.counts[key])
            oldest.add_metric(labels, round(snap.oldest[key], 3))
            if snap.stalled[key]:  # a fleet's streams nearly always move: no series at 0
                stalled.add_metric(labels, snap.stalled[key])
        return [in_phase, oldest, stalled]


def _families() -> Iterator[GaugeMetricFamily]:
    yield GaugeMetricFamily(
        IN_PHASE,
        "Requests in flight by phase: waiting for the response head, for the first token, "
        "or decoding (read at scrape time; absent when none).",
        labels=LABELS,
    )
    yield GaugeMetricFamily(
        OLDEST,
        "Age of the oldest request in flight in each phase, seconds since its head came in "
        "(read at scrape time).",
        labels=LABELS,
    )
    yield GaugeMetricFamily(
        STALLED,
        "Streams in flight the upstream has sent no byte for at least --stall-seconds "
        "(read at scrape time; a hung engine's streams).",
        labels=LABELS,
    )


def stall_probe(view: InFlightView, probe_seconds: float) -> tuple[bool, dict[str, object]]:
    """The verdict of ``/stallz``, a liveness probe of the model server: (healthy, what it
    saw). Unhealthy only when all of these hold, so a restart is never the answer to load:

    - requests are in flight (an idle engine is never restarted);
    - at least one stream has had no byte for ``probe_seconds``;
    - no request in flight had a byte in that time (a busy engine moves some of them);
    - no request was answered whole in that time (``RecordBook.last_completed``).
    """
    snap = view.snapshot(probe_seconds)
    now = view.book.clock()
    last = view.book.last_completed
    since_completed = None if last is None else max(0.0, now - last)
    doc: dict[str, object] = {
        "in_flight": snap.in_flight,
        "stalled": snap.stalled_total,
        "stall_seconds": probe_seconds,
        "longest_silence_seconds": round(snap.longest_silence, 3),
        "seconds_since_completed": None if since_completed is None else round(since_completed, 3),
    }
    hung = (
        snap.in_flight > 0
        and snap.stalled_total > 0
        and snap.least_silence is not None
        and snap.least_silence >= probe_seconds
        and (since_completed is None or since_completed >= probe_seconds)
    )
    doc["stalled_engine"] = hung
    return not hung, doc


class StallWatch:
    """Tells ``on_stall(record, since, phase)`` once about each stream that stalls (``since``:
    its last byte, on the records' clock), from a timer on the event loop (:meth:`run`, every
    ``every`` seconds: a quarter of the threshold, at most 5 s), so a span can mark where the
    stream stopped while it is still open. Its cost is one read of the open records per tick,
    nothing per token."""

    def __init__(
        self,
        view: InFlightView,
        on_stall: Callable[[RequestRecord, float, str], None],
        every: float | None = None,
    ) -> None:
        self.view = view
        self.on_stall = on_stall
        self.every = every if every is not None else min(5.0, view.stall_seconds / 4)

    def check(self) -> int:
        """One look: how many streams stalled since the last."""
        snap = self.view.snapshot()
        told = 0
        for record, silence, phase in snap.stalled_records:
            if record.stall_noted:
                continue
            record.stall_noted = True
            told += 1
            # The last byte, read on the connection a moment before the timeline noted what it
            # carried: never before what the timeline noted, so the events keep their order.
            t = record.timeline
            noted = (t.last_token, t.first_byte, t.upstream_sent)
            since = max([snap.now - silence, *(x for x in noted if x is not None)])
            try:
                self.on_stall(record, since, phase)
            except Exception:  # telemetry never breaks the relay
                _log.exception("stall_note_failed")
        return told

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                self.check()
            except Exception:
                _log.exception("stall_watch_failed")
