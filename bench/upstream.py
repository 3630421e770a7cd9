"""A light vLLM-shaped upstream for the benchmark: raw asyncio protocol on uvloop.

Why not ``llm-sidecar simulate``: it is an aiohttp app with one task and one
``asyncio.sleep`` per token, which costs more CPU per token than the proxies being
measured; on a 2-core machine it would compete with them and blur the comparison. This
server spends a few microseconds per token: one ``call_at`` timer per stream, one
pre-formatted HTTP chunk per event, one ``transport.write``.

Timing per stream: headers at once (as uvicorn does), the role chunk and token 0 at
``start + ttft``, token k at ``start + ttft + k * tpot`` (absolute deadlines, so timer
overshoot never accumulates), then the usage chunk if asked, ``[DONE]`` and the
terminating zero-length chunk. Keep-alive, so clients and proxies reuse connections.

``--shape mixed`` also answers what the mixed load shape asks (:mod:`bench.wire`):
``/v1/completions`` streams in vLLM 0.32's shape, the model the request names (one of
``wire.MODELS``, else 404 as vLLM does), ``"stream": false`` with one JSON body, and
``Connection: close`` (the connection closes after the response). A non-streamed answer
comes whole at ``start + ttft + (tokens - 1) * tpot``, the moment its streamed twin writes
its last token: vLLM generates both the same way, so the two kinds differ only in framing,
the concurrency stays what the client's connection count says, and what a proxy adds to
a non-streamed request is its latency beyond that schedule. ``--shape steady`` (the
default) is the steady shape's server exactly: chat streams only.

Run: ``python -m bench.upstream --port P --ttft 0.05 --tpot 0.02``; prints ``ready`` once
listening and a JSON line of counters when it gets SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import orjson

from .wire import (
    COMPLETIONS_PATH,
    MODEL,
    MODELS,
    PATH,
    PROMPT_TOKENS,
    STREAM_HEADER,
    CompletionWire,
    StreamWire,
    whole_body,
)

_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"server: bench-upstream\r\ntransfer-encoding: chunked\r\n\r\n"
)
_HEALTH = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
_BAD = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_SSE_HEAD_CLOSE = _SSE_HEAD[:-2] + b"connection: close\r\n\r\n"
_JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nserver: bench-upstream\r\n"
_NO_MODEL = b'{"error":{"message":"The model does not exist.","type":"NotFoundError","param":null,"code":404}}'
_LAST_CHUNK = b"0\r\n\r\n"
_MIXED_MODELS = frozenset((MODEL, *MODELS))
_STREAM_HEADER = STREAM_HEADER.lower()
_MAX_HEAD = 64 << 10


class Stats:
    __slots__ = ("started", "completed", "cancelled", "tokens", "connections")

    def __init__(self) -> None:
        self.started = self.completed = self.cancelled = self.tokens = self.connections = 0


def _chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


class UpstreamProtocol(asyncio.Protocol):
    __slots__ = (
        "_loop",
        "_ttft",
        "_tpot",
        "_stats",
        "_transport",
        "_buf",
        "_busy",
        "_wire",
        "_k",
        "_t0",
        "_timer",
        "_usage",
        "_mixed",
        "_close",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        ttft: float,
        tpot: float,
        stats: Stats,
        mixed: bool = False,
    ) -> None:
        self._loop = loop
        self._mixed = mixed
        self._close = False
        self._ttft = ttft
        self._tpot = tpot
        self._stats = stats
        self._transport: asyncio.Transport | None = None
        self._buf = b""
        self._busy = False
        self._wire: StreamWire | None = None
        self._k = 0
        self._t0 = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._usage = False

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._stats.connections += 1

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._busy:
            self._stats.cancelled += 1
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buf = self._buf + data if self._buf else data
        self._next_request()

    def _next_request(self) -> None:
        while not self._busy and self._transport is not None:
            buf = self._buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    self._transport.write(_BAD)
                    self._transport.close()
                return
            lines = buf[:end].decode("latin-1").split("\r\n")
            try:
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
            except ValueError:
                self._transport.write(_BAD)
                self._transport.close()
                return
            if "chunked" in headers.get("transfer-encoding", ""):
                self._transport.write(_BAD)  # the proxies under test send Content-Length
                self._transport.close()
                return
            if len(buf) < end + 4 + length:
                return
            body = buf[end + 4 : end + 4 + length]
            self._buf = buf[end + 4 + length :]
            self._request(method, path, headers, body)

    def _request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        transport = self._transport
        assert transport is not None
        if method == "GET" and path == "/health":
            transport.write(_HEALTH)
            return
        if self._mixed:
            self._mixed_request(method, path, headers, body)
            return
        if method != "POST" or not path.startswith("/v1/chat/completions"):
            transport.write(_NOT_FOUND)
            return
        try:
            doc = orjson.loads(body)
            tokens = int(doc["max_tokens"])
            stream_id = int(headers[_STREAM_HEADER])
            opts = doc.get("stream_options") or {}
            self._usage = bool(opts.get("include_usage"))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            transport.write(_BAD)
            transport.close()
            return
        self._stats.started += 1
        self._busy = True
        self._wire = StreamWire(stream_id, max(1, tokens))
        self._k = 0
        self._t0 = self._loop.time() + self._ttft
        transport.write(_SSE_HEAD)
        self._timer = self._loop.call_at(self._t0, self._tick)

    def _mixed_request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        """One request of the mixed shape: either route, any of the models, streamed or not."""
        transport = self._transport
        assert transport is not None
        route = path.split("?", 1)[0]
        if method != "POST" or route not in (PATH, COMPLETIONS_PATH):
            transport.write(_NOT_FOUND)
            return
        try:
            doc = orjson.loads(body)
            tokens = max(1, int(doc["max_tokens"]))
            stream_id = int(headers[_STREAM_HEADER])
            model = doc["model"]
            stream = doc.get("stream") is True
            opts = doc.get("stream_options") or {}
            self._usage = bool(opts.get("include_usage"))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            transport.write(_BAD)
            transport.close()
            return
        self._close = headers.get("connection", "").lower() == "close"
        if model not in _MIXED_MODELS:
            transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
                len(_NO_MODEL), _NO_MODEL,
            ))  # fmt: skip
            return
        self._stats.started += 1
        self._busy = True
        self._k = 0
        self._t0 = self._loop.time() + self._ttft
        if not stream:
            self._wire = None
            deadline = self._t0 + (tokens - 1) * self._tpot
            self._timer = self._loop.call_at(
                deadline, self._whole, whole_body(route, stream_id, tokens, model), tokens
            )
            return
        if route == COMPLETIONS_PATH:
            self._wire = CompletionWire(stream_id, tokens, model, self._usage)
        else:
            self._wire = StreamWire(stream_id, tokens, model)
        transport.write(_SSE_HEAD_CLOSE if self._close else _SSE_HEAD)
        self._timer = self._loop.call_at(self._t0, self._tick)

    def _whole(self, body: bytes, tokens: int) -> None:
        """A non-streamed answer, head and body in one write, when the generation ends."""
        self._timer = None
        transport = self._transport
        if transport is None:
            return
        close = b"connection: close\r\n" if self._close else b""
        transport.write(b"%scontent-length: %d\r\n%s\r\n%s" % (_JSON_HEAD, len(body), close, body))
        self._stats.tokens += tokens
        self._done()

    def _done(self) -> None:
        self._stats.completed += 1
        self._busy = False
        self._wire = None
        if self._close:
            self._buf = b""
            self._transport.close()
        elif self._buf:
            self._next_request()

    def _tick(self) -> None:
        self._timer = None
        transport, wire = self._transport, self._wire
        if transport is None or wire is None:
            return
        k = self._k
        if k == 0 and (role := wire.role()):  # completions have none
            transport.write(_chunk(role))
        transport.write(_chunk(wire.token(k)))
        self._stats.tokens += 1
        k += 1
        self._k = k
        if k < wire.tokens:
            self._timer = self._loop.call_at(self._t0 + k * self._tpot, self._tick)
            return
        tail = [_chunk(wire.usage(PROMPT_TOKENS))] if self._usage else []
        tail += [_chunk(wire.done()), _LAST_CHUNK]
        transport.write(b"".join(tail))
        self._done()


async def serve(host: str, port: int, ttft: float, tpot: float, shape: str = "steady") -> Stats:
    loop = asyncio.get_running_loop()
    stats = Stats()
    mixed = shape == "mixed"
    server = await loop.create_server(
        lambda: UpstreamProtocol(loop, ttft, tpot, stats, mixed),
        host,
        port,
        backlog=4096,
        reuse_address=True,
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    server.close()
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.upstream", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    parser.add_argument(
        "--tpot", type=float, default=0.02, help="seconds between tokens of one stream"
    )
    parser.add_argument(
        "--shape", choices=("steady", "mixed"), default="steady",
        help="mixed: also /v1/completions, non-streamed requests, several models, Connection: close",
    )  # fmt: skip
    args = parser.parse_args(argv)
    import uvloop  # noqa: PLC0415

    stats = uvloop.run(serve(args.host, args.port, args.ttft, args.tpot, args.shape))
    print(orjson.dumps({s: getattr(stats, s) for s in Stats.__slots__}).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
