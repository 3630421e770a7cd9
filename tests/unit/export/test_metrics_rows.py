"""A request's row (sidecar/export/prometheus_internals.py, ``Row``): the cells one request's
figures move, written in one call. It repeats the cells' steps inline, so these hold it to
the library: a row's writes leave the page as ``inc`` and ``observe`` do, and
``SidecarMetrics.record`` leaves the page as one ``labels(...)`` update per family does
(the plain way, written out here as the reference), for any mix of requests."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from sidecar.base.buckets import ITL_BUCKETS, TTFT_BUCKETS
from sidecar.base.finish_reason import finish_reason_label
from sidecar.base.outcomes import Outcome, Verdict
from sidecar.export.metrics import SidecarMetrics, SLOThresholds
from sidecar.export.prometheus_internals import (
    SMALL_BATCH,
    Children,
    Observed,
    Row,
    Slot,
    count_of,
    observe_repeated,
)
from sidecar.measure.cache_class import CacheClass
from sidecar.measure.objectives import Judgement
from sidecar.measure.summary import RequestSummary, summarize
from sidecar.measure.timeline import TokenCountSource
from sidecar.streams.protocols.events import EngineTimings
from tests.support.timelines import streamed


def _page(registry: CollectorRegistry) -> bytes:
    """The page without ``_created`` and the process's own figures (its CPU seconds move)."""
    return b"\n".join(
        line
        for line in generate_latest(registry).splitlines()
        if b"_created" not in line and b"process_" not in line
    )


_value = st.one_of(
    st.floats(min_value=-1.0, max_value=1e10, allow_nan=False),
    st.sampled_from([0.0, 0.05, 0.1, 29.0, math.inf, math.nan]),
)


@settings(max_examples=60, deadline=None)
@given(
    updates=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(0, 5)),
            st.one_of(st.none(), _value),
            st.one_of(st.none(), st.lists(_value, max_size=2 * SMALL_BATCH)),
            st.booleans(),
        ),
        max_size=12,
    )
)
def test_a_rows_writes_leave_the_page_as_inc_and_observe_do(updates):
    """Slot by slot, against the library: a count, an observation with the row's exemplar,
    one without (its slot takes none), a sequence of values (short ones inline, long ones
    through observe_many; NaN summed, in no bucket) and a child made ahead."""
    pages = []
    for through_row in (False, True):
        registry = CollectorRegistry()
        count = Counter("c", "doc", ("m",), registry=registry)
        hist = Histogram("h", "doc", ("m",), buckets=TTFT_BUCKETS, registry=registry)
        plain = Histogram("p", "doc", ("m",), buckets=TTFT_BUCKETS, registry=registry)
        many = Histogram("n", "doc", ("m",), buckets=ITL_BUCKETS, registry=registry)
        ahead = Histogram("a", "doc", registry=registry)
        row = Row(
            [
                Children(count, count_of).slot({"m": "x"}),
                Children(hist, Observed).slot({"m": "x"}, exemplar=True),
                Children(plain, Observed).slot({"m": "x"}),
                Children(many, Observed).slot({"m": "x"}, many=True),
                Slot.ready(Observed(ahead)),
            ]
        )
        for amount, value, values, traced in updates:
            exemplar = {"trace_id": "abc"} if traced else None
            if through_row:
                row.write((amount, value, value, values, value), exemplar)
                continue
            if amount is not None:
                count.labels("x").inc(amount)
            if value is not None:
                hist.labels("x").observe(value, exemplar)
                plain.labels("x").observe(value)
                ahead.observe(value)
            if values is not None:  # an empty sequence still makes the child, as its slot's update
                child = many.labels("x")
                for v in values:
                    child.observe(v)
        pages.append(_page(registry))
    assert pages[0] == pages[1]


def test_a_slot_the_gate_folded_is_asked_again_and_kept_once_it_is_its_own():
    registry = CollectorRegistry()
    family = Counter("c", "doc", ("m",), registry=registry)
    folded = family.labels("other")
    own = family.labels
    room = [False]

    def labels(*values: str):  # the series gate's way: another row while there is no room
        return own(*values) if room[0] else folded

    family.labels = labels  # type: ignore[method-assign]
    row = Row([Children(family, count_of).slot({"m": "x"})])
    row.write((1,))
    assert row.cells[0] is None  # not kept: the next write asks again
    room[0] = True
    row.write((1,))
    row.write((1,))
    assert row.cells[0] is not None
    assert registry.get_sample_value("c_total", {"m": "other"}) == 1
    assert registry.get_sample_value("c_total", {"m": "x"}) == 2


