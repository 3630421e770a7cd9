"""OTLP export failures as one rate-limited line and a counter, and a shutdown that does not
wait on a collector that is not there.

With the OTLP endpoint unreachable the SDK's exporters log their raw retry text for every
attempt of every batch ("Transient error ... retrying in 2.00s", then "Failed to export
... due to timeout"): about 15 lines in 40 s, and an idle SIGTERM would wait 5-7 s for a
flush that cannot happen (``otel_flush_incomplete``). Here:

- :class:`GuardedSpanExporter` and :class:`GuardedMetricExporter` wrap the SDK's OTLP
  exporters and report each export's result to the signal's :class:`ExportHealth`;
- the SDK exporters' own log records are dropped (:func:`quiet_sdk_export_logs`); the last
  one's text is kept as the failure's reason;
- :class:`ExportHealth` logs ``otel_export_failed`` (signal, endpoint, reason, failures
  since the last line) at most once per :data:`LOG_EVERY_SECONDS`, ``otel_export_recovered``
  once when an export succeeds again, and counts every failed export for
  ``llm_sidecar_otlp_export_failures_total{signal}`` (:class:`ExportFailuresCollector`);
- :meth:`ExportHealth.healthy` tells the shutdown whether waiting for the last flush can
  help: only an exporter whose last export succeeded, with none running for long, gets the
  full flush time (sidecar/export/otel_setup.py ``TelemetryProviders.shutdown``).

An exporter never raises into the SDK's worker, and nothing here blocks an export. Imported
only when an OTLP exporter is configured (it imports the SDK).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import structlog
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client.core import CounterMetricFamily, Metric

from .families import NAMESPACE, OWN_FAMILIES, family_row

__all__ = [
    "ExportFailuresCollector",
    "ExportHealth",
    "GuardedMetricExporter",
    "GuardedSpanExporter",
    "LOG_EVERY_SECONDS",
    "FAILURES_METRIC",
    "quiet_sdk_export_logs",
]

_log = structlog.get_logger("sidecar.tracing")

R = TypeVar("R")

LOG_EVERY_SECONDS = 60.0
"""At most one ``otel_export_failed`` line per signal in this many seconds."""

SLOW_EXPORT_SECONDS = 1.0
"""An export still running after this long (a collector that does not answer) makes the
exporter unhealthy for the shutdown's purpose."""

_FAILURES = family_row(OWN_FAMILIES, "otlp_export_failures")
FAILURES_METRIC = f"{NAMESPACE}_{_FAILURES.name}"  # _total is added by the client library
_MAX_REASON = 300
_SDK_LOGGERS = "opentelemetry.exporter"
_last_text = threading.local()  # the SDK's first log text of the export running in this thread


class _Quiet(logging.Filter):
    """Drops an SDK exporter's record; keeps the first text of an export as its failure's
    reason (the first names the cause, "Transient error <connection refused> ...", the last
    only "due to timeout, max retries or shutdown")."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_last_text, "value", ""):
            try:
                _last_text.value = record.getMessage()
            except Exception:  # noqa: BLE001 - a bad format string is not our failure
                _last_text.value = str(record.msg)
        return False


_QUIET = _Quiet()


def quiet_sdk_export_logs() -> None:
    """Silence every ``opentelemetry.exporter.*`` logger that exists (call it after the
    exporter modules are imported; their module loggers are made at import). Idempotent."""
    names = [
        n
        for n in logging.root.manager.loggerDict
        if n == _SDK_LOGGERS or n.startswith(_SDK_LOGGERS + ".")
    ]
    for name in names:
        logger = logging.getLogger(name)
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)


def endpoint_for_log(url: str) -> str:
    """scheme://host:port/path of an endpoint: never credentials or a query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else url[:_MAX_REASON]


