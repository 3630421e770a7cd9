"""The repeating event (sidecar/streams/protocols/template.py) against its oracle.

A dialect that recognises its repeating event from the bytes must give, feed for feed,
exactly what it gives when it decodes every event (``_learning = 0`` makes one that never
learns a template: the decoded path, the oracle). Checked on every SSE fixture (recordings
of real vLLM 0.32 and llama.cpp servers among them) fed event by event as servers flush
them, and on generated streams whose token texts are anything at all: plain, escaped,
quoted, control characters, invalid UTF-8, empty, and events of other shapes between them.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, strategies as st

from sidecar.streams.protocols import _base
from sidecar.streams.protocols.openai import OpenAIStreamDialect
from sidecar.streams.protocols.template import EventTemplate, plain
from tests.fixtures.streams.expected import DIALECTS
from tests.fixtures.streams.harness import FAST, events_of, load
from tests.support.event_shapes import OTHERS, SHAPES, VLLM, texts

SSE_FIXTURES = [(d, name) for d in DIALECTS if not d.ndjson for name in sorted(d.cases)]


def oracle(make):
    """The same dialect, decoding every event."""
    d = make()
    d._learning = 0
    return d


def feeds(d, chunks: list[bytes]) -> list[list]:
    return [d.feed(c) for c in chunks] + [d.close()]


class CountingLoads:
    """orjson.loads that counts its calls (how many events were decoded)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, data):
        self.calls += 1
        return orjson.loads(data)


@pytest.fixture
def decodes(monkeypatch) -> CountingLoads:
    counter = CountingLoads()
    monkeypatch.setattr(
        _base,
        "orjson",
        type("orjson", (), {"loads": counter, "JSONDecodeError": orjson.JSONDecodeError}),
    )
    return counter


@pytest.mark.parametrize(
    ("dialect", "name"), SSE_FIXTURES, ids=[f"{d.folder}/{n}" for d, n in SSE_FIXTURES]
)
def test_fixture_event_by_event_reads_as_the_oracle(dialect, name):
    chunks = events_of(load(dialect.folder, name), ndjson=False)
    assert feeds(dialect.make(), chunks) == feeds(oracle(dialect.make), chunks)


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("vllm032_chat_no_usage.txt", b'"content":"ditions"'),
        ("llamacpp_b11434_chat.txt", b'"content":"ditions"'),
        ("vllm032_chat_per_request_metrics_no_usage.txt", b'"content":"X"'),
    ],
)
def test_real_servers_repeating_event_is_not_decoded_again(name, token, decodes):
    """A recording's own token event, the text changed as a longer answer's would: two
    decodes arm the template, then only the events of another shape (role, finish, usage,
    [DONE]) are decoded."""
    recorded = events_of(load("openai", name), ndjson=False)
    first = next(i for i, c in enumerate(recorded) if token in c)
    last = max(i for i, c in enumerate(recorded) if token in c)
    words = [f" w{i}".encode() for i in range(40)]
    chunks = (
        recorded[:first]
        + [recorded[first].replace(token, b'"content":"' + w + b'"') for w in words]
        + recorded[last + 1 :]
    )
    d = OpenAIStreamDialect()
    assert feeds(d, chunks) == feeds(oracle(OpenAIStreamDialect), chunks)
    decodes.calls = 0
    feeds(OpenAIStreamDialect(), chunks)
    others = len(chunks) - len(words)
    assert decodes.calls <= others + 2, f"{decodes.calls} of {len(chunks)} events decoded"


def test_continuous_usage_reads_as_the_oracle():
    """Each event's cumulative usage (vLLM ``continuous_usage_stats``) differs outside the
    text, and its events are more than one token: nothing is learned."""
    chunks = [
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":" w%d"},"finish_reason":null}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}\n\n'
        % (i, i + 1, i + 4)
        for i in range(20)
    ]
    d = OpenAIStreamDialect()
    assert feeds(d, chunks) == feeds(oracle(OpenAIStreamDialect), chunks)
    assert d._memo is None and d._candidate is None


def test_a_shape_that_never_repeats_stops_the_learning():
    """Single-token events that differ outside the text (a server stamping each with its
    own time): the dialect tries LEARN_TRIES templates, then stops trying."""
    chunks = [
        b'data: {"id":"c","created":%d,"choices":[{"index":0,"delta":{"content":" w%d"},"finish_reason":null}]}\n\n'
        % (1000 + i, i)
        for i in range(20)
    ]
    d = OpenAIStreamDialect()
    assert feeds(d, chunks) == feeds(oracle(OpenAIStreamDialect), chunks)
    assert d._memo is None
    assert d._learning == 0


