"""The OTel metrics in the sidecar's own namespace: what the sidecar measures and the GenAI
conventions do not name (see :mod:`sidecar.export.semconv` for what was checked).

The same figures as the Prometheus families of the same meaning, from the same finished
timeline, recorded with the GenAI client metrics when ``--otel-metrics`` is on (under either
GenAI naming, so ``OTEL_SEMCONV_STABILITY_OPT_IN`` does not change them):

==============================================  =============================================
``llm_sidecar.client.time_to_first_token_by_cache``  ``llm_time_to_first_token_by_cache_seconds``
``llm_sidecar.client.time_to_first_tool_call``  ``llm_time_to_first_tool_call_seconds``
``llm_sidecar.client.tool_call.assembly_duration``  ``llm_tool_call_assembly_seconds``
``llm_sidecar.client.tool_calls``               ``llm_tool_calls_per_response``
``llm_sidecar.client.request.objectives``       ``llm_request_objectives_total``
``llm_sidecar.client.request.objective_invalid``  ``llm_request_objective_invalid_total``
==============================================  =============================================

Attributes: the GenAI metrics' own (operation, provider, bounded model, server), plus
``llm_sidecar.cache.class`` on the first, ``llm_sidecar.objective.name`` and
``llm_sidecar.objective.result`` on the objective counters: every value bounded.
Latency histograms advise the GenAI client buckets (0.01 .. 81.92 s), so a cache class's
line sits on the same bounds as ``gen_ai.client.*.time_to_first_chunk``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from opentelemetry.metrics import MeterProvider

from .. import __version__
from ..base.buckets import TOOL_CALL_COUNT_BUCKETS
from ..measure.summary import RequestSummary
from . import semconv as sc

__all__ = ["OwnInstruments"]


class _Seconds(TypedDict):
    """The options every seconds histogram is created with."""

    unit: str
    explicit_bucket_boundaries_advisory: Sequence[float]


class OwnInstruments:
    """Created once per meter provider; :meth:`record` takes one finished request."""

    def __init__(self, meter_provider: MeterProvider) -> None:
        meter = meter_provider.get_meter(sc.INSTRUMENTATION_SCOPE, __version__)
        seconds: _Seconds = {
            "unit": sc.UNIT_SECONDS,
            "explicit_bucket_boundaries_advisory": sc.BUCKETS_CLIENT_SECONDS,
        }
        self.ttft_by_cache = meter.create_histogram(
            sc.METRIC_OWN_TTFT_BY_CACHE,
            description="Streamed requests' time to first token by how much of the prompt the prefix cache "
            "held (llm_sidecar.cache.class: none, partial, most, unknown).",
            **seconds,
        )
        self.first_tool_call = meter.create_histogram(
            sc.METRIC_OWN_TIME_TO_FIRST_TOOL_CALL,
            description="Streamed responses with a tool call: seconds from the request to the first piece "
            "of the first call.",
            **seconds,
        )
        self.assembly = meter.create_histogram(
            sc.METRIC_OWN_TOOL_CALL_ASSEMBLY,
            description="Each tool call of a streamed response: seconds from its first piece to its last "
            "argument piece (0 for a call sent whole).",
            **seconds,
        )
        self.tool_calls = meter.create_histogram(
            sc.METRIC_OWN_TOOL_CALLS,
            unit=sc.UNIT_TOOL_CALLS,
            description="Streamed responses with a tool call: how many calls the response made.",
            explicit_bucket_boundaries_advisory=TOOL_CALL_COUNT_BUCKETS,
        )
        self.objectives = meter.create_counter(
            sc.METRIC_OWN_REQUEST_OBJECTIVES,
            unit=sc.UNIT_REQUESTS,
            description="Streamed requests judged against their own latency objectives (x-slo-ttft-ms / "
            "x-slo-tpot-ms, else the model's defaults), per objective (ttft, tpot, all) and result "
            "(met, missed). Never sum over the objective.",
        )
        self.objective_invalid = meter.create_counter(
            sc.METRIC_OWN_REQUEST_OBJECTIVE_INVALID,
            unit=sc.UNIT_HEADERS,
            description="Objective headers that were not a positive number of milliseconds up to a day: "
            "ignored, never an error for the client.",
        )

    def record(
        self,
        t: RequestSummary,
        attrs: dict[str, Any],
        ctx: Any = None,
    ) -> None:
        """One finished API request; ``attrs`` are the GenAI metrics' common attributes."""
        if t.streamed:
            if t.ttft is not None and t.cache is not None:
                self.ttft_by_cache.record(
                    t.ttft, {**attrs, sc.LLM_SIDECAR_CACHE_CLASS: t.cache.value}, context=ctx
                )
            first = t.time_to_first_tool_call
            if first is not None:
                self.first_tool_call.record(first, attrs, context=ctx)
                for seconds in t.tool_call_assembly:
                    self.assembly.record(seconds, attrs)
                self.tool_calls.record(t.tool_call_count, attrs)
        for name in t.objectives_invalid:
            self.objective_invalid.add(1, {**attrs, sc.LLM_SIDECAR_OBJECTIVE_NAME: name})
        judgement = t.judgement
        if judgement is not None:
            for name, met in judgement.verdicts():
                result = "met" if met else "missed"
                self.objectives.add(
                    1,
                    {
                        **attrs,
                        sc.LLM_SIDECAR_OBJECTIVE_NAME: name,
                        sc.LLM_SIDECAR_OBJECTIVE_RESULT: result,
                    },
                )
