"""The opt-in GenAI client metrics (gen-ai-metrics.md) of one finished request, with the
conventions' advised bucket boundaries, beside our own namespace's
(:mod:`sidecar.export.otel_own_metrics`).

Apart from the span (:mod:`sidecar.export.spans`) because it is a different signal with its own
switch (``--otel-metrics``) and its own naming choice: ``OTEL_SEMCONV_STABILITY_OPT_IN``
(:func:`sidecar.export.otel_env.genai_latest_names`) picks the current names or the last
released ones once, when the instruments are created, so the per-chunk path is the same
either way. The span's recorder works out the attributes (operation, provider, bounded model,
server) and hands them in.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider

from .. import __version__
from ..measure.summary import RequestSummary
from . import semconv as sc
from .otel_own_metrics import OwnInstruments

__all__ = ["GenAIInstruments"]


class GenAIInstruments:
    """The opt-in GenAI client metrics, with the conventions' advised bucket boundaries.

    ``latest``: the current names (see :mod:`sidecar.export.semconv`); otherwise the last
    released ones. Chosen once here, so the per-chunk path is the same either way."""

    def __init__(self, meter_provider: MeterProvider, *, latest: bool = False) -> None:
        meter = meter_provider.get_meter(sc.INSTRUMENTATION_SCOPE, __version__)
        self.latest = latest
        self.own = OwnInstruments(meter_provider)  # our namespace: what the conventions do not name
        self.duration = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_DURATION if latest else sc.METRIC_CLIENT_OPERATION_DURATION,
            unit=sc.UNIT_SECONDS,
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_CLIENT_SECONDS,
        )  # fmt: skip
        self.ttfc = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK if latest else sc.METRIC_CLIENT_TIME_TO_FIRST_CHUNK,
            unit=sc.UNIT_SECONDS,
            description="Time to receive the first chunk, measured from when the client issues the "
            "generation request to when the first chunk is received in the response stream.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_CLIENT_SECONDS,
        )  # fmt: skip
        self.tpoc = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK if latest else sc.METRIC_CLIENT_TIME_PER_OUTPUT_CHUNK,
            unit=sc.UNIT_SECONDS,
            description="Time per output chunk, recorded for each chunk received after the first one.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_CLIENT_SECONDS,
        )  # fmt: skip
        if not latest:
            self.tokens = meter.create_histogram(
                sc.METRIC_CLIENT_TOKEN_USAGE, unit=sc.UNIT_TOKENS,
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=sc.BUCKETS_TOKEN_USAGE,
            )  # fmt: skip
            return
        # latest: per-request histograms and running counters (token-metrics.yaml)
        self.op_input = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of input (prompt) tokens used per inference operation.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_TOKEN_USAGE,
        )  # fmt: skip
        self.op_output = meter.create_histogram(
            sc.METRIC_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of output (completion) tokens used per inference operation.",
            explicit_bucket_boundaries_advisory=sc.BUCKETS_TOKEN_USAGE,
        )  # fmt: skip
        counter = meter.create_counter
        self.usage_input = counter(
            sc.METRIC_CLIENT_INFERENCE_USAGE_INPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of input (prompt) tokens used, including cached tokens.",
        )  # fmt: skip
        self.usage_output = counter(
            sc.METRIC_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of output (completion) tokens used, including reasoning tokens.",
        )  # fmt: skip
        self.usage_cache_read = counter(
            sc.METRIC_CLIENT_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of input tokens served from a provider-managed cache.",
        )  # fmt: skip
        self.usage_reasoning = counter(
            sc.METRIC_CLIENT_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS, unit=sc.UNIT_TOKENS,
            description="The number of output tokens used for reasoning (e.g. chain-of-thought, extended thinking).",
        )  # fmt: skip
        # cache_write.input_tokens: no server the sidecar reads reports cache writes; not created.

    def record(
        self,
        t: RequestSummary,
        attrs: dict[str, Any],
        error_type: str | None,
        ctx: Context | None,
    ) -> None:
        """The GenAI client metrics of one finished request (gen-ai-metrics.md).

        ``operation.duration``: every request, ``error.type`` when it ended in one.
        ``time_to_first_chunk`` and ``time_per_output_chunk``: streamed responses only (the
        spec: "SHOULD NOT be reported otherwise"), whatever the outcome, since a client saw
        those chunks arrive; one ``time_per_output_chunk`` observation per chunk after the
        first. ``token.usage``: input and output counts when known. ``ctx`` holds the span
        when an exemplar may point at it (else None).
        """
        duration_attrs = attrs if error_type is None else {**attrs, sc.ERROR_TYPE: error_type}
        self.duration.record(t.e2e, duration_attrs, context=ctx)
        if t.streamed and t.ttft is not None:
            self.ttfc.record(t.ttft, attrs, context=ctx)
            record = self.tpoc.record
            for gap in t.chunk_gaps:
                record(gap, attrs)
        self.own.record(t, attrs, ctx)
        if self.latest:
            self._record_usage_latest(t, attrs, ctx)
            return
        for kind, value in (
            (sc.GEN_AI_TOKEN_TYPE_INPUT, t.input_tokens),
            (sc.GEN_AI_TOKEN_TYPE_OUTPUT, t.output_tokens),
        ):
            if value is not None:
                self.tokens.record(value, {**attrs, sc.GEN_AI_TOKEN_TYPE: kind}, context=ctx)

    def _record_usage_latest(
        self, t: RequestSummary, attrs: dict[str, Any], ctx: Context | None
    ) -> None:
        """Token metrics under the current names: the per-operation histograms carry the common
        attributes; the usage counters add the required ``gen_ai.token.modality``."""
        counted = {**attrs, sc.GEN_AI_TOKEN_MODALITY: sc.GEN_AI_TOKEN_MODALITY_UNKNOWN}
        if t.input_tokens is not None:
            self.op_input.record(t.input_tokens, attrs, context=ctx)
            self.usage_input.add(t.input_tokens, counted, context=ctx)
        if t.output_tokens is not None:
            self.op_output.record(t.output_tokens, attrs, context=ctx)
            self.usage_output.add(t.output_tokens, counted, context=ctx)
        cached = t.cached_input_tokens
        if cached is not None:
            self.usage_cache_read.add(cached, counted, context=ctx)
        reasoning = t.reasoning_tokens
        if reasoning is not None:
            self.usage_reasoning.add(reasoning, counted, context=ctx)
