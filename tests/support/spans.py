"""Reading the spans a sidecar finished, from an in-memory exporter."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.waits import wait_for


async def one_span(exporter: InMemorySpanExporter):
    """The one span the request made, once it has ended (fails if there are more)."""
    await wait_for(lambda: len(exporter.get_finished_spans()) >= 1)
    (span,) = exporter.get_finished_spans()
    return span
