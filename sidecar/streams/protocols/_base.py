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
from collections.abc import Callable
from typing import Any

import orjson

from ..ndjson import NDJSONDecoder, NDJSONOverflow
from ..sse import SSEDecoder, SSEEvent, SSEOverflow
from .events import (
    DialectEvent,
    ParseError,
    StreamEnd,
    StreamError,
    TokenKind,
    Tokens,
    ToolCallDelta,
    Usage,
)
from .template import EventTemplate

__all__ = [
    "SSEJSONDialect",
    "NDJSONDialect",
    "ANSWER",
    "REASONING",
    "TOOL",
    "NO_ENGINE_COUNTS",
    "int_or_none",
    "str_or_none",
    "code_or_none",
    "seconds_or_none",
    "load_object",
    "error_of",
    "add_engine_usage",
    "usage_reader",
]

# One token of each kind: the event of nearly every stream event, built once and shared by
# every dialect (events are never mutated after creation).
ANSWER = Tokens(TokenKind.ANSWER, 1)
REASONING = Tokens(TokenKind.REASONING, 1)
TOOL = Tokens(TokenKind.TOOL, 1)
# The engine's counts when it reported none: not worth an event.
NO_ENGINE_COUNTS = Usage(engine=True)

_DONE = b"[DONE]"
_STREAM_END = StreamEnd()  # events are never mutated after creation: one serves every stream


