"""What every JSON-per-event dialect shares: framing, JSON decoding, and value coercion.

A dialect subclasses :class:`SSEJSONDialect` or :class:`NDJSONDialect` and implements
``_object(obj, event_name, out)`` for one decoded JSON object; the base class owns the
framing decoder, turns framing overflows and undecodable payloads into
:class:`ParseError`, and never lets bad peer input raise.

The coercion helpers accept exactly what a well-formed server sends and map anything else
to ``None``: a count is a non-negative ``int`` (not ``bool``, not ``float``, not a string),
a duration a finite non-negative number. Garbage in one field never hides the others.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from ..ndjson import NDJSONDecoder
from ..sse import SSEDecoder, SSEEvent
from .events import DialectEvent, ParseError, StreamEnd

__all__ = [
    "SSEJSONDialect",
    "NDJSONDialect",
    "int_or_none",
    "str_or_none",
    "seconds_or_none",
    "load_object",
]

_DONE = b"[DONE]"


class SSEJSONDialect:
    """SSE framing + one JSON object per ``data``; ``data: [DONE]`` is a :class:`StreamEnd`."""

    __slots__ = ("_sse",)

    def __init__(self, max_line_bytes: int | None = None) -> None:
        self._sse = SSEDecoder(max_line_bytes) if max_line_bytes else SSEDecoder()

    def feed(self, chunk: bytes) -> list[DialectEvent]:
        return self._interpret(self._sse.feed(chunk))

    def close(self) -> list[DialectEvent]:
        return self._interpret(self._sse.close())

    def _interpret(self, framed: list) -> list[DialectEvent]:
        out: list[DialectEvent] = []
        for ev in framed:
            if type(ev) is not SSEEvent:
                out.append(ParseError(ev.reason))
                continue
            data = ev.data
            if data == _DONE:
                out.append(StreamEnd())
                continue
            if not data.strip():
                continue  # an empty data: line carries nothing to measure
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                out.append(ParseError("data is not JSON"))
                continue
            if type(obj) is not dict:
                out.append(ParseError("data is not a JSON object"))
                continue
            self._object(obj, ev.event, out)
        return out

    def _object(self, obj: dict[str, Any], event: str, out: list[DialectEvent]) -> None:
        raise NotImplementedError


class NDJSONDialect:
    """NDJSON framing + one JSON object per line."""

    __slots__ = ("_nd",)

    def __init__(self, max_line_bytes: int | None = None) -> None:
        self._nd = NDJSONDecoder(max_line_bytes) if max_line_bytes else NDJSONDecoder()

    def feed(self, chunk: bytes) -> list[DialectEvent]:
        return self._interpret(self._nd.feed(chunk))

    def close(self) -> list[DialectEvent]:
        return self._interpret(self._nd.close())

    def _interpret(self, lines: list) -> list[DialectEvent]:
        out: list[DialectEvent] = []
        for line in lines:
            if type(line) is not bytes:
                out.append(ParseError(line.reason))
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                out.append(ParseError("line is not JSON"))
                continue
            if type(obj) is not dict:
                out.append(ParseError("line is not a JSON object"))
                continue
            self._object(obj, out)
        return out

    def _object(self, obj: dict[str, Any], out: list[DialectEvent]) -> None:
        raise NotImplementedError


def load_object(body: bytes) -> dict[str, Any] | ParseError:
    """A whole non-streaming body -> its JSON object, or the :class:`ParseError` to report."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ParseError("response is not JSON")
    if type(obj) is not dict:
        return ParseError("response is not a JSON object")
    return obj


def int_or_none(value: Any) -> int | None:
    """A token count: a non-negative ``int`` (``bool`` is not a count)."""
    return value if type(value) is int and value >= 0 else None


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def seconds_or_none(value: Any, per_second: float) -> float | None:
    """A duration in some unit (``per_second`` units make one second) -> seconds."""
    if type(value) is int:
        if value < 0:
            return None
        return value / per_second
    if type(value) is float and value >= 0.0 and math.isfinite(value):
        return value / per_second
    return None
