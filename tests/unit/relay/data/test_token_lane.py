"""The token lanes (sidecar/relay/data/token_lane.py: ``TokenLane`` in sidecar/relay/data/_token_lane.c
where it was built, and the same lane in Python, sidecar/relay/data/token_lane_py.py, which a
compiler-less install uses) against the Python relay path they stand for, which is the oracle.
Every test that relays is run with each lane (the C one skipped where it was not built).

Each stream is relayed twice through the real ``UpstreamConnection`` and ``BodyRelay`` (fake
transports, a scripted clock that holds one time per read): with lanes and with lanes
switched off. The client must get the same bytes (the upstream's chunks as they came), the
relay the same count sent, and the timeline every same figure, gap for gap (the same float
operations on the same times). The lanes must also have taken reads, or the comparison
proves nothing. Reads are one event each, several coalesced, or an event split across
reads; the client's buffer is sometimes not empty (a lane leaves that read to Python), the
progress check comes due, the number of streams decoding moves.
"""

from __future__ import annotations

import asyncio
import sys
from array import array

import pytest
from hypothesis import given, strategies as st

from bench.wire import StreamWire
from sidecar.base.outcomes import Verdict
from sidecar.base.routes import match_route
from sidecar.base.speedups import chunk_payload_py, plain, plain_at_py
from sidecar.measure.concurrency import DecodeConcurrency
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.timeline import RequestTimeline
from sidecar.relay.data import body_relay, token_lane, token_lane_py
from sidecar.relay.data.body_relay import BodyRelay
from sidecar.relay.data.upstream import UpstreamConnection
from tests.fixtures.streams.harness import FAST, HERE
from tests.support.event_shapes import OTHERS, SHAPES, texts
from tests.support.skips import IN_CI

C_LANE = token_lane.TokenLane if token_lane.IN_C_LANE else None
PY_LANE = token_lane_py.TokenLane
LANES = [
    pytest.param(
        C_LANE, id="c",
        marks=pytest.mark.skipif(
            C_LANE is None and not IN_CI,
            reason="the C extension was not built (no C compiler when the package was installed)",
        ),
    ),
    pytest.param(PY_LANE, id="python"),
]  # fmt: skip


@pytest.fixture(params=LANES)
def lane(request, monkeypatch):
    """Each lane in turn, as the one ``lane_for`` builds."""
    assert request.param is not None, "the C lane was not built"
    monkeypatch.setattr(token_lane, "TokenLane", request.param)
    return request.param


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def frame(event: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(event), event)


class Clock:
    """One time per read: every clock call while a read is handled gets the same value, so
    both paths see the same times whatever number of calls each makes."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Pool:
    def __init__(self, loop) -> None:
        self.loop = loop
        self.read_timeout = None

    def _forget(self, conn) -> None:
        pass


class UpstreamTransport:
    def __init__(self) -> None:
        self.paused = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class ClientTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.buffered = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name, default=None):
        return default


async def drain_never_called() -> None:
    raise AssertionError("no relay here waits for its client to drain")


class Step:
    """One read: its bytes, the time it came, the client's buffer then, streams decoding."""

    __slots__ = ("data", "at", "buffered", "decoding")

    def __init__(self, data: bytes, at: float, buffered: int = 0, decoding: int = 1) -> None:
        self.data, self.at, self.buffered, self.decoding = data, at, buffered, decoding


FIGURES = [
    name
    for name in RequestTimeline.__slots__
    if name not in ("decode", "trace", "_grouped", "gaps", "gap_streams")
]


LANE_FOR = body_relay.lane_for  # the real one, before any test patches it


class Running:
    """One response being relayed: a real connection with its head read, the observer, the
    relay and its task, fake transports both sides."""

    async def start(self, path: str, clock: Clock) -> Running:
        loop = asyncio.get_running_loop()
        self.conn = conn = UpstreamConnection(Pool(loop))
        conn.connection_made(UpstreamTransport())
        head = conn.begin(no_body=False)
        conn.data_received(HEAD)
        await head
        route, _ = match_route(path, "POST")
        self.timeline = RequestTimeline(clock.now, "POST", route.template, "m")
        self.observer = ResponseObserver(route, self.timeline, "text/event-stream")
        self.client = ClientTransport()
        # send_timeout 12 s: the client's progress is checked every second (a twelfth of it),
        # so the streams here have reads a check leaves to Python.
        self.relay = BodyRelay(
            self.client, conn, self.observer, clock, send_timeout=12.0, chunked=True
        )
        self.task = asyncio.ensure_future(self.relay.run(drain_never_called))
        await asyncio.sleep(0)  # the relay is pushed to
        return self


