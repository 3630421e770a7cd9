"""A finished request's figures, worked out once: what every exporter reads.

When a request's verdict is given (:meth:`~sidecar.measure.record.RecordBook.close`), its
timeline is read once into a :class:`RequestSummary`: the verdict and its label words, the
labels the request is recorded under, every duration and count, the cache class and the
objectives' judgement. The span (sidecar/export/spans.py), the Prometheus families
(sidecar/export/metrics.py), the capacity view (sidecar/export/capacity.py) and the access
log (sidecar/export/logs.py) each read that one summary, so no figure is derived twice and
no exporter reads the timeline back field by field. The figures' definitions are the
timeline's (sidecar/measure/timeline.py, the module doc); :func:`summarize` computes them
from its timestamps and counts in one pass, with no property calls.

A summary is a tuple: immutable once made, and cheap to make (one call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..base.outcomes import Outcome, Verdict
from ..base.routes import ROUTES
from ..streams.protocols.events import EngineTimings, TokenKind
from .cache_class import CacheClass, cache_class
from .objectives import Judgement, ObjectiveDefaults, RequestObjectives, judge
from .timeline import RequestTimeline, TokenCountSource

__all__ = ["RequestSummary", "summarize", "NO_DEFAULTS"]

NO_DEFAULTS = ObjectiveDefaults()
"""No objective applies unless a request's headers ask for one."""

_ANSWER = TokenKind.ANSWER
_USAGE, _ENGINE = TokenCountSource.USAGE, TokenCountSource.ENGINE
_ESTIMATED, _NONE = TokenCountSource.ESTIMATED, TokenCountSource.NONE
_OK = Outcome.OK


class RequestSummary(NamedTuple):
    """One finished request (seconds; None where a figure does not apply).

    ``error_type`` is the ``error_type`` label's word (``none`` when ok); ``code`` the
    ``code`` label; ``served``: ok with a 2xx (what goodput and the objectives' ``all``
    ask). ``gaps``/``gap_streams`` are the timeline's arrays (read only from here on),
    ``gap_runs`` the entries that stand for several gaps, ``chunk_gaps`` one gap per
    token-bearing event after the first. ``start``, ``first_token``, ``first_answer_token``
    and ``end`` are the clock's readings, for the span's events; ``trace`` is the tracer's
    handle."""

    verdict: Verdict
    outcome: Outcome
    error_type: str
    code: str
    served: bool
    model_label: str
    route: str
    api: bool
    method: str
    model: str
    tenant: str | None
    status: int | None
    streamed: bool
    request_stream: bool | None
    start: float
    first_token: float | None
    first_token_kind: TokenKind | None
    first_answer_token: float | None
    end: float
    e2e: float
    ttfb: float | None
    ttft: float | None
    ttfat: float | None
    tpot: float | None
    tokens_per_second: float | None
    request_overhead: float | None
    response_overhead: float | None
    input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    cached_input_tokens: int | None
    token_count_source: TokenCountSource
    gaps: Sequence[float]
    gap_streams: Sequence[int]
    gap_runs: Sequence[tuple[int, int]]
    gap_count: int
    chunk_gaps: Sequence[float]
    time_to_first_tool_call: float | None
    tool_call_count: int
    tool_call_assembly: tuple[float, ...]
    finish_reasons: Sequence[str]
    response_model: str | None
    response_id: str | None
    engine: EngineTimings | None
    parse_errors: int
    stream_error_type: str | None
    objectives_invalid: tuple[str, ...]
    cache: CacheClass | None
    judgement: Judgement | None
    trace: object | None
    trace_id: str | None

    @property
    def tokens_from_usage(self) -> bool:
        """The output count is exact (the server's usage or the engine's own count)."""
        return self.token_count_source is _USAGE or self.token_count_source is _ENGINE


