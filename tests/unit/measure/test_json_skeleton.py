"""The JSON skeleton reader: within its bounds the copy is the body's
document, so every route's whole-body parser gives the same events on it; fed whole, byte
by byte and at random splits; on hostile bodies its copy, memory and work stay bounded."""

from __future__ import annotations

import random
import time

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from sidecar.base.routes import ROUTES
from sidecar.measure import json_skeleton as js
from sidecar.measure.json_skeleton import (
    MAX_KEPT_DEPTH,
    MAX_MEMBERS,
    MAX_OUTPUT_BYTES,
    MAX_STRING_BYTES,
    JsonSkeleton,
    json_skeleton,
)
from sidecar.measure.observe import SMALL_JSON_BYTES, ResponseObserver
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.dialects import DIALECTS
from sidecar.streams.protocols.events import ParseError
from tests.support.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
# Every recorded non-streamed body: real servers' answers and the dialects' recorded shapes.
BODIES = sorted(p for p in FIXTURES.rglob("*.json") if not p.name.endswith(".meta.json"))
BODY_IDS = [str(p.relative_to(FIXTURES)) for p in BODIES]
PARSERS = {d.json for d in DIALECTS.values()}
PARSER_IDS = sorted(p.__name__ for p in PARSERS)


def split_feed(body: bytes, cuts: list[int]) -> bytes | None:
    reader = JsonSkeleton()
    for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
        reader.feed(body[a:b])
    return reader.close()


def random_cuts(body: bytes, rng: random.Random) -> list[int]:
    return (
        sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 40))))
        if len(body) > 1
        else []
    )


def copies(body: bytes, rng: random.Random) -> list[bytes | None]:
    """The copy made whole, byte by byte (short bodies), at random splits and in 64 KiB pieces."""
    out = [
        json_skeleton(body),
        split_feed(body, random_cuts(body, rng)),
        split_feed(body, list(range(65536, len(body), 65536))),
    ]
    if len(body) < 5000:
        out.append(split_feed(body, list(range(1, len(body)))))
    return out


def loads(doc: bytes | None) -> object:
    try:
        return orjson.loads(doc)
    except (orjson.JSONDecodeError, TypeError):
        return "<invalid>"


def same_events(body: bytes, copy: bytes) -> None:
    for parser in PARSERS:
        assert parser(copy) == parser(body), parser.__name__


# -- within the bounds: the same document ----------------------------------------------------


def test_the_recorded_bodies_are_here():
    assert len(BODIES) >= 30
    assert {p.parent.name for p in BODIES} >= {
        "anthropic",
        "llamacpp",
        "ollama",
        "openai",
        "responses",
        "sglang",
        "tgi",
        "triton",
    }


@pytest.mark.parametrize("path", BODIES, ids=BODY_IDS)
def test_recorded_bodies_give_the_same_events_through_the_copy(path):
    body = path.read_bytes()
    for copy in copies(body, random.Random(path.name)):
        assert copy is not None
        assert loads(copy) == orjson.loads(body)
        same_events(body, copy)


def padded(body: bytes, rng: random.Random) -> bytes:
    """The body with content no parser reads and every bound at work: a 100 KB string with
    escapes, an array of 5,000 members, a 40-level nest, a long number and many keys,
    added as the first members of its top-level object."""
    pad = (
        b'{"pad_text":"' + b'caf\xc3\xa9 \\"q\\" \\ud83e\\udd99 ' * 5000 + b'",'
        b'"pad_list":[' + b",".join(b'{"t":"x","p":-0.5,"b":[1,2]}' for _ in range(5000)) + b"],"
        b'"pad_deep":' + b'{"a":[' * 40 + b"1" + b"]}" * 40 + b","
        b'"pad_number":' + b"1" * 100 + b","
        b'"pad_keys":{' + b",".join(b'"k%d":%d' % (i, i) for i in range(3000)) + b"},"
    )
    assert body.lstrip().startswith(b"{")
    return pad + body.lstrip()[1:]


def recorded_and_padded(path, seed: int) -> tuple[bytes, bytes]:
    """A recorded body and its ``padded`` copy; skips a body that is not a JSON object."""
    body = path.read_bytes()
    if not body.lstrip().startswith(b"{"):
        pytest.skip("not an object")
    return body, padded(body, random.Random(seed))


