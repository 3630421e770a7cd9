"""Per-token cost of the opt-in exporters, against the Prometheus recorder in the same run:
``python -m bench.micro_otel``.

Three recorders are fed the same finished timelines (a typical vLLM chat stream of
``TOKENS`` one-token chunks, as in ``bench.micro_measure``):

- ``prometheus``: ``SidecarMetrics.record``, the default (the baseline, ratio 1);
- ``prometheus+tenant``: the same with the opt-in ``tenant`` label on;
- ``otel-metrics``: ``RequestTelemetry.record`` with a meter provider and no tracer, i.e.
  ``--otel-metrics`` (the GenAI client metrics; ``time_per_output_chunk`` is one SDK
  ``record`` per chunk, as the conventions ask, which is most of its cost).

Best of several repeats, microseconds per token. Nothing here is asserted by a test.
"""

from __future__ import annotations

import argparse

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from bench.micro_measure import ITL, TOKENS, _best, chunk
from sidecar.base.outcomes import Outcome
from sidecar.base.routes import match_route
from sidecar.export.metrics import SidecarMetrics
from sidecar.export.spans import RequestTelemetry
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import RequestTimeline


def measure(requests: int = 200, repeats: int = 7) -> dict[str, float]:
    route, _ = match_route("/v1/chat/completions", "POST")
    timed = [(chunk(i), i * ITL) for i in range(TOKENS)]

    def finished_timeline() -> RequestTimeline:
        tl = RequestTimeline(0.0, "POST", route.template, "m")
        tl.response_started(0.01, 200, True)
        ob = ResponseObserver(route, tl, "text/event-stream")
        for c, now in timed:
            ob.feed(c, now)
        ob.close(TOKENS * ITL)
        tl.finish(Outcome.OK, TOKENS * ITL)
        tl.tenant = "team-a"
        return tl

    timelines = [finished_timeline() for _ in range(requests)]
    prometheus = SidecarMetrics(CollectorRegistry())
    tenanted = SidecarMetrics(CollectorRegistry(), tenants=True)
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    otel = RequestTelemetry("http://127.0.0.1:8000", meter_provider=meters)

    def recorder(m: SidecarMetrics):
        def run(n: int) -> None:
            for tl in timelines[:n]:
                m.started("m", route.template)
                m.record(summarize(tl, "m"))

        return run

    def otel_record(n: int) -> None:
        for tl in timelines[:n]:
            otel.record(summarize(tl, "m"))

    figures = {
        "prometheus": _best(recorder(prometheus), requests, repeats),
        "prometheus+tenant": _best(recorder(tenanted), requests, repeats),
        "otel-metrics": _best(otel_record, requests, repeats),
    }
    meters.shutdown()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="best of this many repeats")
    args = parser.parse_args(argv)
    figures = measure(args.requests, args.repeats)
    base = figures["prometheus"]
    for part, us in figures.items():
        print(f"{part:<20}{us:8.3f} µs/token  x{us / base:6.2f}")


if __name__ == "__main__":
    main()
