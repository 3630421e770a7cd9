"""The load generator: N concurrent connections running requests back to back, each timed per SSE event.

Raw asyncio protocol on uvloop (no HTTP client library), so parsing costs the client a
few microseconds per event and it is never the bottleneck it measures. Each connection
runs streams back to back until the deadline; every stream's response is de-chunked,
compared byte for byte with what :mod:`bench.wire` says the upstream generated for it, and
timed: an event's arrival time is the time of the read that completed it (its ``\\n\\n``).

TTFT = first token event (the event after the role chunk) - request written. ITL = gaps
between consecutive token events. A gap shorter than a quarter of the upstream's tpot
counts as "bunched" (events that should be tpot apart arrived in one read: buffering).

``--shape mixed`` draws every request from :func:`bench.wire.mixed_request` (same sequence
for every target: lengths, routes, models, streamed or not) and lets every fourth
connection connect per request (``Connection: close``). For those, TTFT and latency run
from the start of the TCP connect, as their users see it. A non-streamed request's
latency is from request (or connect) to the read that completed its body; its "excess" is
that latency minus the upstream's schedule (``ttft + (tokens - 1) * tpot``), so a proxy's
addition is not drowned by lengths of 20 to 800 tokens. ``tokens_total`` counts the tokens
of every complete response, streamed or not (each non-streamed body's ``usage``); the
streamed ones alone are ``streamed_tokens_total``.

Run by :mod:`bench.run`; writes one JSON document (``--out``) with the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import resource
import sys
import time
import zlib
from array import array
from bisect import bisect_left, bisect_right
from itertools import pairwise

import orjson

from .wire import (
    MIXED_TOKENS,
    StreamWire,
    closes_per_request,
    expected_body,
    mixed_request,
    mixed_request_bytes,
    request_bytes,
)

_HEAD, _SIZE, _DATA, _CRLF, _TRAILER, _LENGTH = range(6)


class StreamFailed(Exception):
    pass


class Results:
    def __init__(self, tokens: int, window: tuple[float, float]) -> None:
        self.tokens = tokens
        self.window = window
        self.ttft = array("d")
        self.itl = array("d")
        self.started = 0
        self.complete = 0
        self.checksum_mismatches = 0
        self.errors: dict[str, int] = {}
        self.tokens_total = 0
        self.tokens_in_window = 0
        self.bytes_total = 0
        self.requests_in_window = 0
        # the mixed shape only
        self.streamed_tokens_total = 0
        self.nonstream_latency = array("d")
        self.nonstream_excess = array("d")
        self.kinds: dict[str, int] = {}
        self.models: dict[str, int] = {}
        self.connections_opened = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


class ClientProtocol(asyncio.Protocol):
    """One keep-alive connection; :meth:`request` sends a stream and returns a future."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._fut: asyncio.Future | None = None
        self._state = _HEAD
        self._rbuf = b""
        self._remaining = 0
        self._body = bytearray()
        self._scan = 0
        self._times = array("d")
        self.status = 0
        self.finished_at = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if self._fut is not None and not self._fut.done():
            self._fut.set_exception(StreamFailed("truncated"))

    def request(self, data: bytes) -> tuple[float, asyncio.Future]:
        self._fut = asyncio.get_running_loop().create_future()
        self._state = _HEAD
        self._rbuf = b""
        self._body = bytearray()
        self._scan = 0
        self._times = array("d")
        self.status = 0
        sent = time.perf_counter()
        self.transport.write(data)
        return sent, self._fut

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self._fut is None or self._fut.done():
            return  # nothing asked: ignore (a broken peer)
        if self._rbuf:
            data = self._rbuf + data
            self._rbuf = b""
        pos, end = 0, len(data)
        try:
            while pos < end:
                state = self._state
                if state == _DATA:
                    take = min(self._remaining, end - pos)
                    self._feed(data[pos : pos + take], now)
                    pos += take
                    self._remaining -= take
                    if not self._remaining:
                        self._state = _CRLF
                elif state == _SIZE or state == _TRAILER or state == _CRLF:
                    nl = data.find(b"\r\n", pos)
                    if nl < 0:
                        self._rbuf = data[pos:]
                        return
                    line = data[pos:nl]
                    pos = nl + 2
                    if state == _CRLF:
                        if line:
                            raise StreamFailed("bad_chunking")
                        self._state = _SIZE
                    elif state == _SIZE:
                        size = int(line.split(b";", 1)[0], 16)
                        if size:
                            self._remaining = size
                            self._state = _DATA
                        else:
                            self._state = _TRAILER
                    elif not line:  # end of trailers: the response is complete
                        self._finish(pos < end)
                        return
                elif state == _LENGTH:
                    take = min(self._remaining, end - pos)
                    self._feed(data[pos : pos + take], now)
                    pos += take
                    self._remaining -= take
                    if not self._remaining:
                        self._finish(pos < end)
                        return
                else:  # _HEAD
                    hend = data.find(b"\r\n\r\n", pos)
                    if hend < 0:
                        self._rbuf = data[pos:]
                        return
                    self._head(data[pos:hend])
                    pos = hend + 4
        except (StreamFailed, ValueError) as exc:
            self._fut.set_exception(
                exc if isinstance(exc, StreamFailed) else StreamFailed("bad_http")
            )
            self.transport.close()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        self.status = int(parts[1])
        chunked, length = False, None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"content-length":
                length = int(value)
        if chunked:
            self._state = _SIZE
        elif length is not None:
            self._remaining = length
            self._state = _LENGTH
            if not length:
                self._finish(False)
        else:
            raise StreamFailed("no_length")

    def _feed(self, piece: bytes, now: float) -> None:
        body = self._body
        body += piece
        scan = self._scan
        while True:
            j = body.find(b"\n\n", scan)
            if j < 0:
                break
            self._times.append(now)
            scan = j + 2
        self._scan = max(scan, len(body) - 1)  # a "\n\n" may straddle two reads

    def _finish(self, trailing: bool) -> None:
        if trailing:
            raise StreamFailed("pipelined_garbage")
        self.finished_at = time.perf_counter()
        self._fut.set_result((self.status, bytes(self._body), self._times))


