"""Every request's record, opened one way and given its verdict one way, by the exchange that
answers it (sidecar/relay/data/exchange.py).

:meth:`RecordBook.open` makes the timeline with what the request says, holds its labels
(the in-flight gauge, the tenant) and starts its span (tracing on); :meth:`RecordBook.observe`
reads the response as it is relayed; :meth:`RecordBook.close` gives the verdict once: the
labels released, the timeline finished, the labels settled and the record handed to every
recorder. Nothing here raises into the relay: a failing labeler, tracer or recorder is
logged and the request goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Protocol

import structlog
from multidict import CIMultiDict

from ..base.outcomes import Outcome, Verdict
from ..base.routes import Route
from .concurrency import DecodeConcurrency
from .objectives import ObjectiveDefaults, read_objectives
from .observe import ResponseObserver
from .request_fields import RequestFields
from .summary import NO_DEFAULTS, RequestSummary, summarize
from .timeline import RequestTimeline

__all__ = [
    "RecordBook",
    "RequestRecord",
    "Recorder",
    "RequestTracer",
    "ModelLabels",
    "TenantLabels",
    "UpstreamSilence",
]

_log = structlog.get_logger("sidecar.proxy")

Recorder = Callable[[RequestSummary], None]
"""Called once per finished request with its summary (sidecar/measure/summary.py)."""


class RequestTracer(Protocol):
    """What a record needs from tracing (see :mod:`sidecar.export.spans`)."""

    def start(self, headers: Mapping[str, str], timeline: RequestTimeline) -> None:
        """Begin the request's span in the client's trace; set ``timeline.trace``/``trace_id``."""

    def inject(self, timeline: RequestTimeline, headers: MutableMapping[str, str]) -> None:
        """Add trace-context headers for the upstream request."""


class ModelLabels(Protocol):
    """The model label (sidecar/base/labels.py, ``ModelLabeler``): one at the start, which a
    request the upstream answered may settle into its own label at the end."""

    def __call__(self, value: str | None, /) -> str: ...

    def settle(self, value: str | None, status: int | None, /) -> str: ...


class TenantLabels(Protocol):
    """The tenant label (sidecar/base/tenant.py, ``TenantLabeler``), read from the header
    fields and held from a request's start to its end."""

    def __call__(self, headers: Mapping[str, str], /) -> str: ...

    def settle(self, headers: Mapping[str, str], status: int | None, /) -> str: ...

    def hold(self, label: str, /) -> None: ...

    def release(self, label: str, /) -> None: ...


class InFlightLedger(Protocol):
    """Where a pod's worker keeps its requests in flight for its supervisor to read if it
    dies (sidecar/fleet/ledger.py), by the labels the in-flight gauge moves under."""

    def opened(self, model: str, route: str, tenant: str, /) -> None: ...

    def closed(self, model: str, route: str, tenant: str, /) -> None: ...


class UpstreamSilence(Protocol):
    """The upstream connection answering a request, as the live view reads it
    (sidecar/relay/data/upstream.py): how long it has sent nothing."""

    def silent_seconds(self) -> float: ...


class RequestRecord:
    """One request in flight. ``timeline``: the figures; ``label``: the model label the
    request started under (the in-flight gauge ends under it too); ``model``: the client's
    model name, if it gave one; ``headers``: the client's header fields (the tenant and
    objective headers are read from them, never changed); ``route``: the route template;
    ``tenant_held``: the tenant label held until the verdict; ``closed``: the verdict was
    given; ``upstream``: the connection relaying its response, once its head is in (the
    live view asks it when the last byte came: sidecar/export/in_flight.py);
    ``stall_noted``: the stream's span was told it stalled."""

    __slots__ = (
        "timeline", "label", "model", "headers", "route", "tenant_held", "closed", "upstream",
        "stall_noted",
    )  # fmt: skip

    def __init__(
        self,
        timeline: RequestTimeline,
        label: str,
        model: str | None,
        headers: Mapping[str, str],
        route: str,
    ) -> None:
        self.timeline = timeline
        self.label = label
        self.model = model
        self.headers = headers
        self.route = route
        self.tenant_held: str | None = None
        self.closed = False
        self.upstream: UpstreamSilence | None = None
        self.stall_noted = False


