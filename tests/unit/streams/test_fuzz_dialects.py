"""One property over every route the sidecar measures, so a dialect added to the route table is
fuzzed without anyone writing a test for it.

For each route's stream dialect (and its whole-body JSON parser), any byte sequence at any
split points, with any line bound:

- no exception escapes ``feed``/``close`` (the observer would contain one, but a dialect that
  raises loses the rest of that response's figures, so it is a bug);
- the events do not depend on where the bytes were split (a TCP read boundary must not
  change a measurement), also when lines overflow the bound;
- the observer fed the same bytes leaves the timeline consistent.

The bytes are a hostile mix (``tests/support/fuzz.py``): real recorded streams of every dialect cut into lines, random
bytes, every line-end style, BOMs, long lines past the bound, invalid UTF-8, and JSON objects
built from the keys the dialects read. The per-dialect suites test meanings; this one tests
robustness across all of them. ``scripts/fuzz.py`` runs the same properties much longer.
"""

from __future__ import annotations

import json
from functools import partial

from hypothesis import given, settings, strategies as st
from prometheus_client import CollectorRegistry

from sidecar.base.outcomes import Outcome
from sidecar.base.routes import ROUTES
from sidecar.export.metrics import SidecarMetrics
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.dialects import dialect_of
from sidecar.streams.protocols.events import (
    EngineTimings,
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    Tokens,
    Usage,
)
from sidecar.streams.sse import SSEDecoder
from tests.fixtures.streams.harness import run, split_at
from tests.support.fuzz import RECORDED_LINES, hostile_bytes, json_objects

EVENT_TYPES = (Tokens, Usage, ResponseInfo, StreamError, StreamEnd, ParseError, EngineTimings)

# Every measured route, by its template; Triton's dialect takes the model from the path.
STREAM_ROUTES = sorted(t for t, r in ROUTES.items() if r.measured)
JSON_ROUTES = sorted(t for t, r in ROUTES.items() if r.measured)


def make_dialect(template: str, max_line: int | None = None):
    route = ROUTES[template]
    kwargs: dict = {"max_line_bytes": max_line} if max_line else {}
    if route.model_from_path:
        kwargs["model"] = "m"
    return dialect_of(route).stream(**kwargs)


max_lines = st.sampled_from([None, 1, 7, 64, 256])


def cuts_for(data: bytes) -> st.SearchStrategy:
    return st.lists(st.integers(0, len(data)), max_size=20)


# -- the properties (plain functions, so scripts/fuzz.py can run them longer) ------------------------


def prop_dialect(template: str, data: bytes, cuts: list[int], max_line: int | None) -> None:
    make = partial(make_dialect, template, max_line)
    whole = run(make, [data])  # raises here if a dialect lets an exception escape
    assert all(isinstance(e, EVENT_TYPES) for e in whole), whole
    assert run(make, split_at(data, cuts)) == whole, "events depend on where the bytes were split"
    assert run(make, [data[i : i + 1] for i in range(len(data))]) == whole


def prop_observer(template: str, data: bytes, cuts: list[int], max_line: int | None) -> None:
    route = ROUTES[template]
    timeline = RequestTimeline(0.0, "POST", template, "m")
    timeline.response_started(0.001, 200, True)
    observer = ResponseObserver(route, timeline, route.stream_mime, max_line_bytes=max_line)
    assert observer.streaming
    for i, chunk in enumerate(split_at(data, cuts)):
        observer.feed(chunk, 0.01 * (i + 1))
    observer.close(1.0)
    assert timeline.stream_tokens >= 0 and timeline.parse_errors >= 0
    assert timeline.finish(Outcome.OK, 1.0)
    # Every figure of whatever arrived can be computed and recorded.
    _ = (
        timeline.ttft,
        timeline.tpot,
        timeline.tokens_per_second,
        timeline.e2e,
        timeline.output_tokens,
    )
    SidecarMetrics(CollectorRegistry()).record(summarize(timeline, "m"))


def prop_json(template: str, data: bytes) -> None:
    events = dialect_of(ROUTES[template]).json(data)
    assert all(isinstance(e, EVENT_TYPES) for e in events), events


def prop_sse(data: bytes, cuts: list[int], max_line: int | None) -> None:
    make = partial(SSEDecoder, max_line) if max_line else SSEDecoder
    whole = run(make, [data])
    assert run(make, split_at(data, cuts)) == whole
    decoder = make()
    for chunk in split_at(data, cuts):
        decoder.feed(chunk)
        assert len(decoder._tail) <= (max_line or 1 << 20) + 3  # held bytes stay bounded


# -- the tests -----------------------------------------------------------------------------------------

FUZZ = settings(max_examples=60, deadline=None)


@FUZZ
@given(st.sampled_from(STREAM_ROUTES), st.data(), max_lines)
def test_every_stream_dialect_any_bytes_any_split(template, data, max_line):
    raw = data.draw(hostile_bytes)
    prop_dialect(template, raw, data.draw(cuts_for(raw)), max_line)


@FUZZ
@given(st.sampled_from(STREAM_ROUTES), st.data(), max_lines)
def test_every_route_observer_contains_any_bytes(template, data, max_line):
    raw = data.draw(hostile_bytes)
    prop_observer(template, raw, data.draw(cuts_for(raw)), max_line)


@FUZZ
@given(
    st.sampled_from(JSON_ROUTES),
    st.one_of(hostile_bytes, json_objects.map(lambda o: json.dumps(o).encode())),
)
def test_every_json_parser_any_body(template, body):
    prop_json(template, body)


@FUZZ
@given(st.data(), max_lines)
def test_sse_decoder_any_bytes_any_split_bounded(data, max_line):
    raw = data.draw(hostile_bytes)
    prop_sse(raw, data.draw(cuts_for(raw)), max_line)


def test_every_measured_route_is_fuzzed():
    """The route table is the source: nothing measured escapes these properties."""
    assert {t for t, r in ROUTES.items() if r.measured} == set(STREAM_ROUTES) | set(JSON_ROUTES)
    assert len(STREAM_ROUTES) == 11 and len(RECORDED_LINES) > 50
