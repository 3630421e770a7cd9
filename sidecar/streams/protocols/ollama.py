"""Ollama's native API, ``/api/chat`` and ``/api/generate``: NDJSON, ``application/x-ndjson``.

Each line is one Go ``json.Marshal`` object followed by ``\\n``. ``/api/chat`` lines carry
``message`` (``role``, ``content``, ``thinking``, ``tool_calls``); ``/api/generate`` lines
carry ``response`` and ``thinking`` (and ``tool_calls`` on newer builds). The last object
has ``done: true``, ``done_reason`` (``stop``, ``length``, ``load``, ``unload``) and the
engine's own accounting::

    prompt_eval_count, eval_count                      -> Usage (input, output)
    load_duration, prompt_eval_duration, eval_duration -> EngineTimings (load, prefill, decode)

All durations are in NANOSECONDS (Go ``time.Duration``); the dialect reports seconds.
Every metric field is ``omitempty``: an absent count means zero or unknown, and is reported
as not known. ``prompt_eval_count`` is the prompt tokens Ollama evaluated, which leaves out
those reused from its prompt cache. ``total_duration`` (which includes everything) is not
an engine phase and is not reported.

What counts as a token (one per line that carries any of these; reasoning first, as it
came first when one line holds both):
- ``message.thinking`` / ``thinking`` non-empty   -> reasoning
- ``message.tool_calls`` / ``tool_calls`` non-empty -> tool
- ``message.content`` / ``response`` non-empty    -> answer
Each entry of ``tool_calls`` is one whole call (Ollama sends a call's arguments at once):
one :class:`ToolCallDelta` each, numbered in the order they came, so its assembly time is 0.
The first line of a thinking model's stream (``"response":""``) and the role-only or
empty final line are not tokens; a final ``done: true`` line that does carry text (as in
Ollama's streaming docs) is. Errors are ``{"error":"..."}`` lines, or the whole body of a
failed request. ``stream: false`` returns one object of the same shape, with the whole
text, parsed by :func:`parse_ollama_response`.
"""

from __future__ import annotations

from typing import Any

from ._base import (
    ANSWER,
    REASONING,
    TOOL,
    NDJSONDialect,
    add_engine_usage,
    error_of,
    int_or_none,
    load_object,
    seconds_or_none,
    str_or_none,
)
from .events import DialectEvent, EngineTimings, ResponseInfo, StreamEnd, ToolCallDelta

__all__ = ["OllamaStreamDialect", "parse_ollama_response", "engine_timings_from_ollama"]

_NS = 1e9


class OllamaStreamDialect(NDJSONDialect):
    """``/api/chat`` and ``/api/generate`` NDJSON bytes in, :mod:`events` out. Sans-I/O."""

    __slots__ = ("_seen_model", "_calls")

    def __init__(self, max_line_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes)
        self._seen_model = False
        self._calls = 0  # tool calls so far: the next one's number

    def _object(self, obj: dict[str, Any], out: list[DialectEvent]) -> None:
        err = error_of(obj)
        if err is not None:
            out.append(err)
            return
        if not self._seen_model:
            model = str_or_none(obj.get("model"))
            if model is not None:
                self._seen_model = True
                out.append(ResponseInfo(response_model=model))
        message = obj.get("message")
        source = message if type(message) is dict else obj
        if _nonempty_str(source.get("thinking")):
            out.append(REASONING)
        calls = source.get("tool_calls")
        if type(calls) is list and calls:
            out.append(TOOL)
            for call in calls:
                if type(call) is dict:
                    out.append(ToolCallDelta(self._calls))
                    self._calls += 1
        if _nonempty_str(source.get("content") if source is message else obj.get("response")):
            out.append(ANSWER)
        if obj.get("done") is True:
            _final(obj, out)
            out.append(StreamEnd())


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _final(obj: dict[str, Any], out: list[DialectEvent]) -> None:
    reason = obj.get("done_reason")
    if isinstance(reason, str) and reason:
        out.append(ResponseInfo(finish_reasons=(reason,)))
    add_engine_usage(
        out, int_or_none(obj.get("prompt_eval_count")), int_or_none(obj.get("eval_count"))
    )
    timings = engine_timings_from_ollama(obj)
    if timings is not None:
        out.append(timings)


def engine_timings_from_ollama(obj: Any) -> EngineTimings | None:
    """An Ollama final object's nanosecond durations -> :class:`EngineTimings` in seconds."""
    if type(obj) is not dict:
        return None
    timings = EngineTimings(
        load_seconds=seconds_or_none(obj.get("load_duration"), _NS),
        prefill_seconds=seconds_or_none(obj.get("prompt_eval_duration"), _NS),
        decode_seconds=seconds_or_none(obj.get("eval_duration"), _NS),
    )
    return None if timings == EngineTimings() else timings


def parse_ollama_response(body: bytes) -> list[DialectEvent]:
    """A whole ``stream: false`` body (one object, ``done: true``) -> events.

    Tokens are not emitted one by one (they arrived at once); the usage carries the count.
    """
    obj = load_object(body, error_of)
    if isinstance(obj, list):
        return obj
    out: list[DialectEvent] = [ResponseInfo(response_model=str_or_none(obj.get("model")))]
    _final(obj, out)
    return out