class ExportHealth:
    """One signal's export results: counted, logged at most once a minute, and whether the
    exporter is worth waiting for at shutdown."""

    def __init__(
        self, signal: str, endpoint: str = "", *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.signal = signal
        self.endpoint = endpoint_for_log(endpoint)
        self._clock = clock
        self._lock = threading.Lock()
        self.failures = 0  # every failed export since start (the counter's value)
        self.successes = 0
        self.failing = False
        self._unlogged = 0
        self._logged_at: float | None = None
        self._running_since: float | None = None

    def started(self) -> None:
        with self._lock:
            self._running_since = self._clock()

    def finished(self, ok: bool, reason: str = "") -> None:
        with self._lock:
            self._running_since = None
            if ok:
                self.successes += 1
                recovered, self.failing = self.failing, False
                self._unlogged = 0
                if recovered:
                    _log.info("otel_export_recovered", signal=self.signal, endpoint=self.endpoint)
                return
            self.failures += 1
            self.failing = True
            self._unlogged += 1
            now = self._clock()
            if self._logged_at is not None and now - self._logged_at < LOG_EVERY_SECONDS:
                return
            self._logged_at = now
            failures, self._unlogged = self._unlogged, 0
        _log.warning(
            "otel_export_failed",
            signal=self.signal,
            endpoint=self.endpoint,
            reason=(reason or "export failed")[:_MAX_REASON],
            failures=failures,
            next_line_within_seconds=LOG_EVERY_SECONDS,
            counter=f"{FAILURES_METRIC}_total",
        )

    def healthy(self, slow_after: float = SLOW_EXPORT_SECONDS) -> bool:
        """Whether a flush at shutdown can be expected to finish: the last export succeeded
        and none has been running for ``slow_after`` seconds."""
        with self._lock:
            slow = (
                self._running_since is not None
                and self._clock() - self._running_since >= slow_after
            )
            return self.successes > 0 and not self.failing and not slow


def _run(health: ExportHealth, export: Callable[[], R], success: R, failure: R) -> R:
    _last_text.value = ""
    health.started()
    try:
        result = export()
    except Exception as exc:  # noqa: BLE001 - never into the SDK's worker
        health.finished(False, f"{type(exc).__name__}: {exc}")
        return failure
    ok = result == success
    health.finished(ok, "" if ok else getattr(_last_text, "value", ""))
    return result


class GuardedSpanExporter(SpanExporter):
    """``inner`` (an SDK span exporter) reporting each export to ``health``."""

    def __init__(self, inner: SpanExporter, health: ExportHealth) -> None:
        self.inner = inner
        self.health = health

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return _run(
            self.health,
            lambda: self.inner.export(spans),
            SpanExportResult.SUCCESS,
            SpanExportResult.FAILURE,
        )

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()
        except Exception:  # noqa: BLE001 - telemetry never breaks the host
            pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return self.inner.force_flush(timeout_millis)
        except Exception:  # noqa: BLE001
            return False


class GuardedMetricExporter(MetricExporter):
    """``inner`` (an SDK metric exporter) reporting each export to ``health``. The reader
    reads an exporter's preferred temporality and aggregation when it is built: the inner's
    are passed on (the SDK's base class keeps them in these two attributes)."""

    def __init__(self, inner: MetricExporter, health: ExportHealth) -> None:
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self.inner = inner
        self.health = health

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return _run(
            self.health,
            lambda: self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs),
            MetricExportResult.SUCCESS,
            MetricExportResult.FAILURE,
        )

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        try:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
        except Exception:  # noqa: BLE001
            pass

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        try:
            return self.inner.force_flush(timeout_millis=timeout_millis)
        except Exception:  # noqa: BLE001
            return False


class ExportFailuresCollector:
    """``llm_sidecar_otlp_export_failures_total{signal}``: one series per signal exported
    over OTLP (there from the start, at 0), for a rate() alert."""

    def __init__(self, healths: Iterable[ExportHealth]) -> None:
        self._healths = list(healths)

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            FAILURES_METRIC, _FAILURES.help, labels=list(_FAILURES.labels)
        )
        for health in self._healths:
            failures.add_metric([health.signal], health.failures)
        yield failures

    def describe(self) -> list[Metric]:
        return []