def summarize(
    t: RequestTimeline, model_label: str, objectives: ObjectiveDefaults = NO_DEFAULTS
) -> RequestSummary:
    """The summary of finished timeline ``t``, recorded under ``model_label``, its objectives
    judged against ``objectives`` where its headers asked for none."""
    verdict = t.verdict
    end = t.end
    if verdict is None or end is None:
        raise ValueError("a request is summarized once finished")
    start, status, streamed = t.start, t.status, t.streamed
    outcome = verdict.outcome
    served = outcome is _OK and status is not None and 200 <= status < 300
    first, last, first_byte = t.first_token, t.last_token, t.first_byte
    ttft = None if first is None else first - start
    answer = t.first_answer_token
    ttfat = (
        None if answer is None or t.first_token_kind is _ANSWER else answer - start
    )  # only when the first token was reasoning or a tool call

    # Token counts: field by field from usage, else the engine's counts (timeline module doc).
    usage, engine_usage = t.usage, t.engine_usage
    output = input_ = reasoning = cached = None
    if usage is not None:
        output, input_ = usage.output_tokens, usage.input_tokens
        reasoning, cached = usage.reasoning_tokens, usage.cached_input_tokens
    if engine_usage is not None:
        if output is None:
            output = engine_usage.output_tokens
        if input_ is None:
            input_ = engine_usage.input_tokens
        if reasoning is None:
            reasoning = engine_usage.reasoning_tokens
        if cached is None:
            cached = engine_usage.cached_input_tokens
    if usage is not None and usage.output_tokens is not None:
        source = _USAGE
    elif engine_usage is not None and engine_usage.output_tokens is not None:
        source = _ENGINE
    else:
        source = _ESTIMATED if streamed else _NONE
    if output is None and streamed:
        output = t.stream_tokens
    if reasoning is None and t.reasoning_stream_tokens:
        reasoning = t.reasoning_stream_tokens

    tpot = tps = None
    if output is not None and output >= 2 and first is not None and last is not None:
        decode = last - first
        tpot = decode / (output - 1)
        if decode > 0:
            tps = (output - 1) / decode

    gaps = t.gaps
    grouped = t._grouped  # the timeline's own record of grouped gaps (its gap_runs)
    if grouped is None:
        runs: Sequence[tuple[int, int]] = ()
        gap_count = len(gaps)
        chunk_gaps: Sequence[float] = gaps
    else:
        runs = t.gap_runs()
        gap_count = t.gap_count
        chunk_gaps = t.chunk_gaps()

    calls = t.tool_calls
    assembly: tuple[float, ...]
    if calls is None:
        first_call, call_count, assembly = None, 0, ()
    else:
        first_call = None if t.first_tool_call is None else t.first_tool_call - start
        call_count = len(calls)
        assembly = tuple([last_ - first_ for first_, last_ in calls.values()])

    asked = t.objectives if type(t.objectives) is RequestObjectives else None
    route = t.route
    api = route in ROUTES
    judgement = None
    if api and (streamed or t.request_stream):
        judgement = judge(
            objectives,
            t.model,
            asked,
            ttft,
            tpot,
            end - start,
            outcome is Outcome.CANCELLED,
            served,
        )
    body, upstream_sent, head_sent = t.body_received, t.upstream_sent, t.client_head_sent
    stream_error = t.stream_error
    return RequestSummary(
        verdict=verdict,
        outcome=outcome,
        error_type=verdict.error_type,
        code=verdict.code(status),
        served=served,
        model_label=model_label,
        route=route,
        api=api,
        method=t.method,
        model=t.model,
        tenant=t.tenant,
        status=status,
        streamed=streamed,
        request_stream=t.request_stream,
        start=start,
        first_token=first,
        first_token_kind=t.first_token_kind,
        first_answer_token=answer,
        end=end,
        e2e=end - start,
        ttfb=None if first_byte is None else first_byte - start,
        ttft=ttft,
        ttfat=ttfat,
        tpot=tpot,
        tokens_per_second=tps,
        request_overhead=(None if body is None or upstream_sent is None else upstream_sent - body),
        response_overhead=(
            None if first_byte is None or head_sent is None else head_sent - first_byte
        ),
        input_tokens=input_,
        output_tokens=output,
        reasoning_tokens=reasoning,
        cached_input_tokens=cached,
        token_count_source=source,
        gaps=gaps,
        gap_streams=t.gap_streams,
        gap_runs=runs,
        gap_count=gap_count,
        chunk_gaps=chunk_gaps,
        time_to_first_tool_call=first_call,
        tool_call_count=call_count,
        tool_call_assembly=assembly,
        finish_reasons=t.finish_reasons,
        response_model=t.response_model,
        response_id=t.response_id,
        engine=t.engine,
        parse_errors=t.parse_errors,
        stream_error_type=None if stream_error is None else stream_error.type,
        objectives_invalid=() if asked is None else asked.invalid,
        cache=cache_class(input_, cached) if streamed and ttft is not None else None,
        judgement=judgement,
        trace=t.trace,
        trace_id=t.trace_id,
    )
