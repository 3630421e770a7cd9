"""The relay: I/O only. Forwards any request to the upstream and streams the response back
chunk by chunk, handing a copy of each chunk to the observer *after* writing it.

Order of duties for every chunk: read from upstream, note the time, write to the client,
then measure. Measuring never raises into this loop (see :mod:`sidecar.observe`) and the
figures flow out through one :class:`~sidecar.timeline.RequestTimeline` per request,
finalised exactly once in ``finally``.

Faults map to what a client can act on:
- upstream refused / unreachable / broken before headers -> 502 with a JSON error body
- upstream connect or read timeout before headers        -> 504 with a JSON error body
- upstream dies or stalls past the idle timeout mid-stream -> the client connection is
  closed after flushing what was relayed, so the client sees a truncated stream instead
  of a clean end (and never hangs)
- client goes away -> the upstream response is closed at once, so the server stops
  generating; outcome ``cancelled`` with the partial figures
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Protocol

import aiohttp
import orjson
import structlog
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from .observe import ResponseObserver
from .routes import OTHER, Route, match_route
from .timeline import Outcome, RequestTimeline
from .usage_injection import UsageEventFilter, request_with_usage

__all__ = ["Proxy", "HOP_BY_HOP", "Recorder", "error_response"]

# RFC 9110 section 7.6.1, plus the de-facto Proxy-Connection and Keep-Alive.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Not hop-by-hop, but ours to set: Host comes from the upstream URL, and the body has
# already been accepted by this server, so the upstream must not be asked to continue.
_NOT_FORWARDED_TO_UPSTREAM = HOP_BY_HOP | {"host", "expect"}
# aiohttp would otherwise add headers the client never sent.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")

_log = structlog.get_logger("sidecar.proxy")

Recorder = Callable[[RequestTimeline, str], None]
"""Called once per finished request with the timeline and its bounded model label."""


class RequestTracer(Protocol):
    """What the proxy needs from tracing (see :mod:`sidecar.tracing`)."""

    def start(self, headers: Mapping[str, str], timeline: RequestTimeline) -> None:
        """Begin the request's span in the client's trace; set ``timeline.trace``/``trace_id``."""

    def inject(self, timeline: RequestTimeline, headers: MutableMapping[str, str]) -> None:
        """Add trace-context headers for the upstream request."""


def _connection_listed(headers) -> set[str]:
    listed: set[str] = set()
    for value in headers.getall("Connection", ()):
        listed.update(token.strip().lower() for token in value.split(",") if token.strip())
    return listed


def _filter_headers(headers, drop: frozenset[str] | set[str]) -> CIMultiDict[str]:
    listed = _connection_listed(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower in drop or lower in listed:
            continue
        out.add(name, value)
    return out


# Where each API puts its output-length limit: top level, TGI's parameters, Ollama's options.
_MAX_TOKEN_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens", "max_new_tokens", "n_predict")


def _max_tokens_of(doc: dict) -> int | None:
    for holder in (doc, doc.get("parameters"), doc.get("options")):
        if type(holder) is dict:
            for key in (*_MAX_TOKEN_KEYS, "num_predict"):
                value = holder.get(key)
                if type(value) is int:
                    return value
    return None


def error_response(status: int, kind: str, message: str) -> web.Response:
    """An OpenAI-style error body, so SDKs surface a clean message instead of a parse error."""
    body = orjson.dumps({"error": {"message": message, "type": kind, "code": status}})
    return web.Response(
        status=status,
        body=body,
        content_type="application/json",
        headers={"X-LLM-Sidecar-Error": kind},
    )


class Proxy:
    """The aiohttp handler for every method and path of the proxy port."""

    def __init__(
        self,
        upstream: str,
        session_getter: Callable[[], aiohttp.ClientSession],
        *,
        connect_timeout: float,
        read_timeout: float,
        model_label: Callable[[str | None], str],
        on_start: Callable[[str, str], None] | None = None,
        recorders: Iterable[Recorder] = (),
        max_request_inspect_bytes: int = 32 << 20,
        max_response_inspect_bytes: int = 16 << 20,
        max_line_bytes: int | None = None,
        inject_stream_usage: bool = True,
        tracer: RequestTracer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._base = upstream.rstrip("/")
        self._session = session_getter
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._model_label = model_label
        self._on_start = on_start
        self._recorders = tuple(recorders)
        self._max_inspect = max_request_inspect_bytes
        self._max_json = max_response_inspect_bytes
        self._max_line = max_line_bytes
        self._inject_usage = inject_stream_usage
        self._tracer = tracer
        self._clock = clock
        self.in_flight = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        start = self._clock()
        route, model = match_route(request.path, request.method)
        body, doc, injected = await self._request_body(request, route)
        if doc is not None:
            value = doc.get("model")
            model = model or (value if isinstance(value, str) else None)
        timeline = RequestTimeline(start, request.method, route.template, model or "")
        if doc is not None:
            timeline.request_stream = doc.get("stream") is True
            timeline.request_max_tokens = _max_tokens_of(doc)
        label = self._model_label(model)
        self.in_flight += 1
        if self._on_start is not None:
            self._safely(self._on_start, label, route.template)
        if self._tracer is not None:
            self._safely(self._tracer.start, request.headers, timeline)
        outcome, error_type = Outcome.ERROR, "internal"
        try:
            outcome, error_type, response = await self._relay(request, route, body, timeline, injected)
            return response
        except asyncio.CancelledError:
            outcome, error_type = Outcome.CANCELLED, "client_disconnected"
            raise
        finally:
            self.in_flight -= 1
            if timeline.finish(outcome, self._clock(), error_type):
                for recorder in self._recorders:
                    self._safely(recorder, timeline, label)

    # -- request -----------------------------------------------------------------------

    async def _request_body(self, request: web.Request, route: Route):
        """The body to forward, the request's JSON object on known API routes (else None),
        and whether usage reporting was added to the forwarded body.

        A known API route's JSON body is read whole (bounded by ``max_request_inspect_bytes``)
        so the model can label the figures: the server needs the whole JSON before it can
        start anyway, so this adds no time to first token. Every other body is streamed.
        See usage_injection for the last value.
        """
        if not request.body_exists:
            return None, None, False
        length = request.content_length
        if route is OTHER or request.method != "POST" or length is None or length > self._max_inspect:
            return request.content, None, False
        body = await request.read()
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body, None, False
        if type(doc) is not dict:
            return body, None, False
        if self._inject_usage and route.usage_injectable:
            rewritten = request_with_usage(doc)
            if rewritten is not None:
                return orjson.dumps(rewritten), doc, True
        return body, doc, False

    def _upstream_headers(self, request: web.Request, body, timeline: RequestTimeline) -> CIMultiDict[str]:
        headers = _filter_headers(request.headers, _NOT_FORWARDED_TO_UPSTREAM)
        if isinstance(body, bytes):
            headers.popall("Content-Length", None)  # aiohttp sets it from the bytes
        peer = request.remote or ""
        prior = request.headers.get("X-Forwarded-For")
        headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
        headers["X-Forwarded-Proto"] = request.scheme
        if request.host:
            headers["X-Forwarded-Host"] = request.host
        if self._tracer is not None and timeline.trace is not None:
            self._safely(self._tracer.inject, timeline, headers)
        return headers

    # -- response ----------------------------------------------------------------------

    async def _relay(self, request: web.Request, route: Route, body, timeline: RequestTimeline, injected: bool):
        url = URL(self._base + request.raw_path, encoded=True)
        try:
            upstream = await self._session().request(
                request.method,
                url,
                headers=self._upstream_headers(request, body, timeline),
                data=body,
                allow_redirects=False,
                timeout=self._timeout,
                skip_auto_headers=_SKIP_AUTO_HEADERS,
                auto_decompress=False,
            )
        except asyncio.TimeoutError:
            return self._fail(timeline, 504, "upstream_timeout", "the inference server did not answer in time")
        except aiohttp.ClientConnectorError:
            return self._fail(timeline, 502, "upstream_unreachable", "the inference server refused or is unreachable")
        except aiohttp.ClientError:
            return self._fail(timeline, 502, "upstream_disconnected", "the inference server closed the connection")

        released = False
        try:
            result = await self._stream(request, route, upstream, timeline, injected)
            released = result[0] is Outcome.OK or result[1] == "upstream_status"
            return result
        finally:
            # A fully read body returns the connection to the pool; anything else closes
            # it, which is how the server learns to stop generating for a gone client.
            upstream.release() if released else upstream.close()

    def _fail(self, timeline: RequestTimeline, status: int, kind: str, message: str):
        timeline.response_started(self._clock(), status, streamed=False)
        return Outcome.ERROR, kind, error_response(status, kind, message)

    async def _stream(self, request, route, upstream: aiohttp.ClientResponse, timeline, injected: bool):
        now = self._clock()
        streamed_type = upstream.headers.get("Content-Type", "")
        observer = ResponseObserver(
            route,
            timeline,
            streamed_type,
            upstream.headers.get("Content-Encoding", ""),
            max_json_bytes=self._max_json,
            max_line_bytes=self._max_line,
        )
        timeline.response_started(now, upstream.status, observer.streaming)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(_filter_headers(upstream.headers, HOP_BY_HOP))
        await response.prepare(request)

        # The client did not ask for usage, we did: drop the usage event it never asked for.
        hide_usage = (
            UsageEventFilter()
            if injected and observer.streaming and "Content-Length" not in upstream.headers
            else None
        )
        outcome = Outcome.ERROR if upstream.status >= 500 else Outcome.OK
        error_type = "upstream_status" if upstream.status >= 500 else None
        content = upstream.content
        try:
            while True:
                try:
                    chunk = await content.readany()
                except asyncio.TimeoutError:
                    outcome, error_type = Outcome.ERROR, "upstream_read_timeout"
                    break
                except aiohttp.ClientError:
                    outcome, error_type = Outcome.ERROR, "upstream_disconnected"
                    break
                if not chunk:
                    break
                now = self._clock()
                try:
                    if hide_usage is None:
                        await response.write(chunk)
                    else:
                        relayed = hide_usage.feed(chunk)
                        if relayed:
                            await response.write(relayed)
                except ConnectionError:
                    return Outcome.CANCELLED, "client_disconnected", response
                observer.feed(chunk, now)
            if hide_usage is not None:
                held = hide_usage.close()  # never lose a byte, even of a broken stream
                if held:
                    try:
                        await response.write(held)
                    except ConnectionError:
                        return Outcome.CANCELLED, "client_disconnected", response
        finally:
            observer.close(self._clock())

        if error_type in ("upstream_read_timeout", "upstream_disconnected"):
            # Flush what was relayed, then close: a truncated stream, never a false clean end.
            response.force_close()
            if request.transport is not None:
                request.transport.close()
            return outcome, error_type, response
        try:
            await response.write_eof()
        except ConnectionError:
            return Outcome.CANCELLED, "client_disconnected", response
        return outcome, error_type, response

    @staticmethod
    def _safely(fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # telemetry never breaks the relay
            _log.exception("recorder_failed", recorder=getattr(fn, "__qualname__", repr(fn)))