# -- generated streams ------------------------------------------------------------------------

events = st.one_of(
    st.tuples(st.sampled_from(range(len(SHAPES))), texts).map(
        lambda p: SHAPES[p[0]].replace(b'"@"', b'"' + p[1] + b'"')
    ),
    st.sampled_from(OTHERS),
)


@FAST
@given(
    st.lists(events, max_size=40),
    st.sampled_from([None, 60, 120, 200, 400]),
    st.sampled_from([b"data: ", b"data:"]),
)
def test_generated_streams_read_as_the_oracle(payloads, max_line, field):
    chunks = [field + p + b"\n\n" for p in payloads]
    make = lambda: OpenAIStreamDialect(max_line_bytes=max_line)  # noqa: E731
    assert feeds(make(), chunks) == feeds(oracle(make), chunks)


@FAST
@given(st.sampled_from(range(len(SHAPES))), st.lists(texts, min_size=1, max_size=30))
def test_one_shape_many_texts_reads_as_the_oracle(shape, raw_texts):
    """The case the template is for: one shape, the text changing (and sometimes not
    plain, or not JSON at all)."""
    chunks = [
        b"data: " + SHAPES[shape].replace(b'"@"', b'"' + t + b'"') + b"\n\n" for t in raw_texts
    ]
    assert feeds(OpenAIStreamDialect(), chunks) == feeds(oracle(OpenAIStreamDialect), chunks)


# -- the template itself ----------------------------------------------------------------------


@FAST
@given(
    st.one_of(
        st.binary(max_size=12),
        st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )
)
def test_plain_text_decodes_to_itself(raw):
    """What ``plain`` accepts, a JSON decoder reads back as exactly those bytes."""
    if plain(raw):
        assert orjson.loads(b'"' + raw + b'"').encode() == raw


@pytest.mark.parametrize(
    "raw",
    [
        b'"',
        b"\\",
        b"a\x00",
        b"\n",
        b"\x1f",
        b"\xff",
        b"\xed\xa0\x80",
        b"\xc0\xaf",
        "\u2028".encode(),
    ],
)
def test_not_plain(raw):
    assert not plain(raw)


def event(data: bytes, field: bytes = b"data: ") -> bytes:
    return field + data + b"\n\n"


def test_learn_needs_the_text_once_and_verbatim():
    twice = b'{"model":"hi","choices":[{"delta":{"content":"hi"}}]}'
    assert EventTemplate.learn(event(twice), twice, "hi", []) is None  # which one is the text?
    escaped = b'{"content":"a\\/b"}'
    assert EventTemplate.learn(event(escaped), escaped, "a/b", []) is None
    assert EventTemplate.learn(event(b'{"content":""}'), b'{"content":""}', "", []) is None
    t = EventTemplate.learn(event(b'{"content":"ab"}'), b'{"content":"ab"}', "ab", [])
    assert t is not None and t.spaced and t.text == b"ab"
    assert t.text_of(event(b'{"content":"xyz"}')) == b"xyz"
    assert t.text_of(event(b'{"content":"x\\"y"}')) is None
    assert t.frames(event(b'{"content":"x\\"y"}')) and not t.frames(event(b'{"text":"xy"}'))
    t.limit = 25
    assert t.matches(event(b'{"content":"xyz"}'))  # 25 bytes
    assert not t.matches(event(b'{"content":"wxyz"}'))  # past the framing's bounds
    assert not t.matches(event(b'{"content":""}'))
    assert not t.matches(event(b'{"content":"x\ny"}'))
    assert not t.matches(event(b'{"content":"xyz"}', b"data:"))  # another spelling


def test_a_server_writing_data_without_its_space_gets_the_template(decodes):
    """axum (TGI's OpenAI route) writes ``data:`` with no space: the template is learned in
    that spelling."""
    chunks = [b"data:" + VLLM.replace(b'"@"', b'" w%d"' % i) + b"\n\n" for i in range(30)]
    assert feeds(OpenAIStreamDialect(), chunks) == feeds(oracle(OpenAIStreamDialect), chunks)
    decodes.calls = 0
    feeds(OpenAIStreamDialect(), chunks)
    # The first event says the model and id, the second (the state settled) arms.
    assert decodes.calls == 2


