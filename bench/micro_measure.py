"""Per-token cost of the measuring path, without any network: ``python -m bench.micro_measure``.

The relay benchmark (``bench.run``) says how much CPU a token costs end to end; this says
which part of the sidecar's own Python work it goes to, so a change to one part can be
judged in isolation. Two parts, each fed a typical vLLM chat stream (one whole
``data: {...}\\n\\n`` event per chunk, as servers flush them):

- observer: ``ResponseObserver.feed`` per chunk (SSE framing, OpenAI dialect, timeline);
- metrics: ``SidecarMetrics.started`` + ``record`` of the finished timeline, per token;
- relay: the whole per-read path with the observer in it: the upstream connection's
  ``data_received`` (HTTP/1.1 chunk framing) handing each chunked read to the relay's sink,
  which writes it to a client transport that only counts bytes, then measures it. The
  system calls are not in it: what is left is the Python a token costs beside them.

``--no-c`` runs it as a compiler-less install does (neither C extension importable: the
byte checks in Python and the Python token lane), and ``--lane python`` or ``--lane none``
picks the Python lane or no lane at all (the relay's general Python path for every read,
which is what a compiler-less install ran before it had a lane), with or without C.

Each figure is the best of several repeats (the least disturbed by the rest of the
machine), in microseconds per token. No figure here is asserted anywhere: timings belong
in benchmarks, not in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import orjson

C_EXTENSIONS = ("sidecar.base._speedups", "sidecar.relay.data._token_lane")
LANES = ("auto", "python", "none")
"""``--lane``: the install's own (C where built, else Python), the Python lane, or none."""

TOKENS = 200  # tokens per request
ITL = 0.02  # seconds between tokens (puts every gap in one ITL bucket, as steady decode does)


def chunk(i: int) -> bytes:
    """One vLLM chat-completion chunk carrying one token, framed as its own SSE event."""
    doc = {
        "id": "chatcmpl-abc",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"content": f" tok{i}"},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _best(fn, requests: int, repeats: int) -> float:
    """Best of ``repeats`` runs of ``fn(requests)``, in microseconds per token."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(requests)
        best = min(best, time.perf_counter() - t0)
    return best / (requests * TOKENS) * 1e6


def without_c() -> None:
    """Make both C extensions unimportable, as in an install without a C compiler: only
    before the sidecar is imported (a module already loaded keeps its C)."""
    loaded = [
        name
        for name in ("sidecar.base.speedups", "sidecar.relay.data.token_lane")
        if name in sys.modules
    ]
    if loaded:
        raise RuntimeError(f"already imported with whatever C there was: {loaded}")
    for name in C_EXTENSIONS:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError


def measure(requests: int = 200, repeats: int = 7, lane: str = "auto") -> dict[str, float]:
    from prometheus_client import CollectorRegistry

    from sidecar.base.outcomes import Outcome
    from sidecar.base.routes import match_route
    from sidecar.export.metrics import SidecarMetrics
    from sidecar.measure.observe import ResponseObserver
    from sidecar.measure.summary import summarize
    from sidecar.measure.timeline import RequestTimeline
    from sidecar.relay.data import body_relay, token_lane, token_lane_py
    from sidecar.relay.data.body_relay import BodyRelay
    from sidecar.relay.data.upstream import UpstreamConnection, UpstreamPool

    if lane not in LANES:
        raise ValueError(f"lane: one of {LANES}")
    saved = token_lane.TokenLane, body_relay._LANES
    if lane == "python":
        token_lane.TokenLane = token_lane_py.TokenLane
    elif lane == "none":
        body_relay._LANES = False  # read as each relay is made
    route, _ = match_route("/v1/chat/completions", "POST")
    chunks = [chunk(i) for i in range(TOKENS)]
    timed = [(c, i * ITL) for i, c in enumerate(chunks)]

    def observer(n: int) -> None:
        for _ in range(n):
            tl = RequestTimeline(0.0, "POST", route.template, "m")
            ob = ResponseObserver(route, tl, "text/event-stream")
            feed = ob.feed
            for c, now in timed:
                feed(c, now)
            ob.close(TOKENS * ITL)

    def finished_timeline() -> RequestTimeline:
        tl = RequestTimeline(0.0, "POST", route.template, "m")
        tl.response_started(0.01, 200, True)
        ob = ResponseObserver(route, tl, "text/event-stream")
        for c, now in timed:
            ob.feed(c, now)
        ob.close(TOKENS * ITL)
        tl.finish(Outcome.OK, TOKENS * ITL)
        return tl

    timelines = [finished_timeline() for _ in range(requests)]
    metrics = SidecarMetrics(CollectorRegistry())

    def record(n: int) -> None:
        for tl in timelines[:n]:
            metrics.started("m", route.template)
            metrics.record(summarize(tl, "m"))

    loop = asyncio.new_event_loop()
    pool = UpstreamPool("http://127.0.0.1:9", connect_timeout=1.0, read_timeout=None, loop=loop)
    frames = [b"%x\r\n%b\r\n" % (len(c), c) for c in chunks]
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )

    def relay(n: int) -> None:
        for _ in range(n):
            conn = UpstreamConnection(pool)
            conn.connection_made(_CountingTransport())
            conn.begin(no_body=False)
            conn.data_received(head)
            tl = RequestTimeline(0.0, "POST", route.template, "m")
            ob = ResponseObserver(route, tl, "text/event-stream")
            sink = BodyRelay(_CountingTransport(), conn, ob, time.perf_counter, chunked=True)
            conn.push(sink)
            received = conn.data_received
            for frame in frames:
                received(frame)
            ob.close(TOKENS * ITL)

    try:
        return {
            "observer": _best(observer, requests, repeats),
            "metrics": _best(record, requests, repeats),
            "relay (with observer)": _best(relay, requests, repeats),
        }
    finally:
        loop.close()
        token_lane.TokenLane, body_relay._LANES = saved


def describe(lane: str) -> str:
    """Which byte checks and which lane the relay figure ran with."""
    from sidecar.base import speedups
    from sidecar.relay.data import token_lane

    checks = "C" if speedups.IN_C else "Python"
    if lane == "none":
        used = "no lane"
    elif lane == "python" or not token_lane.IN_C_LANE:
        used = "the Python lane"
    else:
        used = "the C lane"
    return f"byte checks in {checks}, {used}"


class _CountingTransport:
    """A transport that takes every write and counts its bytes (no system call)."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default=None):
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="best of this many repeats")
    parser.add_argument(
        "--no-c", action="store_true", help="as an install without a C compiler: no C extension"
    )
    parser.add_argument(
        "--lane",
        choices=LANES,
        default="auto",
        help="the token lane the relay uses (default: the install's)",
    )
    args = parser.parse_args(argv)
    if args.no_c:
        without_c()
    print(describe(args.lane))
    figures = measure(args.requests, args.repeats, args.lane)
    for part, us in figures.items():
        print(f"{part:<22}{us:8.3f} µs/token")
    print(f"{'observer + metrics':<22}{figures['observer'] + figures['metrics']:8.3f} µs/token")


if __name__ == "__main__":
    main()