def relay(steps: list[Step], path: str, lanes: bool, monkeypatch, lost: bool = False) -> dict:
    """Relay ``steps`` (then the last chunk, or the upstream's connection lost) and return
    what the client got and every figure."""
    made: list = []

    def lane_for(*args, **kwargs):
        lane = LANE_FOR(*args, **kwargs)
        if lane is not None:
            made.append(lane)
        return lane

    monkeypatch.setattr(body_relay, "_LANES", lanes)
    monkeypatch.setattr(body_relay, "lane_for", lane_for)

    async def run() -> dict:
        clock = Clock()
        it = await Running().start(path, clock)
        conn, timeline, observer, client, r = it.conn, it.timeline, it.observer, it.client, it.relay
        timeline.decode = decode = DecodeConcurrency()
        for step in steps:
            clock.now, client.buffered = step.at, step.buffered
            decode.n = step.decoding
            conn.data_received(step.data)
        clock.now += 0.001
        client.buffered = 0
        if lost:
            conn.connection_lost(None)
        else:
            conn.data_received(b"0\r\n\r\n")
        ended = await it.task
        observer.close(clock.now)
        taken = sum(lane.taken for lane in made)
        made.clear()  # (the lanes refer to the relay: not kept past the run)
        out = {name: getattr(timeline, name) for name in FIGURES}
        out.update(
            gaps=timeline.gaps.tolist(),
            gap_streams=timeline.gap_streams.tolist(),
            written=b"".join(client.written),
            sent=r.sent,
            ended=ended,
            taken=taken,
        )
        return out

    return asyncio.run(run())


def both(steps: list[Step], path: str, monkeypatch, lost: bool = False) -> tuple[dict, dict]:
    with_lanes = relay(steps, path, True, monkeypatch, lost)
    without = relay(steps, path, False, monkeypatch, lost)
    assert without["taken"] == 0
    taken = with_lanes.pop("taken")
    without.pop("taken")
    assert with_lanes == without
    with_lanes["taken"] = taken
    return with_lanes, without


def paced(events: list[bytes], gap: float = 0.02, start: float = 100.05) -> list[Step]:
    return [Step(frame(e), start + i * gap) for i, e in enumerate(events)]