def test_a_template_costs_a_few_hundred_bytes_per_stream():
    """What a stream holds for its template: the bytes around the text, once."""
    import tracemalloc

    def held(learn: bool) -> float:
        tracemalloc.start()
        kept = []
        for i in range(100):
            d = OpenAIStreamDialect()
            d._learning = d._learning if learn else 0
            for k in range(10):
                d.feed(
                    b"data: "
                    + VLLM.replace(b'"@"', b'" w%d"' % k).replace(b"chatcmpl-1", b"chatcmpl-%d" % i)
                    + b"\n\n"
                )
            kept.append(d)
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return size / 100

    extra = held(True) - held(False)
    assert 0 < extra < 600, f"{extra:.0f} bytes per stream"


def test_the_text_must_be_what_varies():
    """The token text written escaped while another field holds the same text verbatim:
    a template learned on that field never arms (the decoded text does not follow it)."""
    chunks = [
        b'data: {"model":"a/b","choices":[{"index":0,"delta":{"content":"a\\/b"},"finish_reason":null}]}\n\n',
        b'data: {"model":"zz","choices":[{"index":0,"delta":{"content":"a\\/b"},"finish_reason":null}]}\n\n',
        b'data: {"model":"yy","choices":[{"index":0,"delta":{"content":"a\\/b"},"finish_reason":null}]}\n\n',
    ]
    d = OpenAIStreamDialect()
    assert feeds(d, chunks) == feeds(oracle(OpenAIStreamDialect), chunks)
    assert d._memo is None


BAD_TEXTS = [
    b'a\\"b',
    b'a"b',
    b"a\\nb",
    b"\x01",
    b"a\tb",
    b"\xff",
    b"\xed\xa0\x80",
    b"\\u00e9",
    b"\\ud800",
    b"",
    b"\xe2\x80\xa8",
]


@pytest.mark.parametrize("bad", BAD_TEXTS)
@pytest.mark.parametrize(
    "shape", range(len(SHAPES) - 1)
)  # the last never arms (its text is not once)
def test_armed_template_meets_a_text_that_is_not_plain(shape, bad):
    """Armed on two plain texts, then an event of the same shape whose text is escaped,
    broken JSON, invalid UTF-8 or empty: it is decoded, and reads as the oracle reads it."""
    event = lambda t: b"data: " + SHAPES[shape].replace(b'"@"', b'"' + t + b'"') + b"\n\n"  # noqa: E731
    chunks = [
        event(b"one"),
        event(b"two"),
        event(b"three"),
        event(bad),
        event(b"four"),
        event(b"five"),
        event(b"six"),
    ]
    d = OpenAIStreamDialect()
    got = [d.feed(c) for c in chunks[:3]]
    assert d._memo is not None, "the template arms on two different plain texts"
    got += [d.feed(c) for c in chunks[3:]] + [d.close()]
    assert got == feeds(oracle(OpenAIStreamDialect), chunks)


class StatefulDialect(_base.SSEJSONDialect):
    """A toy dialect whose events depend on how many events it has seen: its state is never
    a fixed point, so no template may arm (the oracle's answer changes at the fourth)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def _token_text(self, obj):
        return obj.get("t")

    def _state(self):
        return self.seen

    def _object(self, obj, event, out):
        self.seen += 1
        out.append(_base.ANSWER if self.seen < 4 else _base.REASONING)


def test_a_state_that_moves_never_arms():
    chunks = [b'data: {"t":"w%d"}\n\n' % i for i in range(8)]
    d = StatefulDialect()
    assert feeds(d, chunks) == feeds(oracle(StatefulDialect), chunks)
    assert d._memo is None


def test_escaped_texts_are_decoded_and_the_template_stays(decodes):
    """Real answers have newlines and quotes, which JSON escapes: those events are decoded,
    the template stays armed for the plain ones after them."""
    texts = [b"w%d" % i if i % 5 else b"line\\n%d" % i for i in range(1, 41)]
    chunks = [b"data: " + VLLM.replace(b'"@"', b'"' + t + b'"') + b"\n\n" for t in texts]
    assert feeds(OpenAIStreamDialect(), chunks) == feeds(oracle(OpenAIStreamDialect), chunks)
    decodes.calls = 0
    feeds(OpenAIStreamDialect(), chunks)
    # The first event also says the model and id, the next arms, then only the 8 escaped.
    assert decodes.calls == 2 + 8


class NewlineDialect(StatefulDialect):
    """A toy dialect whose state moves only on a text with a newline in it (escaped, so
    never plain): after one, its events change."""

    def _object(self, obj, event, out):
        if "\n" in obj.get("t", ""):
            self.seen += 1
        out.append(_base.ANSWER if not self.seen else _base.REASONING)


def test_an_escaped_text_that_moves_the_state_drops_the_template():
    chunks = [b'data: {"t":"w%d"}\n\n' % i for i in range(3)] + [b'data: {"t":"a\\nb"}\n\n']
    chunks += [b'data: {"t":"v%d"}\n\n' % i for i in range(3)]
    d = NewlineDialect()
    assert feeds(d, chunks) == feeds(oracle(NewlineDialect), chunks)


# -- arming from one event --------------------------------------------------------------------

ROLE = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'


def token(text: bytes, shape: bytes = VLLM) -> bytes:
    return b"data: " + shape.replace(b'"@"', b'"' + text + b'"') + b"\n\n"


class ConfirmedOnly(OpenAIStreamDialect):
    """The same dialect arming only on a second event's confirmation (never from one)."""

    def _learn(self, chunk, data, obj, out, settled=None):
        super()._learn(chunk, data, obj, out, None)