class RecordBook:
    """Opens and closes every request's record (the module doc). ``on_start``/``on_end``:
    the in-flight gauge, by model label and route; ``decode_tracker``: streams decoding per
    model label; ``ledger``: a pod worker's requests in flight;
    ``max_json_bytes``/``max_line_bytes``: how much of a response is read; ``objectives``:
    the objectives a streamed request is judged against where its headers ask for none.
    ``in_flight`` counts the records open (the drain waits for it to reach 0); ``open_records``
    holds them, for the live view read at scrape time (sidecar/export/in_flight.py), and
    ``last_completed`` is when the upstream last answered a request whole (ok and 2xx: an
    engine that makes progress; a cancel or a 4xx its API process gives alone is not)."""

    def __init__(
        self,
        model_label: ModelLabels,
        *,
        on_start: Callable[[str, str], None] | None = None,
        on_end: Callable[[str, str], None] | None = None,
        recorders: Iterable[Recorder] = (),
        tracer: RequestTracer | None = None,
        tenant_label: TenantLabels | None = None,
        decode_tracker: Callable[[str], DecodeConcurrency] | None = None,
        ledger: InFlightLedger | None = None,
        max_json_bytes: int = 16 << 20,
        max_line_bytes: int | None = None,
        objectives: ObjectiveDefaults = NO_DEFAULTS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._model_label = model_label
        self._on_start = on_start
        self._on_end = on_end
        self._recorders = tuple(recorders)
        self._tracer = tracer
        self._tenant_label = tenant_label
        self._decode_tracker = decode_tracker
        self._ledger = ledger
        self._max_json_bytes = max_json_bytes
        self._max_line_bytes = max_line_bytes
        self._objectives = objectives
        self.clock = clock
        self.in_flight = 0
        self.open_records: set[RequestRecord] = set()
        self.last_completed: float | None = None

    def open(
        self,
        start: float,
        method: str,
        route: Route,
        model: str | None,
        fields: RequestFields | None,
        headers: Mapping[str, str],
    ) -> RequestRecord:
        """The record of a request whose head came in at ``start``: its timeline with what
        the request says (``fields``, read from its body, if it was read), its labels held
        and its span started. :meth:`close` ends each of these once."""
        if fields is not None:
            model = model or fields.model
        timeline = RequestTimeline(start, method, route.template, model or "")
        if fields is not None:  # what the request says
            timeline.request_stream = fields.stream
            timeline.request_max_tokens = fields.max_tokens
        label = self._model_label(model)
        if self._decode_tracker is not None:
            timeline.decode = self._decode_tracker(label)
        tenants = self._tenant_label
        if tenants is not None:  # read only: the header is forwarded as sent
            try:
                timeline.tenant = tenants(headers)
            except Exception:
                _log.exception("tenant_label_failed")
        try:  # the objective headers (both spellings), read only: forwarded as sent
            timeline.objectives = read_objectives(headers)
        except Exception:
            _log.exception("objectives_failed")
        record = RequestRecord(timeline, label, model, headers, route.template)
        self.in_flight += 1
        self.open_records.add(record)
        if self._on_start is not None:
            try:
                self._on_start(label, route.template)
            except Exception:  # telemetry never breaks the relay
                _failed(self._on_start)
        if tenants is not None and timeline.tenant:
            # Held until the verdict, like the model label (sidecar/base/labels.py, ``hold``):
            # an idle expiry mid-stream would drop the tenant's series under a running request.
            _safely(tenants.hold, timeline.tenant)
            record.tenant_held = timeline.tenant
        if self._ledger is not None:
            _safely(self._ledger.opened, label, route.template, record.tenant_held or "")
        if self._tracer is not None:
            _safely(self._tracer.start, headers, timeline)
        return record

    def trace_into(self, record: RequestRecord, headers: MutableMapping[str, str]) -> None:
        """Tracing on: the request's span context in the upstream's header fields."""
        if self._tracer is not None and record.timeline.trace is not None:
            _safely(self._tracer.inject, record.timeline, headers)

    def observe(
        self, record: RequestRecord, route: Route, status: int, fields: Sequence[tuple[str, str]]
    ) -> ResponseObserver:
        """The upstream's head is in (its status and header ``fields``): the response's
        observer (its dialect by route, content type and encoding, held to the inspect
        limits), and the timeline says so."""
        timeline = record.timeline
        headers = CIMultiDict(fields)
        observer = ResponseObserver(
            route,
            timeline,
            headers.get("Content-Type", ""),
            headers.get("Content-Encoding", ""),
            max_json_bytes=self._max_json_bytes,
            max_line_bytes=self._max_line_bytes,
            headers=headers,
        )
        timeline.response_started(self.clock(), status, observer.streaming)
        return observer

    def close(self, record: RequestRecord, verdict: Verdict) -> None:
        """The verdict on a request, given once: its labels released (the in-flight gauge
        under the label it began with), then its timeline finished, its labels settled, its
        summary made (once: sidecar/measure/summary.py) and handed to every recorder. A second
        verdict changes nothing."""
        if record.closed:
            return
        record.closed = True
        self.in_flight -= 1
        self.open_records.discard(record)
        if self._on_end is not None:
            try:
                self._on_end(record.label, record.route)
            except Exception:  # telemetry never breaks the relay
                _failed(self._on_end)
        tenants = self._tenant_label
        if record.tenant_held is not None and tenants is not None:
            _safely(tenants.release, record.tenant_held)
        if self._ledger is not None:
            _safely(self._ledger.closed, record.label, record.route, record.tenant_held or "")
        timeline = record.timeline
        now = self.clock()
        if timeline.finish(verdict, now):
            if timeline.outcome is Outcome.OK and 200 <= (timeline.status or 0) < 300:
                self.last_completed = now
            model = record.model or timeline.model or None  # a streamed body's model comes late
            label = self._settled(model, record.label, record.headers, timeline)
            try:
                summary = summarize(timeline, label, self._objectives)
            except Exception:  # telemetry never breaks the relay
                _log.exception("summary_failed")
                return
            for recorder in self._recorders:
                try:
                    recorder(summary)
                except Exception:  # telemetry never breaks the relay
                    _failed(recorder)

    def _settled(
        self, model: str | None, label: str, headers: Mapping[str, str], timeline: RequestTimeline
    ) -> str:
        """The labels a finished request is recorded with: a model or tenant the upstream
        answered (not 4xx) may earn its own label now (sidecar/base/labels.py); a 4xx never
        does."""
        try:
            label = self._model_label.settle(model, timeline.status)
            if self._tenant_label is not None:
                timeline.tenant = self._tenant_label.settle(headers, timeline.status)
        except Exception:  # telemetry never breaks the relay
            _log.exception("label_settle_failed")
        return label


def _safely(fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception:  # telemetry never breaks the relay
        _failed(fn)


def _failed(fn: Callable[..., object]) -> None:
    """Log the exception being handled, raised by ``fn``."""
    _log.exception("recorder_failed", recorder=getattr(fn, "__qualname__", repr(fn)))
