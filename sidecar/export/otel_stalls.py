"""The stalled streams as an OTel observable gauge in the sidecar's own namespace, beside the
other own metrics (:mod:`sidecar.export.otel_own_metrics`): ``llm_sidecar.client.streams.stalled``,
read from the requests in flight (:class:`~sidecar.export.in_flight.InFlightView`) when the
meter's reader collects, the twin of the Prometheus ``llm_streams_stalled``.

One observation per (model label, route, phase) with a request in flight, so an idle sidecar
reports none, as its Prometheus page has none. Attributes are bounded: the model label, the
route template and the phase.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, MeterProvider, ObservableGauge, Observation

from .. import __version__
from . import semconv as sc
from .in_flight import InFlightView

__all__ = ["register_stall_gauge"]


def register_stall_gauge(meter_provider: MeterProvider, view: InFlightView) -> ObservableGauge:
    """The gauge on ``meter_provider``'s meter, observing ``view`` at each collection."""
    meter = meter_provider.get_meter(sc.INSTRUMENTATION_SCOPE, __version__)

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        snap = view.snapshot()
        return [
            Observation(
                snap.stalled[key],
                {
                    sc.GEN_AI_REQUEST_MODEL: key[0],
                    sc.URL_TEMPLATE: key[1],
                    sc.LLM_SIDECAR_STALL_PHASE: key[2],
                },
            )
            for key in sorted(snap.counts)
        ]

    return meter.create_observable_gauge(
        sc.METRIC_OWN_STREAMS_STALLED,
        callbacks=[observe],
        unit=sc.UNIT_STREAMS,
        description="Streams in flight the upstream has sent no byte for at least --stall-seconds "
        "(read at each collection; a hung engine's streams).",
    )