def sse_events(body: bytes) -> list[bytes]:
    """A recorded SSE body cut into its events (each with its blank line)."""
    parts = body.split(b"\n\n")
    return [p + b"\n\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


OPENAI = sorted(p.name for p in (HERE / "openai").glob("*.txt"))


@pytest.mark.parametrize("name", OPENAI)
def test_recorded_streams_relay_as_the_python_path(name, lane, monkeypatch):
    """Every OpenAI-dialect recording (real vLLM 0.32 and llama.cpp among them), an event a
    read: the same bytes and figures; the lanes take the tokens of a long enough stream."""
    body = (HERE / "openai" / name).read_bytes()
    path = "/v1/completions" if "completions" in name else "/v1/chat/completions"
    events = sse_events(body)
    got, _ = both(paced(events), path, monkeypatch)
    assert (
        got["written"] == b"".join(frame(e) for e in events) + LAST_CHUNK
    )  # the relay ends the body
    # A tool call's pieces are never a lane's (each is also a ToolCallDelta the timeline times).
    if got["stream_tokens"] >= 8 and not any(
        k in name for k in ("continuous_usage", "force_usage", "tools")
    ):
        assert got["taken"] > 0, "no lane took a read: the comparison proved nothing"


def test_the_bench_stream_with_every_kind_of_text(lane, monkeypatch):
    """The benchmark's vLLM-shaped stream: ASCII, UTF-8 (é, 日本, 🚀) and escaped texts (\\n,
    \\"). Lanes take them all once armed."""
    wire = StreamWire(7, 300)
    events = [wire.role(), *(wire.token(k) for k in range(300)), wire.usage(12), wire.done()]
    got, _ = both(paced(events), "/v1/chat/completions", monkeypatch)
    assert got["stream_tokens"] == 300 and len(got["gaps"]) == 299
    # All but the first few (learning), the last (another shape: its finish_reason) and one
    # a second (the client's progress check: 6 s of stream); the escaped texts too.
    assert got["taken"] >= 300 - 4 - 1 - 7


# Texts in an armed shape: (raw JSON string contents, whether a lane takes it). A lane takes
# plain texts and JSON's one-character escapes; \u escapes, broken escapes and anything
# JSON refuses go the Python way (which decodes them, or counts a parse error).
LANE_TEXTS = [
    (b"a", True),
    (b"caf\xc3\xa9", True),
    (b"\\n", True),
    (b"\\n\\n", True),
    (b'x\\"y', True),
    (b"\\\\", True),
    (b"\\/", True),
    (b"\\t\\b\\f\\r", True),
    (b"\\u00e9", False),
    (b"\\ud83d\\ude80", False),
    (b"\\x", False),
    (b"a\\", False),
    (b"\\", False),
    (b"\\0", False),
    (b"\x7f", False),
    (b"\xe2\x80\xa8", False),
    (b"\xc3", False),
    (b"", False),
]


@pytest.mark.parametrize("raw, taken", LANE_TEXTS)
def test_what_a_lane_takes(raw, taken, lane, monkeypatch):
    """A vLLM shape armed by plain texts (the first event also says the model; the next
    arms it, and the lane opens), then the text under test, then a plain one: the lane takes
    it or leaves it, as listed, and the figures are the Python path's either way."""
    event = lambda t: b"data: " + SHAPES[0].replace(b'"@"', b'"' + t + b'"') + b"\n\n"  # noqa: E731
    stream = [
        event(b"one"),
        event(b"two"),
        event(b"three"),
        event(b"four"),
        event(raw),
        event(b"five"),
    ]
    got, _ = both(paced(stream), "/v1/chat/completions", monkeypatch)
    without_it = relay(paced(stream[:4] + stream[5:]), "/v1/chat/completions", True, monkeypatch)
    assert without_it["taken"] == 3  # three, four and five (one says the model, two arms)
    assert got["taken"] - without_it["taken"] == (1 if taken else 0)


def test_the_client_buffer_the_progress_check_and_decoding_streams(lane, monkeypatch):
    """Reads the lane leaves to Python (a client buffer not empty, the progress check due
    every second) between reads it takes; the streams decoding change under it."""
    wire = StreamWire(3, 200)
    events = [wire.role(), *(wire.token(k) for k in range(200)), wire.done()]
    steps = []
    for i, e in enumerate(events):
        steps.append(
            Step(
                frame(e),
                100.05 + i * 0.013,
                buffered=(700 if i % 17 == 5 else 0),
                decoding=1 + i // 40,
            )
        )
    got, _ = both(steps, "/v1/chat/completions", monkeypatch)
    assert got["taken"] > 100
    assert sorted(set(got["gap_streams"])) == sorted({1 + i // 40 for i in range(1, len(events))})


def test_a_slow_reader_gets_no_lane(lane, monkeypatch):
    """A client whose socket buffer is never empty: a lane would leave every read to Python
    (after trying it, and a flush and a re-open each time), so the relay does not open one;
    the figures are the Python path's."""
    opened = []
    real_set_lane = UpstreamConnection.set_lane

    def set_lane(self, lane):
        if lane is not None:
            opened.append(lane)
        real_set_lane(self, lane)

    monkeypatch.setattr(UpstreamConnection, "set_lane", set_lane)
    wire = StreamWire(6, 80)
    events = [wire.role(), *(wire.token(k) for k in range(80)), wire.done()]
    steps = [Step(frame(e), 100.05 + i * 0.02, buffered=300) for i, e in enumerate(events)]
    got, _ = both(steps, "/v1/chat/completions", monkeypatch)
    assert got["stream_tokens"] == 80
    assert got["taken"] == 0 and not opened
    # The same stream read as it is taken: lanes open.
    got, _ = both(paced(events), "/v1/chat/completions", monkeypatch)
    assert got["taken"] > 60 and opened
    opened.clear()


def test_the_upstream_gone_mid_stream(lane, monkeypatch):
    """The upstream's connection drops between two tokens the lane took: what it noted is in
    the timeline before anyone reads it (the relay flushes as it ends), as on the Python path."""
    wire = StreamWire(4, 80)
    events = [wire.role(), *(wire.token(k) for k in range(40))]
    got, _ = both(paced(events), "/v1/chat/completions", monkeypatch, lost=True)
    assert got["ended"] is Verdict.UPSTREAM_DISCONNECTED
    assert got["stream_tokens"] == 40 and got["taken"] > 20


def test_a_client_gone_mid_stream(lane, monkeypatch):
    """The client's transport closes: the lane leaves the read, the relay ends as the Python
    path ends it, with the same figures up to there."""
    wire = StreamWire(5, 60)
    events = [wire.role(), *(wire.token(k) for k in range(60)), wire.done()]
    results = [
        _relay_until_closed(paced(events), 30, lanes, monkeypatch) for lanes in (True, False)
    ]
    assert results[0] == results[1]
    assert results[0]["ended"] == Verdict.CLIENT_DISCONNECTED


def _relay_until_closed(steps: list[Step], close_at: int, lanes: bool, monkeypatch) -> dict:
    monkeypatch.setattr(body_relay, "_LANES", lanes)

    async def run() -> dict:
        clock = Clock()
        it = await Running().start("/v1/chat/completions", clock)
        client, timeline = it.client, it.timeline
        for i, step in enumerate(steps):
            if i == close_at:
                client.closing = True
            clock.now = step.at
            it.conn.data_received(step.data)
        ended = await it.task
        return {
            "ended": ended,
            "written": b"".join(client.written),
            "sent": it.relay.sent,
            "gaps": timeline.gaps.tolist(),
            "stream_tokens": timeline.stream_tokens,
            "last_token": timeline.last_token,
        }

    return asyncio.run(run())


# -- generated streams: every shape, text and read boundary -----------------------------------

events = st.one_of(
    st.tuples(st.sampled_from(range(len(SHAPES))), texts).map(
        lambda p: b"data: " + SHAPES[p[0]].replace(b'"@"', b'"' + p[1] + b'"') + b"\n\n"
    ),
    st.sampled_from([b"data: " + o + b"\n\n" for o in OTHERS]),
)
# A shape repeated with plain texts, so templates arm, with other events between.
runs = st.tuples(
    st.sampled_from(range(len(SHAPES))),
    st.lists(
        st.sampled_from([b"a", b" b", b"caf\xc3\xa9", b"\xf0\x9f\x9a\x80", b"\\n", b"x y"]),
        min_size=1,
        max_size=12,
    ),
).map(lambda p: [b"data: " + SHAPES[p[0]].replace(b'"@"', b'"' + t + b'"') + b"\n\n" for t in p[1]])


@pytest.mark.parametrize("impl", LANES)
@FAST
@given(
    st.lists(st.one_of(runs, events.map(lambda e: [e])), max_size=12).map(
        lambda xs: [e for x in xs for e in x]
    ),
    st.data(),
)
def test_generated_streams_relay_as_the_python_path(impl, stream, data):
    """Shapes that arm and drop templates, texts plain or not, other events between; reads
    of one event, several coalesced or split; times, client buffer and streams decoding
    drawn per read."""
    frames = b"".join(frame(e) for e in stream)
    # Read boundaries: mostly at frame ends (one event a read), some anywhere.
    ends, at = [], 0
    for e in stream:
        at += len(frame(e))
        ends.append(at)
    cuts = sorted(
        set(data.draw(st.lists(st.sampled_from(ends), max_size=len(ends)) if ends else st.just([])))
        | set(data.draw(st.lists(st.integers(0, max(len(frames), 1)), max_size=4)))
    )
    bounds = [0, *[c for c in cuts if 0 < c < len(frames)], len(frames)]
    reads = [frames[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    t = 100.05
    steps = []
    for read in reads:
        t += data.draw(st.sampled_from([0.0, 0.001, 0.02, 0.3, 1.2]))
        steps.append(
            Step(read, t, data.draw(st.sampled_from([0, 0, 0, 0, 9])), data.draw(st.integers(1, 3)))
        )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(token_lane, "TokenLane", impl)
        got, _ = both(steps, "/v1/chat/completions", mp)
    # A read that split a chunk is re-framed piece by piece (the relay's way); the body is
    # the same bytes.
    assert dechunk(got["written"]) == b"".join(stream)


def dechunk(data: bytes) -> bytes:
    out, at = [], 0
    while at < len(data):
        eol = data.index(b"\r\n", at)
        size = int(data[at:eol], 16)
        out.append(data[eol + 2 : eol + 2 + size])
        assert data[eol + 2 + size : eol + 4 + size] == b"\r\n"
        at = eol + 4 + size
    return b"".join(out)


# -- the attributes the lane reads, and what a failure does ----------------------------------


def test_the_lane_writes_no_attribute_of_another_object(lane, monkeypatch):
    """The lane keeps its notes in itself and hands them to ``notes``: it writes no field of
    the timeline, the relay, the transport or the decoding count, and changes no array of
    theirs. Run against objects that refuse any write made while the lane's own call is
    the innermost Python frame (a write from C has no Python frame of its own; the Python
    lane's are its own functions' frames, all of them counted as the lane's); writes by
    their own Python methods (``add_tokens``, ``_lane_sent``) pass."""
    RealLane = lane
    lane_codes: set = set()
    if RealLane is PY_LANE:
        lane_codes.update(_python_lane_codes())

    class Watched:
        """The C lane, its three calls each made from a Python frame of its own."""

        def __init__(self, **kwargs) -> None:
            self._lane = RealLane(**kwargs)

        def take(self, data):
            return self._lane.take(data)

        def open(self, check_at, last):
            return self._lane.open(check_at, last)

        def flush(self):
            return self._lane.flush()

        def poke(self, obj) -> None:  # what the old lane did: a write from C (builtin setattr)
            obj.last_token = 1.0

        memo = property(lambda self: self._lane.memo)
        off = property(lambda self: self._lane.off)
        taken = property(lambda self: self._lane.taken)

    lane_codes.update(
        {
            Watched.take.__code__,
            Watched.open.__code__,
            Watched.flush.__code__,
            Watched.poke.__code__,
        }
    )
    refused: list[str] = []

    def check(obj, name: str) -> None:
        if sys._getframe(2).f_code in lane_codes:
            refused.append(f"{type(obj).__name__}.{name}")
            raise AttributeError(f"the lane wrote {type(obj).__name__}.{name}")

    class GuardedArray(array):
        def __setitem__(self, i, v):
            check(self, "__setitem__")
            super().__setitem__(i, v)

        def append(self, v):
            check(self, "append")
            super().append(v)

        def extend(self, v):
            check(self, "extend")
            super().extend(v)

        def frombytes(self, v):
            check(self, "frombytes")
            super().frombytes(v)

    def guarded(cls):
        def __setattr__(self, name, value):
            check(self, name)
            super(sub, self).__setattr__(name, value)

        sub = type(f"Guarded{cls.__name__}", (cls,), {"__slots__": (), "__setattr__": __setattr__})
        return sub

    GuardedTimeline = guarded(RequestTimeline)
    GuardedDecoding = guarded(DecodeConcurrency)
    real_init = RequestTimeline.__init__

    def timeline_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.gaps, self.gap_streams = GuardedArray("d"), GuardedArray("I")

    monkeypatch.setattr(GuardedTimeline, "__init__", timeline_init)
    monkeypatch.setattr(token_lane, "TokenLane", Watched)
    monkeypatch.setattr(body_relay, "BodyRelay", guarded(BodyRelay))
    monkeypatch.setattr(sys.modules[__name__], "RequestTimeline", GuardedTimeline)
    monkeypatch.setattr(sys.modules[__name__], "DecodeConcurrency", GuardedDecoding)
    monkeypatch.setattr(sys.modules[__name__], "BodyRelay", body_relay.BodyRelay)
    monkeypatch.setattr(sys.modules[__name__], "ClientTransport", guarded(ClientTransport))

    wire = StreamWire(5, 200)
    events = [wire.role(), *(wire.token(k) for k in range(200)), wire.usage(9), wire.done()]
    got = relay(paced(events), "/v1/chat/completions", True, monkeypatch)
    assert refused == []
    assert got["taken"] > 150, "the lanes took no reads: nothing was checked"
    assert got["stream_tokens"] == 200 and len(got["gaps"]) == 199 and got["parse_errors"] == 0

    # The guard works: a lane handed the timeline's own array as its notes' target refuses.
    timeline = GuardedTimeline(0.0)
    lane = Watched(
        clock=lambda: 1.0, transport=guarded(ClientTransport)(), decoding=GuardedDecoding(),
        notes=lambda sent, gaps, streams, last: timeline.gaps.frombytes(gaps.tobytes()),
        memo=None, prefix=b"a", suffix=b"b", limit=100, kind=0, high_water=1 << 16, yield_after=1 << 16,
    )  # fmt: skip
    assert lane.open(5.0, 0.5) and lane.take(frame(b"axb"))
    lane.flush()  # the notes' own Python frame writes: allowed
    assert timeline.gaps.tolist() == [0.5] and refused == []
    with pytest.raises(AttributeError):  # and a write from C inside a lane's call is caught
        lane.poke(timeline)
    assert refused == ["GuardedRequestTimeline.last_token"]
    if RealLane is PY_LANE:  # and, for the Python lane, a write from one of its own functions
        refused.clear()
        lane._lane._notes = lambda *notes: setattr(timeline, "last_token", 2.0)  # noqa: B010
        assert lane.open(5.0, 1.0) and lane.take(frame(b"ayb"))
        lane.flush()  # the lambda is not the lane's: allowed (as notes' own frame is)
        assert refused == [] and timeline.last_token == 2.0
        with pytest.raises(AttributeError):
            _as_lane_code(lambda: setattr(timeline, "last_token", 3.0), lane_codes)()  # noqa: B010
        assert refused == ["GuardedRequestTimeline.last_token"]


def _python_lane_codes() -> set:
    """The code of every function of the Python lane's module: a write made with one of
    them as the innermost frame is the lane's."""
    codes = set()
    for value in [*vars(token_lane_py).values(), *vars(PY_LANE).values()]:
        if isinstance(value, property):
            value = value.fget
        if (
            callable(value)
            and hasattr(value, "__code__")
            and value.__module__ == token_lane_py.__name__
        ):
            codes.add(value.__code__)
    assert PY_LANE.take.__code__ in codes and PY_LANE._hand_over.__code__ in codes
    return codes


def _as_lane_code(fn, codes: set):
    """``fn``, its code counted as the lane's (the guard's own check)."""
    codes.add(fn.__code__)
    return fn


def test_a_lane_that_cannot_record_is_a_parse_error_not_a_broken_stream(lane, monkeypatch):
    """A measuring failure inside the lane (here: the timeline's gaps refuse more) switches
    lanes off for the response and counts one parse error; every byte still goes through."""

    class Refusing(array):
        def extend(self, items):
            if isinstance(items, array):  # a lane's batch (the Python path hands tuples and lists)
                raise RuntimeError("no more")
            super().extend(items)

    real_init = RequestTimeline.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.gaps = Refusing("d")

    monkeypatch.setattr(RequestTimeline, "__init__", init)
    wire = StreamWire(9, 120)
    events = [wire.role(), *(wire.token(k) for k in range(120)), wire.done()]
    got = relay(paced(events), "/v1/chat/completions", True, monkeypatch)
    assert (
        got["written"] == b"".join(frame(e) for e in events) + LAST_CHUNK
    )  # the relay ends the body
    assert got["ended"] == Verdict.OK
    assert got["parse_errors"] == 1
    assert got["taken"] > 0


def test_a_lane_that_cannot_be_made_leaves_the_stream_alone(monkeypatch):
    """lane_for raising (a bug) is contained: Python path for the rest, one parse error."""

    def broken(*args, **kwargs):
        raise TypeError("bug")

    wire = StreamWire(11, 50)
    events = [wire.role(), *(wire.token(k) for k in range(50)), wire.done()]
    monkeypatch.setattr(body_relay, "_LANES", True)
    without = relay(paced(events), "/v1/chat/completions", False, monkeypatch)
    monkeypatch.setattr(body_relay, "lane_for", broken)
    monkeypatch.setattr(body_relay, "_LANES", True)

    async def run() -> tuple:
        clock = Clock()
        it = await Running().start("/v1/chat/completions", clock)
        for step in paced(events):
            clock.now = step.at
            it.conn.data_received(step.data)
        it.conn.data_received(b"0\r\n\r\n")
        return await it.task, b"".join(it.client.written), it.timeline

    ended, written, timeline = asyncio.run(run())
    assert ended == Verdict.OK and written == without["written"]
    assert timeline.parse_errors == 1
    assert timeline.stream_tokens == without["stream_tokens"]


def test_a_finished_relay_leaves_no_cycle_behind(lane, monkeypatch):
    """A lane refers to its relay and the relay to its lane: the relay drops it as it ends,
    or every finished response (relay, request, observer, timeline) would wait for the
    cyclic collector, long after it was promoted to the oldest generation (peak RSS +4 MB
    at 200 streams when it did)."""
    import gc

    wire = StreamWire(2, 100)
    events = [wire.role(), *(wire.token(k) for k in range(100)), wire.done()]
    for lanes in (False, True):
        gc.collect()
        gc.disable()
        try:
            got = relay(paced(events), "/v1/chat/completions", lanes, monkeypatch)
            alive = sum(
                1
                for o in gc.get_objects()
                if type(o) in (BodyRelay, token_lane.TokenLane, RequestTimeline)
            )
        finally:
            gc.enable()
        assert got["taken"] > 50 or not lanes
        assert alive == 0, (
            f"lanes={lanes}: {alive} relays, lanes or timelines wait for the cyclic collector"
        )


def test_the_c_source_sets_no_attribute_and_reads_one():
    """Statically too: no attribute write anywhere in the extension, and the one read by name
    is the decoding count (token_lane.Decoding)."""
    from pathlib import Path

    source = (Path(token_lane.__file__).parent / "_token_lane.c").read_text()
    assert "SetAttr" not in source and "GenericSetAttr" not in source
    assert source.count("PyObject_GetAttr(") == 1 and 'INTERN(s_n, "n")' in source


# -- the Python lane's own checks: the same reads as the C lane and the Python originals ------


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.buffered = 0

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.buffered


class _Count:
    def __init__(self, n) -> None:
        self.n = n


def _lane(impl, prefix: bytes = b'data: {"c":"', suffix: bytes = b'"}\n\n', limit: int = 200, **kw):
    notes: list = []
    transport = kw.pop("transport", None) or _Transport()
    args = dict(
        clock=kw.pop("clock", lambda: 2.0), transport=transport, decoding=kw.pop("decoding", _Count(3)),
        notes=lambda sent, gaps, streams, last: notes.append((sent, gaps.tolist(), streams.tolist(), last)),
        memo=None, prefix=prefix, suffix=suffix, limit=limit, kind=0, high_water=kw.pop("high_water", 1 << 16),
        yield_after=kw.pop("yield_after", 1 << 16),
    )  # fmt: skip
    return impl(**args), notes, transport


def _text_lane_model(text: bytes) -> bool:
    """The C lane's text rule, read character by character: a one-character escape stands
    for one (printable) character, and the rest is ``plain``."""
    out, i = [], 0
    while i < len(text):
        two = text[i : i + 2]
        if (
            len(two) == 2
            and two[:1] == b"\\"
            and two[1:] in (b'"', b"\\", b"/", b"b", b"f", b"n", b"r", b"t")
        ):
            out.append(b"x")
            i += 2
        else:
            out.append(text[i : i + 1])
            i += 1
    return bool(text) and plain(b"".join(out))


def _taken_by_the_originals(data: bytes, prefix: bytes, suffix: bytes, limit: int) -> bool:
    """What ``chunk_payload_py`` and the template's check (``EventTemplate.matches``, with a
    lane's escapes) take."""
    payload = chunk_payload_py(data)
    if payload is None:
        return False
    end = len(payload) - len(suffix)
    if not (len(prefix) < end and len(payload) <= limit):
        return False
    if not (payload.startswith(prefix) and payload.endswith(suffix)):
        return False
    return plain_at_py(payload, len(prefix), end) or _text_lane_model(payload[len(prefix) : end])


size_lines = st.sampled_from(
    ["%x"] * 12 + ["%X", "0%x", "000%x", "%x;e=1", "0x%x", " %x", "+%x", "%x ", "1_%x", "%d"]
)
lane_texts = st.one_of(
    st.text(min_size=1, max_size=6).map(
        lambda t: t.encode("utf-8", "surrogatepass")
    ),  # mostly plain
    st.sampled_from([t for t, _ in LANE_TEXTS]),
    texts,
)


@FAST
@given(
    size_lines, lane_texts, st.sampled_from([0] * 8 + [-1, 1, 2]),
    st.sampled_from([b"\r\n"] * 8 + [b"\n", b"\r\nx", b""]), st.integers(0, 40),
)  # fmt: skip
def test_the_python_lane_takes_the_reads_the_originals_take(size_line, text, off_by, end, limit):
    """The Python lane's whole-chunk and text checks, made on the read in place, against
    ``chunk_payload_py`` and the template's check on the payload (and against the C lane
    where it was built): size lines in every spelling, wrong sizes and ends, every text."""
    prefix, suffix = b'data: {"c":"', b'"}\n\n'
    payload = prefix + text + suffix
    line = (size_line % max(len(payload) + off_by, 0)).encode()
    data = line + b"\r\n" + payload + end
    limit = len(prefix) + len(suffix) + limit // 2
    expected = _taken_by_the_originals(data, prefix, suffix, limit)
    impls = [PY_LANE] + ([C_LANE] if C_LANE is not None else [])
    for impl in impls:
        lane, notes, transport = _lane(impl, prefix, suffix, limit)
        assert lane.open(5.0, 1.0)
        assert lane.take(data) is expected, impl
        assert transport.written == ([data] if expected else [])
        lane.flush()
        assert notes == ([(len(data), [1.0], [3], 2.0)] if expected else [])


@pytest.mark.parametrize("impl", LANES)
def test_a_lane_s_refusals_and_failures(impl):
    """Both lanes alike: no take before open or before the first token, nor of a read too
    large, a client buffer not empty or a check due; a batch handed over every 32 tokens;
    a failure in measuring switches the lane off, an error writing goes to the caller."""
    read = frame(b'data: {"c":"hi"}\n\n')
    lane, notes, transport = _lane(impl)
    assert lane.take(read) is False and lane.taken == 0  # not open
    assert lane.open(5.0, None) is False  # before the first token
    assert lane.open(5.0, 1.0) and lane.is_open
    assert lane.take(bytearray(read)) is False and lane.take(read[:-1]) is False
    transport.buffered = 1
    assert lane.take(read) is False
    transport.buffered = 0
    for _ in range(33):
        assert lane.take(read)
    assert notes == [(32 * len(read), [1.0] + [0.0] * 31, [3] * 32, 2.0)] and lane.pending == 1
    with pytest.raises(RuntimeError):  # open with notes not handed over
        lane.open(5.0, 1.0)
    lane.flush()
    assert lane.taken == 33 and not lane.is_open and lane.pending == 0 and len(notes) == 2
    with pytest.raises(TypeError):
        lane.open("soon", 1.0)
    assert lane.open(2.0, 1.0) and lane.take(read) is False  # the progress check is due at 2.0
    lane, _, _ = _lane(impl, high_water=len(read) - 1)
    assert lane.open(5.0, 1.0) and lane.take(read) is False
    lane, _, _ = _lane(impl, yield_after=len(read))
    assert lane.open(5.0, 1.0) and lane.take(read) is False
    lane, _, _ = _lane(impl, decoding=_Count(1 << 32))  # not an "I" item: left to Python, still on
    assert lane.open(5.0, 1.0) and lane.take(read) is False and not lane.off
    broken_ones = [
        dict(decoding=_Count(-1)),
        dict(decoding=_Count(1.5)),
        dict(decoding=object()),
        dict(clock=lambda: 1 / 0),
    ]
    for broken in broken_ones:
        lane, notes, transport = _lane(impl, **broken)
        assert lane.open(5.0, 1.0) and lane.take(read) is False, broken
        assert lane.off and not lane.is_open and not lane.open(5.0, 1.0) and transport.written == []

    class Failing(_Transport):
        def write(self, data: bytes) -> None:
            raise ConnectionResetError

    lane, notes, _ = _lane(impl, transport=Failing())
    assert lane.open(5.0, 1.0)
    with pytest.raises(ConnectionResetError):
        lane.take(read)
    lane.flush()
    assert notes == [] and lane.taken == 0 and not lane.off
    with pytest.raises(ValueError):
        impl(**{**_lane_args(), "kind": 7})
    with pytest.raises(TypeError):
        impl(**{**_lane_args(), "prefix": "data"})


def _lane_args() -> dict:
    return dict(
        clock=lambda: 1.0, transport=_Transport(), decoding=_Count(1), notes=lambda *a: None, memo=None,
        prefix=b"a", suffix=b"b", limit=100, kind=0, high_water=1 << 16, yield_after=1 << 16,
    )  # fmt: skip