class SSEJSONDialect:
    """SSE framing + one JSON object per ``data``; ``data: [DONE]`` is a :class:`StreamEnd`.

    ``HAS_END_MARKER``: the protocol always ends a complete stream with a marker the
    dialect reports as :class:`StreamEnd`, so a stream without one was cut short. A
    dialect whose protocol just stops (Triton) sets it False.

    A dialect that defines ``_token_text`` (the text of a one-token event, from its decoded
    object) and ``_state`` (a comparable snapshot of everything ``_object`` changes), and
    whose events and state depend on that text only through whether it is empty, gets its
    repeating event recognised from the bytes (:mod:`.template`): the same events without
    decoding it again. The decoded path is the oracle; it learns the template, and takes
    over at the first event of another shape. A dialect that also sets ``_settled`` for an
    event it knows to be a fixed point has that event's template armed without waiting for
    a second (:meth:`_learn`).
    """

    __slots__ = ("_sse", "_memo", "_candidate", "_learning", "_settled")
    HAS_END_MARKER = True
    LEARN_TRIES = 4
    """Templates a stream may learn without arming one before it stops trying (a stream
    whose every token event differs outside the text pays this many)."""
    _token_text: Callable[[dict[str, Any]], object] | None = None

    def __init__(self, max_line_bytes: int | None = None) -> None:
        self._sse = SSEDecoder(max_line_bytes) if max_line_bytes else SSEDecoder()
        self._memo: EventTemplate | None = None  # armed: its events stand for a match
        self._candidate: EventTemplate | None = None  # learned once, not yet confirmed
        self._learning = self.LEARN_TRIES if self._token_text is not None else 0
        # Set by a templated dialect's _object to the text of the event it read when that
        # event is settled: read again from the state it left, it would leave that state and
        # give the same events for any non-empty text in its place (cleared before each
        # event that may teach).
        self._settled: str | None = None

    def feed(self, chunk: bytes) -> list[DialectEvent]:
        memo = self._memo
        if memo is not None and memo.matches(chunk):
            # The repeating event. The decoder is idle (a template is dropped whenever the
            # general framing runs) and the chunk within lone_data's bounds: lone_data
            # would give its data, and the template says what that data gives.
            return list(memo.events)
        # Nearly every chunk is one plain event: take its data without building the
        # SSEEvent and the list that feed() would (SSEDecoder.lone_data says why it is the same).
        data = self._sse.lone_data(chunk)
        if data is None:
            self._memo = self._candidate = None
            return self._interpret(self._sse.feed(chunk))
        out: list[DialectEvent] = []
        if memo is not None:
            if memo.frames(chunk):
                # The shape with a text that is not plain (an escaped newline or quote): it
                # is decoded, and the template stays while the state stays a fixed point.
                before = self._state()  # type: ignore[attr-defined]  # a templated dialect's
                self._data(data, "message", out)
                if self._state() != before:  # type: ignore[attr-defined]  # a templated dialect's
                    self._memo = None
                return out
            self._memo = None  # another shape: decoded, and it may change the state
        if self._candidate is not None:
            self._confirm(self._candidate, chunk, data, out)
            return out
        self._settled = None
        obj = self._data(data, "message", out)
        # (a token event of at most two events, as _learn takes: a stream's last token with
        # its finish is not asked)
        if obj is not None and self._learning and out and type(out[0]) is Tokens and not out[2:]:
            self._learn(chunk, data, obj, out, self._settled)
        return out

    def _learn(
        self,
        chunk: bytes,
        data: bytes,
        obj: dict[str, Any],
        out: list[DialectEvent],
        settled: str | None = None,
    ) -> None:
        """``chunk``'s event (its ``data``, decoded as ``obj`` into ``out``) gave a token: a
        template, when it is one token event (with a tool call's piece, maybe).

        Armed at once when the dialect ``settled`` the event (``_object`` set
        :attr:`_settled` to its text, the one ``_token_text`` reads: read again from the
        state it left, it leaves that state and gives the same events, whatever its
        non-empty text) and ``data`` holds no backslash: then
        every string in it is written verbatim, so the one place the text is written
        (``EventTemplate.learn`` finds it exactly once) is the field the dialect read it
        from. That is what :meth:`_confirm` learns from a second event with another text
        there, known from this one. Otherwise it is a candidate for the next event to
        confirm."""
        # (the count read from slices, which make no call: this runs for every token event
        # while learning, and for a stream's last token with its finish)
        if not out[1:] or (type(out[1]) is ToolCallDelta and not out[2:]):
            self._learning -= 1
            text = self._token_text(obj) if settled is None else settled  # type: ignore[misc]  # set: learning
            candidate = EventTemplate.learn(chunk, data, text, out)
            if candidate is not None and settled is not None and b"\\" not in data:
                self._arm(candidate, repeated=False)
            else:
                self._candidate = candidate

    def _arm(self, template: EventTemplate, *, repeated: bool) -> None:
        """Let ``template``'s events stand for every later event of its shape. One whose
        shape was seen to repeat gives the stream its tries back; one armed from a single
        event keeps the try it took, so a stream whose every event has a shape of its own
        still stops learning after ``LEARN_TRIES``."""
        template.limit = self._sse.lone_limit(template.spaced)
        template.text = None
        self._memo, self._candidate = template, None
        if repeated:
            self._learning = self.LEARN_TRIES

    def _confirm(
        self, candidate: EventTemplate, chunk: bytes, data: bytes, out: list[DialectEvent]
    ) -> None:
        """Decode ``data`` (``chunk``'s) as always, and confirm the candidate on the way.

        A candidate (an event :meth:`_learn` could not arm by itself) is armed only when a
        second event of its shape, with a different text there, gave the candidate's events
        and left the state as it was: then the text is what varies in that place (the rest
        of both events is the same bytes) and the state is a fixed point of the shape, so
        every later event of the shape gives the same events.
        An event of another shape drops the candidate, and may give one of its own."""
        text = candidate.text_of(chunk)
        if text is not None:
            before = self._state()  # type: ignore[attr-defined]  # a templated dialect's
            obj = self._data(data, "message", out)
            if (
                obj is not None
                and tuple(out) == candidate.events
                and self._state() == before  # type: ignore[attr-defined]  # a templated dialect's
                and self._token_text(obj) == text.decode()  # type: ignore[misc]  # set: learning
            ):
                if text != candidate.text:
                    self._arm(candidate, repeated=True)
                return  # (the same text twice: where the text is is not told apart yet)
            self._candidate = None
            return
        self._candidate = None
        obj = self._data(data, "message", out)
        if obj is not None and self._learning and out and type(out[0]) is Tokens:
            self._learn(chunk, data, obj, out)

    def close(self) -> list[DialectEvent]:
        framed = self._sse.close()
        return self._interpret(framed) if framed else []

    def _interpret(self, framed: list[SSEEvent | SSEOverflow]) -> list[DialectEvent]:
        out: list[DialectEvent] = []
        for ev in framed:
            if type(ev) is SSEEvent:
                self._data(ev.data, ev.event, out)
            else:
                out.append(ParseError(ev.reason))  # type: ignore[union-attr]  # an SSEOverflow
        return out

    def _data(self, data: bytes, event: str, out: list[DialectEvent]) -> dict[str, Any] | None:
        """One event's data: ``[DONE]``, nothing (blank), or a JSON object for _object
        (returned, for :meth:`_learn`)."""
        if data == _DONE:
            out.append(_STREAM_END)
            return None
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            # Blank data (only ASCII whitespace, which is never valid JSON, so it always
            # lands here) carries nothing to measure; testing for it after the parse
            # rather than before spares every good event a strip().
            if data.strip():
                out.append(ParseError("data is not JSON"))
            return None
        if type(obj) is not dict:
            out.append(ParseError("data is not a JSON object"))
            return None
        self._object(obj, event, out)
        return obj

    def _object(self, obj: dict[str, Any], event: str, out: list[DialectEvent]) -> None:
        raise NotImplementedError