@pytest.mark.parametrize("path", BODIES, ids=BODY_IDS)
def test_recorded_bodies_padded_past_every_bound_give_the_same_events(path):
    body, big = recorded_and_padded(path, seed=1)
    assert len(big) > 2 * SMALL_JSON_BYTES
    for copy in copies(big, random.Random(path.name)):
        assert copy is not None and len(copy) < 64 << 10
        doc = orjson.loads(copy)
        assert {k: v for k, v in doc.items() if not k.startswith("pad_")} == orjson.loads(body)
        assert len(doc["pad_list"]) == MAX_MEMBERS and len(doc["pad_keys"]) == MAX_MEMBERS
        assert 0 < len(doc["pad_text"].encode()) <= MAX_STRING_BYTES
        assert doc["pad_number"] is None
        same_events(body, copy)


# Documents built from the keys the parsers read, inside the bounds.
READ_KEYS = [
    "id",
    "model",
    "model_name",
    "object",
    "type",
    "status",
    "choices",
    "finish_reason",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "completion_tokens_details",
    "reasoning_tokens",
    "metrics",
    "timings",
    "prompt_n",
    "cache_n",
    "predicted_n",
    "prompt_ms",
    "predicted_ms",
    "error",
    "message",
    "code",
    "stop_reason",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "details",
    "generated_tokens",
    "input_length",
    "prefill",
    "meta_info",
    "queue_time",
    "done",
    "done_reason",
    "eval_count",
    "prompt_eval_count",
    "eval_duration",
    "load_duration",
    "stop_type",
    "tokens_predicted",
    "tokens_evaluated",
    "incomplete_details",
    "reason",
    "text",
    "content",
]
text = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["", "stop", "length", 'a"b\\c\n\u00e9\U0001f999']
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)


def documents(max_members: int = 8):
    keys = st.sampled_from(READ_KEYS) | st.text(max_size=8)
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=max_members)
            | st.dictionaries(keys, inner, max_size=max_members)
        ),
        max_leaves=60,
    )


def render(doc: object, rng: random.Random) -> bytes:
    """orjson's bytes, or the same document with whitespace and \\u escapes as other
    servers write it (Python's json: ASCII only, spaces after separators)."""
    import json

    if rng.random() < 0.5:
        return orjson.dumps(doc)
    return json.dumps(doc, indent=rng.choice([None, 1, "\t"])).encode()


@settings(max_examples=300, deadline=None)
@given(doc=documents(), seed=st.integers(0, 2**32))
def test_generated_documents_within_the_bounds_are_copied_exactly(doc, seed):
    rng = random.Random(seed)
    body = render(doc, rng)
    for copy in copies(body, rng):
        assert loads(copy) == loads(body)
        same_events(body, copy)


@settings(max_examples=60, deadline=None)
@given(doc=documents(), seed=st.integers(0, 2**32))
def test_generated_documents_inside_a_large_body_are_copied_exactly(doc, seed):
    """The same, in a body large enough to take the observer's skeleton path."""
    rng = random.Random(seed)
    body = b'{"pad":"' + b"x" * (SMALL_JSON_BYTES + 10) + b'","doc":' + render(doc, rng) + b"}"
    for copy in copies(body, rng):
        got = loads(copy)
        assert got["doc"] == orjson.loads(body)["doc"]


def pruned(doc: object, depth: int = 1) -> object:
    """What the copy of an escape-free ASCII document must be: containers cut to their first
    MAX_MEMBERS members, those deeper than MAX_KEPT_DEPTH emptied, strings to MAX_STRING_BYTES."""
    if isinstance(doc, str):
        return doc[:MAX_STRING_BYTES]
    if isinstance(doc, list):
        return [] if depth > MAX_KEPT_DEPTH else [pruned(v, depth + 1) for v in doc[:MAX_MEMBERS]]
    if isinstance(doc, dict):
        return (
            {}
            if depth > MAX_KEPT_DEPTH
            else {
                k[:MAX_STRING_BYTES]: pruned(v, depth + 1)
                for k, v in list(doc.items())[:MAX_MEMBERS]
            }
        )
    return doc


def nest(depth: int, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


ascii_text = st.text("abc ,:[]{}xyz", max_size=3) | st.integers(1, 3000).map(lambda n: "s" * n)
past_bounds = st.recursive(
    st.none() | st.integers(-5, 5) | ascii_text,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(ascii_text, inner, max_size=4)
        | st.tuples(inner, st.integers(250, 300)).map(lambda t: [t[0]] * t[1])
        | st.tuples(inner, st.integers(250, 300)).map(
            lambda t: {f"k{i}": t[0] for i in range(t[1])}
        )
        | st.tuples(inner, st.integers(10, 30)).map(lambda t: nest(t[1], t[0]))
    ),
    max_leaves=6,
)


def gives_up(body: bytes) -> bool:
    """Whether the reader may give up: its copy past the cap, or its step budget spent
    (a document made mostly of tokens to keep, thousands of them)."""
    reader = JsonSkeleton()
    reader.feed(body)
    return (
        len(orjson.dumps(pruned(orjson.loads(body)))) > MAX_OUTPUT_BYTES
        or reader.steps > js._STEP_ALLOWANCE
    )