async def _connected(proto, loop, host: str, port: int, results: Results):
    """``proto`` while its connection is open, else a new connection (counted), or None
    after a failed connect (counted, after a short pause)."""
    if proto is not None and proto.transport is not None and not proto.transport.is_closing():
        return proto
    try:
        _, proto = await loop.create_connection(ClientProtocol, host, port)
    except OSError:
        results.error("connect")
        await asyncio.sleep(0.1)
        return None
    results.connections_opened += 1
    return proto


async def _answer(proto, fut: asyncio.Future, timeout: float, results: Results):
    """(status, body, event times) of one request, or None (counted, the connection closed)
    when it failed or timed out."""
    try:
        return await asyncio.wait_for(fut, timeout)
    except StreamFailed as exc:
        results.error(str(exc))
    except TimeoutError:
        results.error("timeout")
    proto.transport.close()
    return None


async def _connection(
    index: int,
    host: str,
    port: int,
    start_at: float,
    deadline: float,
    tokens: int,
    timeout: float,
    results: Results,
) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    host_header = f"{host}:{port}"
    seq = 0
    proto: ClientProtocol | None = None
    while time.perf_counter() < deadline:
        proto = await _connected(proto, loop, host, port, results)
        if proto is None:
            continue
        stream_id = index * 1_000_000 + seq
        seq += 1
        results.started += 1
        sent, fut = proto.request(request_bytes(host_header, stream_id, tokens))
        answer = await _answer(proto, fut, timeout, results)
        if answer is None:
            proto = None
            continue
        status, body, times = answer
        results.bytes_total += len(body)
        if status != 200:
            results.error(f"http_{status}")
            continue
        crc = zlib.crc32(StreamWire(stream_id, tokens).client_body())
        if zlib.crc32(body) != crc or len(times) != tokens + 2:
            results.checksum_mismatches += 1
            results.error("checksum")
            continue
        results.complete += 1
        # events: role, tokens 0..n-1, [DONE]
        tok = times[1 : tokens + 1]
        results.ttft.append(tok[0] - sent)
        results.itl.extend([b - a for a, b in pairwise(tok)])
        results.tokens_total += tokens
        lo, hi = results.window
        results.tokens_in_window += bisect_right(tok, hi) - bisect_left(tok, lo)
        results.requests_in_window += lo <= times[-1] <= hi
    if proto is not None and proto.transport is not None:
        proto.transport.close()