def test_a_settled_token_event_arms_at_once(decodes):
    """The first token after the role: one content delta, no usage, no backslash. The
    dialect settles it (read again, it would change nothing), so it arms the template by
    itself: the second token is not decoded."""
    chunks = [ROLE, token(b" a"), token(b" b"), token(b" c"), token(b" d")]
    d = OpenAIStreamDialect()
    d.feed(chunks[0])
    d.feed(chunks[1])
    assert d._memo is not None and d._memo.one_token is not None
    decodes.calls = 0
    assert [d.feed(c) for c in chunks[2:]] == [[_base.ANSWER]] * 3
    assert decodes.calls == 0


def test_an_event_with_usage_is_not_settled():
    """Usage on a token event (the count may be per chunk): its repeat is not known to be
    the same, so a second event confirms, as before."""
    shape = VLLM[:-1] + b',"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
    chunks = [ROLE, token(b" a", shape), token(b" b", shape), token(b" c", shape)]
    d = OpenAIStreamDialect()
    d.feed(chunks[0])
    d.feed(chunks[1])
    assert d._memo is None
    assert feeds(OpenAIStreamDialect(), chunks) == feeds(oracle(OpenAIStreamDialect), chunks)
    assert feeds(OpenAIStreamDialect(), chunks) == feeds(oracle(OpenAIStreamDialect), chunks)


@pytest.mark.parametrize(
    "shape",
    [
        VLLM.replace(b'"id":"chatcmpl-1"', b'"id":"chat\\/1"'),  # an escape outside the text
        VLLM.replace(b'"model":"m"', b'"model":"\\u0041"'),
    ],
)
def test_a_backslash_anywhere_waits_for_a_second_event(shape):
    """An escape anywhere in the event: where its text is written is not known from one
    event, so the template waits for a second with another text."""
    chunks = [ROLE, token(b" a", shape), token(b" b", shape), token(b" c", shape)]
    d = OpenAIStreamDialect()
    for c in chunks[:2]:
        d.feed(c)
    assert d._memo is None and d._candidate is not None
    d.feed(chunks[2])
    assert d._memo is not None
    assert feeds(OpenAIStreamDialect(), chunks) == feeds(oracle(OpenAIStreamDialect), chunks)


def test_the_text_written_verbatim_twice_never_arms_from_one_event():
    """The text also verbatim in another field: which one is the text is not known."""
    shape = SHAPES[-1]  # the id, the model and the content hold the same text
    chunks = [ROLE] + [token(b"w", shape)] * 3
    d = OpenAIStreamDialect()
    assert feeds(d, chunks) == feeds(oracle(OpenAIStreamDialect), chunks)
    assert d._memo is None


@FAST
@given(
    st.lists(st.sampled_from(OTHERS), max_size=3),
    st.sampled_from(range(len(SHAPES))),
    st.lists(texts, min_size=1, max_size=20),
    st.lists(events, max_size=6),
)
def test_arming_from_one_event_reads_as_the_confirmed_path_and_the_oracle(
    before, shape, raw_texts, after
):
    """The same streams, whole events as servers flush them: the dialect arming from one
    event, the one that waits for a second, and the decoded path give the same events."""
    chunks = [b"data: " + p + b"\n\n" for p in before]
    chunks += [token(t, SHAPES[shape]) for t in raw_texts]
    chunks += [b"data: " + p + b"\n\n" for p in after]
    got = feeds(OpenAIStreamDialect(), chunks)
    assert got == feeds(ConfirmedOnly(), chunks)
    assert got == feeds(oracle(OpenAIStreamDialect), chunks)