@settings(max_examples=40, deadline=None)
@given(doc=past_bounds, seed=st.integers(0, 2**32))
def test_documents_past_the_bounds_are_pruned_as_documented(doc, seed):
    rng = random.Random(seed)
    body = orjson.dumps(doc)
    for copy in copies(body, rng):
        if copy is None:
            assert gives_up(body)
            continue
        assert orjson.loads(copy) == pruned(doc)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b" ",
        b"{",
        b'{"a":1',
        b'{"a":1}x',
        b'{"a":1}}',
        b"]",
        b"[1,2,]",
        b'{"a" 1}',
        b'{"a":tru}',
        b'{"a":"\xff"}',
        b'"abc',
        b'{"a":"\\x"}',
        b"\x00",
        b"{\x0c}",
        b'{"a":1e400}',
        b"nul",
        b"[1] [2]",
        b'{"a":[' + b"1," * 1000 + b"]}",  # broken past the kept members: not seen
    ],
)
def test_invalid_bodies_never_raise_and_give_a_parse_error_or_the_bounded_copy(body):
    for copy in copies(body, random.Random(1)):
        assert copy is not None and len(copy) <= len(body) + 1
        if loads(body) == "<invalid>" and b"1," * 300 not in body:
            assert loads(copy) == "<invalid>", copy
            for parser in PARSERS:
                events = parser(copy)
                assert events == parser(body)
                assert any(type(e) is ParseError for e in events)


# -- the cut string is still a string ---------------------------------------------------------


@pytest.mark.parametrize(
    "unit",
    [
        b"a",
        b"\xc3\xa9",
        b"\xe2\x82\xac",
        b"\xf0\x9f\xa6\x99",
        b"\\n",
        b"\\u00e9",
        b"\\ud83e\\udd99",
        b"\\\\",
        b'\\"',
    ],
)
@pytest.mark.parametrize("shift", range(7))
def test_a_long_string_is_cut_at_a_whole_character_or_escape(unit, shift):
    body = b'{"m":"' + b"x" * shift + unit * 2000 + b'"}'
    full = orjson.loads(body)["m"]
    for copy in copies(body, random.Random(shift)):
        got = orjson.loads(copy)["m"]
        assert got and full.startswith(got)
        assert (
            MAX_STRING_BYTES - 12 <= len(orjson.dumps(got)) - 2 <= MAX_STRING_BYTES
            or b"\\u" in unit
        )


# -- hostile bodies: bounded copy, memory and work ---------------------------------------------

MiB = 1 << 20


