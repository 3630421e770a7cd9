"""sidecar/export/otlp_health.py: OTLP export failures counted, logged once a minute, the SDK's
own retry text kept out of the log, and the shutdown told whether a flush can help."""

from __future__ import annotations

import logging

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sidecar.export.otel_setup import UNHEALTHY_SHUTDOWN_SECONDS, TelemetryProviders
from sidecar.export.otlp_health import (
    LOG_EVERY_SECONDS,
    SLOW_EXPORT_SECONDS,
    ExportFailuresCollector,
    ExportHealth,
    GuardedSpanExporter,
    quiet_sdk_export_logs,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Failing(SpanExporter):
    """Logs as the SDK's OTLP exporter does, through a logger of its hierarchy."""

    def __init__(self, result=SpanExportResult.FAILURE, raises: bool = False) -> None:
        self.result, self.raises = result, raises
        self.sdk_log = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")

    def export(self, spans):
        self.sdk_log.warning(
            "Transient error %s encountered while exporting spans batch, retrying in 1.00s.",
            "refused",
        )
        self.sdk_log.error("Failed to export spans batch due to timeout, max retries or shutdown.")
        if self.raises:
            raise ConnectionError("boom")
        return self.result

    def shutdown(self):
        pass


def test_one_line_a_minute_every_failure_counted_and_the_recovery_said(caplog):
    clock = Clock()
    health = ExportHealth("traces", "http://user:pw@collector:4318/v1/traces?x=1", clock=clock)
    inner = Failing()
    exporter = GuardedSpanExporter(inner, health)
    quiet_sdk_export_logs()
    with capture_logs() as logs, caplog.at_level(logging.DEBUG):
        for _ in range(15):  # 15 failed batches within the minute
            assert exporter.export([]) is SpanExportResult.FAILURE
            clock.now += 2
        clock.now += LOG_EVERY_SECONDS
        exporter.export([])  # the next minute: one more line, saying how many since
        inner.result = SpanExportResult.SUCCESS
        assert exporter.export([]) is SpanExportResult.SUCCESS
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")], (
        "the SDK's text is dropped"
    )
    failed = [e for e in logs if e["event"] == "otel_export_failed"]
    assert [e["failures"] for e in failed] == [1, 15]
    assert (
        failed[0]["signal"] == "traces"
        and failed[0]["endpoint"] == "http://collector:4318/v1/traces"
    )
    assert failed[0]["reason"].startswith("Transient error refused"), (
        "the first text names the cause"
    )
    assert [e["event"] for e in logs][-1] == "otel_export_recovered"
    assert health.failures == 16

    registry = CollectorRegistry()
    registry.register(ExportFailuresCollector([health, ExportHealth("metrics")]))
    assert (
        registry.get_sample_value("llm_sidecar_otlp_export_failures_total", {"signal": "traces"})
        == 16
    )
    assert (
        registry.get_sample_value("llm_sidecar_otlp_export_failures_total", {"signal": "metrics"})
        == 0
    )


def test_an_exporter_that_raises_is_a_failure_not_an_exception():
    health = ExportHealth("traces")
    with capture_logs() as logs:
        assert (
            GuardedSpanExporter(Failing(raises=True), health).export([]) is SpanExportResult.FAILURE
        )
    assert health.failures == 1 and "ConnectionError: boom" in logs[0]["reason"]


def test_healthy_only_after_a_success_and_with_no_export_hanging():
    clock = Clock()
    health = ExportHealth("traces", clock=clock)
    assert not health.healthy(), "nothing exported yet: a flush may hang on a collector never seen"
    health.started()
    health.finished(True)
    assert health.healthy()
    health.started()
    clock.now += SLOW_EXPORT_SECONDS
    assert not health.healthy(), "an export running this long: the collector does not answer"
    with capture_logs():
        health.finished(False, "timeout")
    assert not health.healthy()


def test_shutdown_waits_briefly_for_an_exporter_that_cannot_export():
    import threading
    import time

    release = threading.Event()

    class Hanging:
        def shutdown(self):
            release.wait(30)  # an SDK flush stuck in its retries

    failing = ExportHealth("traces")
    with capture_logs():
        failing.finished(False, "refused")
    providers = TelemetryProviders(Hanging(), None, [failing])
    started = time.monotonic()
    try:
        assert providers.shutdown() is False
    finally:
        release.set()
    assert time.monotonic() - started < UNHEALTHY_SHUTDOWN_SECONDS + 0.5


def test_a_collector_gone_at_shutdown_does_not_hold_the_exit_and_a_working_one_is_waited_for():
    import threading
    import time

    release = threading.Event()
    health = ExportHealth("metrics")
    health.started()
    health.finished(True)  # it exported before

    class FinalExportHangs:
        def shutdown(self):  # the reader's last export, to a collector gone this moment
            health.started()
            release.wait(30)

    started = time.monotonic()
    try:
        assert TelemetryProviders(None, FinalExportHangs(), [health]).shutdown() is False
    finally:
        release.set()
    assert time.monotonic() - started < 1.0

    class SlowButWorking:
        def shutdown(self):  # exports that keep succeeding, 0.8 s in all
            for _ in range(4):
                health.started()
                time.sleep(0.2)
                health.finished(True)

    health.finished(True)
    assert TelemetryProviders(None, SlowButWorking(), [health]).shutdown() is True
