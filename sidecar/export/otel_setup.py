"""The OpenTelemetry SDK's tracer and meter providers, built once at start-up from what the
``OTEL_*`` environment asks for (:mod:`sidecar.export.otel_env`), and their bounded shutdown.

Apart from the per-request span (:mod:`sidecar.export.spans`) because the two never meet: this
runs once in ``serve`` and hands the providers over; the span takes whatever providers it is
given (in-memory ones in tests). With no OTLP endpoint configured nothing is built at all (the
proxy then gets ``tracer=None`` and pays nothing per request), and the SDK's providers and
exporters are imported only when something is built.

A failure here is logged and leaves that signal off; telemetry never stops the sidecar.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast, overload

import structlog

if TYPE_CHECKING:  # the SDK is imported when a signal is on, not at start (see below)
    from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from prometheus_client import CollectorRegistry

    from .otlp_health import ExportHealth

from . import semconv as sc
from .otel_env import (
    otlp_endpoint,
    otlp_protocol,
    resource_attributes,
    sdk_disabled,
    wanted_exporters,
)

__all__ = [
    "SHUTDOWN_TIMEOUT_SECONDS",
    "UNHEALTHY_SHUTDOWN_SECONDS",
    "TelemetryProviders",
    "providers_from_env",
]

_log = structlog.get_logger("sidecar.tracing")

SHUTDOWN_TIMEOUT_SECONDS = 5.0  # the most a SIGTERM exit waits for the last export
UNHEALTHY_SHUTDOWN_SECONDS = 0.5
"""The wait when an OTLP exporter has not shown it can export (its last export failed, one
is hanging, or none succeeded yet): what is queued is lost either way, and an idle SIGTERM
exits within a second (sidecar/export/otlp_health.py)."""


@dataclass
class TelemetryProviders:
    """The SDK providers ``serve`` owns; either may be None (that signal is off)."""

    tracer_provider: SDKTracerProvider | None = None
    meter_provider: SDKMeterProvider | None = None
    healths: list[ExportHealth] = field(default_factory=list)  # one per OTLP exporter

    @property
    def enabled(self) -> bool:
        return self.tracer_provider is not None or self.meter_provider is not None

    def register(self, registry: CollectorRegistry) -> None:
        """``llm_sidecar_otlp_export_failures_total{signal}`` on ``registry`` (the sidecar's
        /metrics), when an OTLP exporter is configured."""
        if self.healths:
            from .otlp_health import ExportFailuresCollector  # noqa: PLC0415 - imports the SDK

            registry.register(ExportFailuresCollector(self.healths))

    def shutdown(self, timeout: float | None = None) -> bool:
        """Flush and stop the exporters, waiting at most ``timeout`` seconds; True if done.

        Blocking (call it off the event loop). The SDK's own shutdown can wait 30 s per
        provider for an unreachable collector (export retries), which would eat the pod's
        termination grace period, so it runs in a daemon thread that is abandoned after
        ``timeout``: the spans are lost either way, the exit is not delayed. By default
        (``timeout`` None) up to :data:`SHUTDOWN_TIMEOUT_SECONDS` while every OTLP exporter
        keeps showing it can export (its last export succeeded, none running for half a
        second: a collector that answers does so in milliseconds), else
        :data:`UNHEALTHY_SHUTDOWN_SECONDS`: a collector down, or gone at this moment, does not
        hold an idle exit past a second.
        """
        budget = SHUTDOWN_TIMEOUT_SECONDS if timeout is None else timeout

        def worth_waiting(elapsed: float) -> bool:
            if elapsed >= budget:
                return False
            if timeout is not None or elapsed < UNHEALTHY_SHUTDOWN_SECONDS:
                return True
            return all(h.healthy(slow_after=UNHEALTHY_SHUTDOWN_SECONDS) for h in self.healths)

        def run() -> None:
            for provider in (self.tracer_provider, self.meter_provider):
                if provider is None:
                    continue
                try:
                    provider.shutdown()
                except Exception:
                    _log.exception("otel_shutdown_failed", provider=type(provider).__name__)

        worker = threading.Thread(target=run, name="llm-sidecar-otel-shutdown", daemon=True)
        worker.start()
        started = time.monotonic()
        while worker.is_alive() and worth_waiting(time.monotonic() - started):
            worker.join(0.05)
        if worker.is_alive():
            failing = sorted(
                {
                    h.signal
                    for h in self.healths
                    if not h.healthy(slow_after=UNHEALTHY_SHUTDOWN_SECONDS)
                }
            )
            _log.warning(
                "otel_flush_incomplete",
                waited_seconds=round(time.monotonic() - started, 2),
                exporters_not_healthy=failing or None,
            )
            return False
        return True


def providers_from_env(
    *, metrics: bool = False, environ: Mapping[str, str] | None = None
) -> TelemetryProviders:
    """SDK providers configured by the standard ``OTEL_*`` variables, or none.

    Traces: on when ``OTEL_EXPORTER_OTLP_ENDPOINT``/``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
    set or ``OTEL_TRACES_EXPORTER`` names ``otlp`` (or ``console``). Metrics: additionally
    need ``metrics=True`` (the ``otel_metrics`` setting). ``OTEL_SDK_DISABLED=true`` turns
    both off. Everything else the SDK reads itself from the process environment: sampler
    (``OTEL_TRACES_SAMPLER[_ARG]``), endpoints, headers, TLS, timeouts, compression, batch
    (``OTEL_BSP_*``) and export interval (``OTEL_METRIC_EXPORT_INTERVAL``).
    A failure here is logged and leaves that signal off; it never stops the sidecar.
    """
    env = os.environ if environ is None else environ
    providers = TelemetryProviders()
    if sdk_disabled(env):
        return providers
    trace_exporters = wanted_exporters(env, "TRACES")
    metric_exporters = wanted_exporters(env, "METRICS") if metrics else set()
    if metrics and not metric_exporters:
        _log.warning(
            "otel_metrics_without_exporter",
            hint="set OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    if not trace_exporters and not metric_exporters:
        return providers
    try:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415 - only when enabled

        resource = Resource.create(resource_attributes(env))
    except Exception:
        _log.exception("otel_resource_failed")
        return providers
    if trace_exporters:
        providers.tracer_provider = _tracer_provider(
            resource, trace_exporters, env, providers.healths
        )
    if metric_exporters:
        providers.meter_provider = _meter_provider(
            resource, metric_exporters, env, providers.healths
        )
    _log.info(
        "otel_enabled",
        traces=_describe(trace_exporters, env, "TRACES")
        if providers.tracer_provider is not None
        else None,
        metrics=_describe(metric_exporters, env, "METRICS")
        if providers.meter_provider is not None
        else None,
        service_name=resource.attributes.get(sc.SERVICE_NAME),
    )
    return providers


def _describe(exporters: Iterable[str], env: Mapping[str, str], signal: str) -> list[str]:
    return sorted(f"otlp ({otlp_protocol(env, signal)})" if e == "otlp" else e for e in exporters)


@overload
def _guarded(
    exporter: SpanExporter,
    name: str,
    signal: str,
    env: Mapping[str, str],
    healths: list[ExportHealth] | None,
) -> SpanExporter: ...


@overload
def _guarded(
    exporter: MetricExporter,
    name: str,
    signal: str,
    env: Mapping[str, str],
    healths: list[ExportHealth] | None,
) -> MetricExporter: ...


def _guarded(
    exporter: SpanExporter | MetricExporter,
    name: str,
    signal: str,
    env: Mapping[str, str],
    healths: list[ExportHealth] | None,
) -> SpanExporter | MetricExporter:
    """An OTLP exporter wrapped to report its failures (one line a minute and a counter, not
    the SDK's retry text: sidecar/export/otlp_health.py); the console one as it is."""
    if name != "otlp" or healths is None:
        return exporter
    from .otlp_health import (
        ExportHealth,
        GuardedMetricExporter,
        GuardedSpanExporter,
        quiet_sdk_export_logs,
    )  # noqa: PLC0415

    quiet_sdk_export_logs()
    endpoint = otlp_endpoint(env, signal.upper())
    health = ExportHealth(signal, endpoint or str(getattr(exporter, "_endpoint", "")))
    healths.append(health)
    if signal == "traces":
        return GuardedSpanExporter(cast("SpanExporter", exporter), health)
    return GuardedMetricExporter(cast("MetricExporter", exporter), health)


def _tracer_provider(
    resource: Resource,
    exporters: set[str],
    env: Mapping[str, str],
    healths: list[ExportHealth] | None = None,
) -> SDKTracerProvider | None:
    try:
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        # Sampler from OTEL_TRACES_SAMPLER. No atexit hook: serve() shuts down, bounded.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for name in sorted(exporters):
            exporter = _guarded(_span_exporter(name, env), name, "traces", env, healths)
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return provider
    except Exception:
        _log.exception("otel_traces_setup_failed")
        return None


def _span_exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    """The exporter ``name`` for spans; an OTLP one reads its own endpoint, headers, TLS,
    timeout and compression (``OTEL_EXPORTER_OTLP_[TRACES_]*``)."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # noqa: PLC0415

        return ConsoleSpanExporter()
    if otlp_protocol(env, "TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter()


def _meter_provider(
    resource: Resource,
    exporters: set[str],
    env: Mapping[str, str],
    healths: list[ExportHealth] | None = None,
) -> SDKMeterProvider | None:
    try:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415

        readers = [
            PeriodicExportingMetricReader(
                _guarded(_metric_exporter(name, env), name, "metrics", env, healths)
            )
            for name in sorted(exporters)
        ]
        return MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
    except Exception:
        _log.exception("otel_metrics_setup_failed")
        return None


def _metric_exporter(name: str, env: Mapping[str, str]) -> MetricExporter:
    """The exporter ``name`` for metrics; an OTLP one reads its own ``OTEL_EXPORTER_OTLP_[METRICS_]*``."""
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter  # noqa: PLC0415

        return ConsoleMetricExporter()
    if otlp_protocol(env, "METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter()