class NDJSONDialect:
    """NDJSON framing + one JSON object per line (``HAS_END_MARKER`` as for SSE)."""

    __slots__ = ("_nd",)
    HAS_END_MARKER = True

    def __init__(self, max_line_bytes: int | None = None) -> None:
        self._nd = NDJSONDecoder(max_line_bytes) if max_line_bytes else NDJSONDecoder()

    def feed(self, chunk: bytes) -> list[DialectEvent]:
        return self._interpret(self._nd.feed(chunk))

    def close(self) -> list[DialectEvent]:
        return self._interpret(self._nd.close())

    def _interpret(self, lines: list[bytes | NDJSONOverflow]) -> list[DialectEvent]:
        out: list[DialectEvent] = []
        for line in lines:
            if type(line) is not bytes:
                out.append(ParseError(line.reason))  # type: ignore[union-attr]  # an NDJSONOverflow
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


def load_object(
    body: bytes, read_error: Callable[[dict[str, Any]], StreamError | None] | None = None
) -> dict[str, Any] | list[DialectEvent]:
    """A whole non-streaming body -> its JSON object, or (a list) the events to answer with
    instead: the :class:`ParseError`, or the error the body is when ``read_error`` finds one."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return [ParseError("response is not JSON")]
    if type(obj) is not dict:
        return [ParseError("response is not a JSON object")]
    if read_error is not None:
        err = read_error(obj)
        if err is not None:
            return [err]
    return obj


def error_of(obj: dict[str, Any]) -> StreamError | None:
    """The commonest error shapes, ``{"error": "..."}`` and ``{"error": {"message", "type"}}``
    (Ollama, Triton, Anthropic, and the proxies in front of the others); ``None`` if neither."""
    err = obj.get("error")
    if isinstance(err, str):
        return StreamError(err)
    if type(err) is dict:
        return StreamError(str(err.get("message", "")), str_or_none(err.get("type")))
    return None


def add_engine_usage(
    out: list[DialectEvent],
    input_tokens: int | None,
    output_tokens: int | None,
    cached_input_tokens: int | None = None,
) -> None:
    """The engine's own counts (:class:`Usage` with ``engine=True``), when it reported any."""
    usage = Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached_input_tokens,
        engine=True,
    )
    if usage != NO_ENGINE_COUNTS:
        out.append(usage)


def usage_reader(
    input_key: str, output_key: str, input_details_key: str, output_details_key: str
) -> Callable[[Any], Usage | None]:
    """A reader of an OpenAI-shaped ``usage`` object (Chat Completions and Responses name
    the same four counts differently): the usage object -> :class:`Usage`, ``None`` if it is
    not one. A reader per spelling, not one function taking the keys, so reading a usage on
    every chunk (vLLM) costs no call more than it did."""

    def read(usage: Any) -> Usage | None:
        # int_or_none and dict.get written out: vLLM sends a usage on every chunk when asked
        # (or forced), so this runs once a token there, and these are the same tests.
        if type(usage) is not dict:
            return None
        inputs = usage[input_key] if input_key in usage else None
        outputs = usage[output_key] if output_key in usage else None
        details = usage[output_details_key] if output_details_key in usage else None
        reasoning = (
            details["reasoning_tokens"]
            if type(details) is dict and "reasoning_tokens" in details
            else None
        )
        details = usage[input_details_key] if input_details_key in usage else None
        cached = (
            details["cached_tokens"]
            if type(details) is dict and "cached_tokens" in details
            else None
        )
        return Usage(
            input_tokens=inputs if type(inputs) is int and inputs >= 0 else None,
            output_tokens=outputs if type(outputs) is int and outputs >= 0 else None,
            reasoning_tokens=reasoning if type(reasoning) is int and reasoning >= 0 else None,
            cached_input_tokens=cached if type(cached) is int and cached >= 0 else None,
        )

    read.__doc__ = f"``usage`` with ``{input_key}``, ``{output_key}`` -> :class:`Usage` (``None`` if it is not one)."
    return read


def int_or_none(value: Any) -> int | None:
    """A token count: a non-negative ``int`` (``bool`` is not a count)."""
    return value if type(value) is int and value >= 0 else None


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def code_or_none(value: Any) -> int | str | None:
    """An error code: an ``int`` or a string (``bool`` is not a code)."""
    return value if isinstance(value, (int, str)) and type(value) is not bool else None


def seconds_or_none(value: Any, per_second: float) -> float | None:
    """A duration in some unit (``per_second`` units make one second) -> seconds."""
    if type(value) is int:
        if value < 0:
            return None
        return value / per_second
    if type(value) is float and value >= 0.0 and math.isfinite(value):
        return value / per_second
    return None