def test_forgetting_a_value_drops_the_rows_that_held_its_series():
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    metrics.record(summarize(streamed([100.2, 100.3, 100.4]), "m"))
    assert metrics._rows
    metrics.forget("model", "m")
    assert not metrics._rows
    metrics.record(summarize(streamed([100.2, 100.3, 100.4]), "m"))
    assert registry.get_sample_value("llm_inter_token_latency_seconds_count", {"model": "m"}) == 2


# -- SidecarMetrics.record against one labels() update per family ----------------------------


def reference_record(m: SidecarMetrics, t: RequestSummary) -> None:
    """What record does, one family at a time through prometheus_client's own ``labels``,
    ``inc`` and ``observe`` (the families' label order: sidecar/export/families.py)."""
    model, route, outcome = t.model_label, t.route, t.outcome.value
    tenant = (t.tenant or "unknown",) if m.tenants else ()  # on those families marked tenant
    ex = {"trace_id": t.trace_id} if t.trace_id else None
    m.requests.labels(model, route, t.code, outcome, t.error_type, *tenant).inc()
    for raw in t.finish_reasons[:16]:
        m.finish_reasons.labels(model, route, finish_reason_label(raw)).inc()
    if t.outcome is not Outcome.CANCELLED:
        m.duration.labels(model, outcome).observe(t.e2e, ex)
    if t.ttfb is not None:
        m.ttfb.labels(model).observe(t.ttfb, ex)
    if t.parse_errors:
        m.parse_errors.labels(route).inc(t.parse_errors)
    if t.streamed:
        if t.ttft is not None:
            m.ttft.labels(model, m.prompt_class(t.input_tokens), *tenant).observe(t.ttft, ex)
            if t.cache is not None and t.cache is not CacheClass.UNKNOWN:
                m.ttft_by_cache.labels(model, t.cache.value).observe(t.ttft, ex)
        if t.ttfat is not None:
            m.ttfat.labels(model).observe(t.ttfat, ex)
        if t.time_to_first_tool_call is not None:
            m.time_to_first_tool_call.labels(model).observe(t.time_to_first_tool_call, ex)
            for seconds in t.tool_call_assembly:
                m.tool_call_assembly.labels(model).observe(seconds)
            m.tool_calls_per_response.labels(model).observe(t.tool_call_count)
        for gap in t.gaps:
            m.itl.labels(model).observe(gap)
        for i, count in t.gap_runs:  # the surplus of an entry standing for k gaps, at once
            # (its sum a product: test_metrics_observe_many holds it to k observations)
            observe_repeated(m.itl.labels(model), t.gaps[i], count - 1)
        if t.tpot is not None:
            m.tpot.labels(model).observe(t.tpot, ex)
        if t.tokens_per_second is not None:
            m.tps.labels(model).observe(t.tokens_per_second)
    for kind, value, distribution in (
        ("input", t.input_tokens, True),
        ("output", t.output_tokens, True),
        ("reasoning", t.reasoning_tokens, False),
        ("cached_input", t.cached_input_tokens, False),
    ):
        if value:
            m.tokens.labels(model, route, kind, *tenant).inc(value)
        if value is not None and distribution and t.outcome is Outcome.OK:
            m.request_tokens.labels(model, kind).observe(value)
    m.token_count_source.labels(model, route, t.token_count_source.value).inc()
    if t.engine is not None:
        for family, value in (
            (m.upstream_load, t.engine.load_seconds),
            (m.upstream_prefill, t.engine.prefill_seconds),
            (m.upstream_decode, t.engine.decode_seconds),
            (m.upstream_queue, t.engine.queue_seconds),
        ):
            if value is not None:
                family.labels(model).observe(value)
    if t.request_overhead is not None:
        m.overhead.labels("request").observe(t.request_overhead)
    if t.response_overhead is not None:
        m.overhead.labels("response").observe(t.response_overhead)
    if m.slo is not None and m.slo.met_by(t):
        m.within_slo.labels(model, *tenant).inc()
    for name in t.objectives_invalid:
        m.request_objective_invalid.labels(route, name).inc()
    if t.judgement is not None:
        for name, met in t.judgement.verdicts():
            m.request_objectives.labels(model, name, "met" if met else "missed", *tenant).inc()


