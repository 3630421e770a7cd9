"""Bytes an inference server streams, built for tests: SSE events, OpenAI chat chunks,
HTTP/1.1 chunked framing, and an aiohttp upstream that writes a script of them.

One builder each, so a test says what differs (a finish reason, spaced JSON) and not how an
event is framed.
"""

from __future__ import annotations

import asyncio
import json

import orjson
from aiohttp import web

DONE = b"data: [DONE]\n\n"


def sse(data: bytes | dict, event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line, then ``data: <data>`` (a dict as compact JSON,
    UTF-8 unescaped, as orjson and the servers write it)."""
    payload = data if isinstance(data, bytes) else orjson.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    return head + b"data: " + payload + b"\n\n"


def chat_chunk(
    content: str | None = None,
    *,
    role: bool = False,
    reasoning: str | None = None,
    finish: str | None = None,
    id: str = "chatcmpl-1",
    model: str = "m1",
    created: int | None = 1,
    logprobs: bool = True,
    spaced: bool = False,
    **extra,
) -> bytes:
    """One OpenAI ``chat.completion.chunk`` event with one choice: the role's opening delta,
    a reasoning piece, a content piece or (none of them) an empty delta. ``created=None`` and
    ``logprobs=False`` leave those fields out; ``spaced`` writes JSON as Python's ``json.dumps``
    does by default (the parser's slower path), else compact as vLLM does; ``extra`` adds
    top-level fields (``usage``, ``service_tier``...)."""
    delta: dict = {}
    if role:
        delta = {"role": "assistant", "content": ""}
    elif reasoning is not None:
        delta = {"reasoning_content": reasoning}
    elif content is not None:
        delta = {"content": content}
    choice: dict = {"index": 0, "delta": delta}
    if logprobs:
        choice["logprobs"] = None
    choice["finish_reason"] = finish
    doc: dict = {"id": id, "object": "chat.completion.chunk"}
    if created is not None:
        doc["created"] = created
    doc.update({"model": model, "choices": [choice]})
    doc.update(extra)
    return b"data: " + json.dumps(doc, separators=None if spaced else (",", ":")).encode() + b"\n\n"


# The usage-only chunk vLLM sends last when the client asked for ``include_usage``.
USAGE = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m1",'
    b'"choices":[],"usage":{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5}}\n\n'
)


# -- HTTP/1.1 chunked framing -------------------------------------------------------------------

CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def http_chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (size in hex, CRLF, data, CRLF)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def chunked(*pieces: bytes) -> bytes:
    """A whole chunked body: one chunk per piece, then the last chunk."""
    return b"".join(http_chunk(p) for p in pieces) + LAST_CHUNK


# -- aiohttp upstreams: recorded bytes, or a script -----------------------------------------------


def replaying(
    raw: bytes,
    *,
    piece: int,
    content_type: str = "text/event-stream",
    headers=None,
    wait: float = 0.0,
    pause: float = 0.0,
    received: list[bytes] | None = None,
):
    """A handler that reads the request (its body into ``received``), waits ``wait`` seconds
    (the server thinking), then sends ``raw`` in ``piece``-byte writes, ``pause`` seconds
    apart, and ends the body cleanly at the HTTP level whatever ``raw`` said."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if received is not None:
            received.append(body)
        if wait:
            await asyncio.sleep(wait)
        resp = web.StreamResponse(headers={"Content-Type": content_type, **(headers or {})})
        await resp.prepare(request)
        for i in range(0, len(raw), piece):
            await resp.write(raw[i : i + piece])
            if pause:
                await asyncio.sleep(pause)
        await resp.write_eof()
        return resp

    return handler


def scripted(
    script: list[tuple[float, bytes]],
    *,
    status: int = 200,
    content_type: str = "text/event-stream",
    headers=None,
    sent=None,
    received=None,
):
    """A handler that writes each (delay, bytes) pair after its delay, flushed on its own; a
    delay that is an :class:`asyncio.Event` waits for the test to set it. ``sent`` collects
    what was written, ``received`` each request's headers."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        if received is not None:
            received.append(request.headers.copy())
        resp = web.StreamResponse(
            status=status, headers={"Content-Type": content_type, **(headers or {})}
        )
        await resp.prepare(request)
        for delay, data in script:
            if isinstance(delay, asyncio.Event):
                await delay.wait()
            elif delay:
                await asyncio.sleep(delay)
            await resp.write(data)
            if sent is not None:
                sent.append(data)
        await resp.write_eof()
        return resp

    return handler