async def _mixed_connection(
    index: int,
    host: str,
    port: int,
    start_at: float,
    deadline: float,
    token_range: tuple[int, int],
    ttft: float,
    tpot: float,
    timeout: float,
    results: Results,
) -> None:
    """The mixed shape's connection ``index``: requests drawn from (index, request number);
    one in four connections opens a new TCP connection per request."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    host_header = f"{host}:{port}"
    close = closes_per_request(index)
    seq = 0
    proto: ClientProtocol | None = None
    while time.perf_counter() < deadline:
        began = time.perf_counter()
        proto = await _connected(proto, loop, host, port, results)
        if proto is None:
            continue
        stream_id = index * 1_000_000 + seq
        req = mixed_request(index, seq, token_range)
        seq += 1
        results.started += 1
        sent, fut = proto.request(mixed_request_bytes(host_header, stream_id, req, close))
        t_ref = began if close else sent  # a per-request client waits for its connect too
        answer = await _answer(proto, fut, timeout, results)
        if answer is None:
            proto = None
            continue
        status, body, times = answer
        finished = proto.finished_at
        if close:
            proto.transport.close()
            proto = None
        results.bytes_total += len(body)
        if status != 200:
            results.error(f"http_{status}")
            continue
        if (
            zlib.crc32(body) != zlib.crc32(expected_body(stream_id, req))
            or len(times) != req.events()
        ):
            results.checksum_mismatches += 1
            results.error("checksum")
            continue
        results.complete += 1
        results.kinds[req.kind] = results.kinds.get(req.kind, 0) + 1
        results.models[req.model] = results.models.get(req.model, 0) + 1
        results.tokens_total += req.tokens
        lo, hi = results.window
        results.requests_in_window += lo <= finished <= hi
        if not req.stream:
            latency = finished - t_ref
            results.nonstream_latency.append(latency)
            results.nonstream_excess.append(latency - (ttft + (req.tokens - 1) * tpot))
            results.tokens_in_window += req.tokens if lo <= finished <= hi else 0
            continue
        first = req.events() - req.tokens - 1  # the role chunk comes first in chat streams
        tok = times[first : first + req.tokens]
        results.ttft.append(tok[0] - t_ref)
        results.itl.extend([b - a for a, b in pairwise(tok)])
        results.streamed_tokens_total += req.tokens
        results.tokens_in_window += bisect_right(tok, hi) - bisect_left(tok, lo)
    if proto is not None and proto.transport is not None:
        proto.transport.close()


def _summary(values: array) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    s = sorted(values)
    n = len(s)

    def rank(q: float) -> float:  # nearest rank
        return s[min(n - 1, max(0, math.ceil(q * n) - 1))]

    return {"n": n, "p50": rank(0.50), "p99": rank(0.99), "max": s[-1], "mean": sum(s) / n}


async def run(args: argparse.Namespace) -> dict:
    start = time.perf_counter() + 0.05
    ramp = args.ramp
    deadline = start + ramp + args.duration
    # Steady state: every stream has started and produced its first token.
    window = (start + ramp + args.ttft, deadline)
    results = Results(args.tokens, window)
    if args.shape == "mixed":
        tasks = [
            asyncio.create_task(
                _mixed_connection(
                    i, args.host, args.port, start + ramp * i / args.streams, deadline,
                    args.token_range, args.ttft, args.tpot, args.timeout, results,
                )
            )
            for i in range(args.streams)
        ]  # fmt: skip
    else:
        tasks = [
            asyncio.create_task(
                _connection(
                    i,
                    args.host,
                    args.port,
                    start + ramp * i / args.streams,
                    deadline,
                    args.tokens,
                    args.timeout,
                    results,
                )
            )
            for i in range(args.streams)
        ]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(*tasks)
    finished = time.perf_counter()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    window_s = window[1] - window[0]
    itl = results.itl
    bunched = sum(1 for g in itl if g < args.tpot / 4) / len(itl) if itl else None
    summary = {
        "shape": args.shape,
        "streams_started": results.started,
        "streams_complete": results.complete,
        "errors": sum(results.errors.values()),
        "error_kinds": results.errors,
        "checksum_mismatches": results.checksum_mismatches,
        "tokens_total": results.tokens_total,
        "bytes_total": results.bytes_total,
        "tokens_in_window": results.tokens_in_window,
        "window_s": window_s,
        "tokens_per_s": results.tokens_in_window / window_s if window_s > 0 else None,
        "wall_s": finished - start,
        "client_cpu_s": cpu,
        "client_nice": os.nice(0),
        "ttft_s": _summary(results.ttft),
        "itl_s": _summary(itl),
        "bunched_share": bunched,
        "requests_in_window": results.requests_in_window,
        "requests_per_s": results.requests_in_window / window_s if window_s > 0 else None,
    }
    if args.shape == "mixed":
        summary.update({
            "token_range": list(args.token_range),
            "streamed_tokens_total": results.streamed_tokens_total,
            "nonstream_latency_s": _summary(results.nonstream_latency),
            "nonstream_excess_s": _summary(results.nonstream_excess),
            "kinds": results.kinds,
            "models": results.models,
            "connections_opened": results.connections_opened,
        })  # fmt: skip
    return summary


def token_range(text: str) -> tuple[int, int]:
    """``MIN,MAX`` output tokens of the mixed shape."""
    lo, _, hi = text.partition(",")
    try:
        bounds = int(lo), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX (e.g. 20,800), got {text!r}") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"need 1 <= MIN <= MAX, got {text!r}")
    return bounds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.client", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--streams", type=int, required=True, help="concurrent streams (connections)")
    p.add_argument("--tokens", type=int, required=True, help="tokens per stream (steady shape)")
    p.add_argument(
        "--shape", choices=("steady", "mixed"), default="steady", help="see the module doc"
    )
    p.add_argument(
        "--token-range", type=token_range, default=MIXED_TOKENS, metavar="MIN,MAX",
        help="mixed shape: output tokens, log-uniform between these (default 20,800)",
    )  # fmt: skip
    p.add_argument("--tpot", type=float, required=True, help="the upstream's seconds per token")
    p.add_argument(
        "--ttft", type=float, required=True, help="the upstream's seconds to first token"
    )
    p.add_argument(
        "--duration", type=float, required=True, help="seconds of steady load after the ramp"
    )
    p.add_argument("--ramp", type=float, required=True, help="seconds over which streams start")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one stream may take")
    p.add_argument("--out", required=True, help="write the JSON summary here")
    args = p.parse_args(argv)
    import uvloop  # noqa: PLC0415

    summary = uvloop.run(run(args))
    with open(args.out, "wb") as fh:
        fh.write(orjson.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