_maybe = st.one_of(st.none(), st.floats(min_value=0.0, max_value=100.0))
_count = st.one_of(st.none(), st.integers(0, 3000))
_judged = st.one_of(st.none(), st.booleans())


@st.composite
def summaries(draw) -> RequestSummary:
    times = draw(st.lists(st.floats(100.02, 130.0), min_size=1, max_size=20).map(sorted))
    t = summarize(streamed(times), draw(st.sampled_from(["m", "n", "other"])))
    gaps = tuple(draw(st.lists(st.floats(0.0, 5.0), max_size=20)))
    runs = tuple(
        sorted(
            draw(
                st.dictionaries(
                    st.integers(0, max(len(gaps) - 1, 0)), st.integers(2, 5), max_size=3
                )
            ).items()
        )
    )
    calls = draw(st.integers(0, 3))
    verdict = draw(
        st.sampled_from(
            [Verdict.OK, Verdict.OK, Verdict.CLIENT_DISCONNECTED, Verdict.UPSTREAM_STATUS]
        )
    )
    engine = draw(st.one_of(st.none(), st.builds(EngineTimings, _maybe, _maybe, _maybe, _maybe)))
    judgement = draw(
        st.one_of(
            st.none(),
            st.builds(
                Judgement, st.just(0.5), st.just(0.05), st.booleans(), st.booleans(),
                _judged, _judged, _judged,
            ),
        )
    )  # fmt: skip
    return t._replace(
        verdict=verdict,
        outcome=verdict.outcome,
        error_type=verdict.error_type,
        code=draw(st.sampled_from(["200", "500", "429"])),
        streamed=draw(st.booleans()),
        tenant=draw(st.sampled_from([None, "a", "b"])),
        ttfb=draw(_maybe),
        ttft=draw(_maybe),
        ttfat=draw(_maybe),
        tpot=draw(_maybe),
        tokens_per_second=draw(_maybe),
        request_overhead=draw(_maybe),
        response_overhead=draw(_maybe),
        input_tokens=draw(_count),
        output_tokens=draw(_count),
        reasoning_tokens=draw(_count),
        cached_input_tokens=draw(_count),
        token_count_source=draw(st.sampled_from(list(TokenCountSource))),
        cache=draw(st.sampled_from([None, *CacheClass])),
        gaps=gaps,
        gap_runs=runs if gaps else (),
        time_to_first_tool_call=draw(_maybe) if calls else None,
        tool_call_count=calls,
        tool_call_assembly=tuple(draw(st.lists(st.floats(0, 3), min_size=calls, max_size=calls))),
        finish_reasons=draw(st.lists(st.sampled_from(["stop", "length", " EOS", "x"]), max_size=3)),
        engine=engine,
        parse_errors=draw(st.integers(0, 2)),
        objectives_invalid=draw(st.sampled_from([(), ("ttft",), ("ttft", "tpot")])),
        judgement=judgement,
        trace_id=draw(st.sampled_from([None, "0af7651916cd43dd8448eb211c80319c"])),
    )


@settings(max_examples=40, deadline=None)
@given(
    requests=st.lists(summaries(), min_size=1, max_size=8),
    tenants=st.booleans(),
    forget_at=st.integers(0, 8),
)
def test_record_leaves_the_page_as_one_labels_update_per_family(requests, tenants, forget_at):
    """Any mix of requests (repeating label combinations, so rows are reused; an idle model
    forgotten between two of them), recorded through the rows and through the reference,
    gives the same page."""
    pages = []
    for through_rows in (False, True):
        registry = CollectorRegistry()
        metrics = SidecarMetrics(registry, slo=SLOThresholds(0.5, 0.05, 20.0), tenants=tenants)
        for i, t in enumerate(requests):
            if i == forget_at:
                metrics.forget("model", "m")
            if through_rows:
                metrics.record(t)
            else:
                reference_record(metrics, t)
        pages.append(_page(registry))
    assert pages[0] == pages[1]