HOSTILE = {  # name -> (body, whether a copy comes out)
    "a million empty objects": (
        lambda: (
            b'{"choices":[' + b",".join([b"{}"] * 1_000_000) + b'],"usage":{"prompt_tokens":3}}'
        ),
        True,
    ),
    "a 15 MiB string": (
        lambda: (
            b'{"choices":[{"message":{"content":"'
            + b"x" * (15 * MiB)
            + b'"}}],"usage":{"prompt_tokens":3}}'
        ),
        True,
    ),
    "a 15 MiB string of escapes": (
        lambda: b'{"error":{"message":"' + b'\\"' * (7 * MiB) + b'"}}',
        True,
    ),
    "100k-deep nesting": (lambda: b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", False),
    "1M top-level keys": (
        lambda: b"{" + b",".join([b'"k%d":1' % (i % 1000) for i in range(1_000_000)]) + b"}",
        True,
    ),
    "a 15 MiB number": (lambda: b'{"a":' + b"1" * (15 * MiB) + b"}", True),
    "a comb of tiny containers": (
        lambda: (b"[" + b"[0," * 1000 + b"0" + b"]" * 1000 + b",") * 1000 + b"0]",
        False,
    ),
    "only tokens to keep": (
        lambda: b"[" + b",".join([b"[" + b",".join([b"0"] * 300) + b"]"] * 3000) + b"]",
        False,
    ),
    "invalid bytes": (lambda: random.Random(5).randbytes(2 * MiB), True),
}


def feed_pieces(body: bytes) -> tuple[JsonSkeleton, bytes | None, float, float]:
    """The reader fed 64 KiB pieces: it, its copy, the CPU time of all feeds and of the largest."""
    reader = JsonSkeleton()
    largest = 0.0
    start = time.thread_time()
    for i in range(0, len(body), 65536):
        t = time.thread_time()
        reader.feed(body[i : i + 65536])
        largest = max(largest, time.thread_time() - t)
    copy = reader.close()
    return reader, copy, time.thread_time() - start, largest


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_bodies_give_a_bounded_copy_in_bounded_memory_and_time(name):
    import tracemalloc

    make, copied = HOSTILE[name]
    body = make()
    reader, copy, total, largest = feed_pieces(body)  # timed without tracemalloc's overhead
    assert (copy is not None) == copied
    if copy is not None:
        assert len(copy) <= 64 << 10
        loads(copy)  # parses or not, never raises
    # The work budget: what any shape can cost, and a loose bound on CPU time (busy CI).
    assert reader.steps <= js._STEP_ALLOWANCE + len(body) // js._BYTES_PER_STEP + 1
    assert total < 1.0 and largest < 0.1, (total, largest)
    tracemalloc.start()
    try:
        feed_pieces(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MiB, peak  # a piece and its slices, never the body


def test_the_reported_case_costs_milliseconds():
    """The finding's body: 15.9 MiB of ``{"choices":[{},{},...]}``, in 64 KiB pieces."""
    body = (
        b'{"choices":['
        + b",".join([b"{}"] * 5_550_000)
        + b'],"usage":{"prompt_tokens":3,"completion_tokens":5}}'
    )
    assert len(body) > 15.8 * MiB
    reader = JsonSkeleton()
    start = time.thread_time()
    for i in range(0, len(body), 65536):
        reader.feed(body[i : i + 65536])
    copy = reader.close()
    total = time.thread_time() - start
    assert reader.steps < 2000  # nearly all of it in C
    assert total < 0.5, total  # about 0.06 s here
    assert copy is not None and len(copy) < 1024
    doc = orjson.loads(copy)
    assert len(doc["choices"]) == MAX_MEMBERS and doc["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
    }


def test_a_copy_past_its_cap_gives_up():
    # Each member is small but the copy would be 256 * 256 * ~40 B, past MAX_OUTPUT_BYTES.
    member = b'{"a":"' + b"y" * 30 + b'"}'
    inner = b"[" + b",".join([member] * 256) + b"]"
    body = b"[" + b",".join([inner] * 256) + b"]"
    assert json_skeleton(body) is None
    assert JsonSkeleton().close() == b""  # nothing fed: an empty copy (the parsers say not JSON)


# -- the observer --------------------------------------------------------------------------


def observe(
    body: bytes, pieces: int, limit: int = 16 << 20, path: str = "/v1/chat/completions"
) -> RequestTimeline:
    route = ROUTES[path]
    t = RequestTimeline(0.0, "POST", route.template, "m")
    observer = ResponseObserver(route, t, "application/json", max_json_bytes=limit)
    t.response_started(0.0, 200, observer.streaming)
    step = max(1, len(body) // pieces)
    for i in range(0, len(body), step):
        observer.feed(body[i : i + step], 0.1)
    observer.close(0.2)
    return t


def figures(t: RequestTimeline) -> tuple:
    return (
        t.usage,
        t.engine_usage,
        t.response_model,
        t.response_id,
        t.parse_errors,
        t.stream_error,
        t.generation_done,
    )


@pytest.mark.parametrize("path", BODIES, ids=BODY_IDS)
def test_the_observer_gives_the_same_figures_for_a_large_body(path):
    body, big = recorded_and_padded(path, seed=2)
    for route in (
        "/v1/chat/completions",
        "/v1/messages",
        "/api/chat",
        "/generate",
        "/completion",
        "/v1/responses",
    ):
        small = observe(body, 1, path=route)
        assert figures(observe(big, 7, path=route)) == figures(small)
        assert figures(observe(big, 1, path=route)) == figures(small)


def test_the_observer_counts_an_unread_body_as_one_parse_error():
    usage = b'"usage":{"prompt_tokens":3,"completion_tokens":5}}'
    read = observe(b'{"choices":[' + b",".join([b"{}"] * 100_000) + b"]," + usage, 30)
    assert (read.parse_errors, read.usage.input_tokens) == (0, 3)
    over = observe(
        b'{"choices":[' + b",".join([b"{}"] * 100_000) + b"]," + usage, 30, limit=100_000
    )
    assert (over.parse_errors, over.usage) == (
        1,
        None,
    )  # past max_response_inspect_bytes, as before
    member = b'{"a":"' + b"y" * 30 + b'"}'
    capped = b'{"x":[' + b",".join([b"[" + b",".join([member] * 256) + b"]"] * 256) + b"]," + usage
    gave_up = observe(capped, 50)
    assert (gave_up.parse_errors, gave_up.usage) == (1, None)  # the copy's own bound
    broken = observe(b'{"pad":"' + b"x" * 100_000 + b'",' + usage[:-1], 3)
    assert (broken.parse_errors, broken.usage) == (
        1,
        None,
    )  # an unfinished body: not JSON, as before
