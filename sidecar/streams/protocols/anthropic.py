"""Anthropic Messages (``POST /v1/messages``): named SSE events, ``text/event-stream``.

A stream is ``message_start``, then per content block ``content_block_start``, one or more
``content_block_delta`` and ``content_block_stop``, then ``message_delta`` (stop reason and
cumulative usage) and ``message_stop``; ``ping`` events may appear anywhere and ``error``
events (e.g. ``overloaded_error``) may replace the rest. The JSON ``type`` decides (the SSE
event name is the fallback); unknown event and delta types are ignored, as Anthropic's
versioning policy asks.

What counts as a token (one per ``content_block_delta`` whose payload is non-empty):
- ``text_delta`` (``text``)                 -> answer
- ``thinking_delta`` (``thinking``)         -> reasoning
- ``input_json_delta`` (``partial_json``)   -> tool (``tool_use`` and ``server_tool_use``)
``signature_delta`` (the thinking block's integrity signature), ``citations_delta``,
``ping`` and the empty initial blocks of ``content_block_start`` are not tokens.

Tool calls (:class:`ToolCallDelta`, the block's ``index`` telling parallel calls apart): a
``tool_use`` block's ``content_block_start`` (the call's id and name) and each non-empty
``input_json_delta`` of that block. ``server_tool_use`` blocks (web search and other tools
Anthropic runs itself) are tool tokens but no call the client waits on.

Usage. ``message_start`` carries ``message.usage`` with the input counts (and a provisional
``output_tokens`` of 1 or 2, which is ignored: it is not the final count);
``message_delta.usage`` carries the cumulative ``output_tokens`` and, on newer API
versions, the final input counts too, which then win. Anthropic's ``input_tokens``
excludes prompt-cache traffic, so input is reported as
``input_tokens + cache_creation_input_tokens + cache_read_input_tokens`` (every prompt
token, as the OpenTelemetry GenAI conventions define ``gen_ai.usage.input_tokens`` and as
OpenAI's ``prompt_tokens`` already is) and cached input as ``cache_read_input_tokens``.
Each :class:`Usage` the dialect emits is the merged state so far (last one wins).
"""

from __future__ import annotations

from typing import Any

from ._base import (
    ANSWER,
    REASONING,
    TOOL,
    SSEJSONDialect,
    error_of,
    int_or_none,
    load_object,
    str_or_none,
)
from .events import (
    MAX_INDICES_PER_RESPONSE,
    DialectEvent,
    GenerationDone,
    ResponseInfo,
    StreamEnd,
    StreamError,
    Tokens,
    ToolCallDelta,
    Usage,
)

__all__ = ["AnthropicStreamDialect", "parse_anthropic_response", "usage_from_anthropic"]

# delta type -> (field holding the payload, token kind)
_DELTAS: dict[str, tuple[str, Tokens]] = {
    "text_delta": ("text", ANSWER),
    "thinking_delta": ("thinking", REASONING),
    "input_json_delta": ("partial_json", TOOL),
}


class AnthropicStreamDialect(SSEJSONDialect):
    """``/v1/messages`` SSE bytes in, :mod:`events` out. Sans-I/O; safe at any split."""

    __slots__ = ("_input", "_cached", "_output", "_info_sent", "_tool_blocks")

    MAX_TOOL_BLOCKS = MAX_INDICES_PER_RESPONSE
    """Tool-use block indices remembered per stream (a hostile stream cannot grow it)."""

    def __init__(self, max_line_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes)
        self._input: int | None = None
        self._cached: int | None = None
        self._output: int | None = None
        self._info_sent = False
        self._tool_blocks: set[int] | None = None  # indices of the tool_use blocks so far

    def _object(self, obj: dict[str, Any], event: str, out: list[DialectEvent]) -> None:
        kind = obj.get("type")
        if not isinstance(kind, str):
            kind = event
        if kind == "content_block_delta":
            delta: Any = obj.get("delta")  # JSON
            dtype = delta.get("type") if type(delta) is dict else None
            if isinstance(dtype, str):
                spec = _DELTAS.get(dtype)
                if spec is not None:
                    payload = delta.get(spec[0])
                    if isinstance(payload, str) and payload:
                        out.append(spec[1])
                        if spec[1] is TOOL and self._tool_blocks is not None:
                            index = obj.get("index")
                            if type(index) is int and index in self._tool_blocks:
                                out.append(ToolCallDelta(index))
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if type(block) is dict:
                # Blocks open empty; a server that puts the first piece here still made a token.
                if isinstance(block.get("thinking"), str) and block["thinking"]:
                    out.append(REASONING)
                elif isinstance(block.get("text"), str) and block["text"]:
                    out.append(ANSWER)
                elif block.get("type") == "tool_use":
                    self._tool_start(obj.get("index"), out)
        elif kind == "message_start":
            message = obj.get("message")
            if type(message) is not dict:
                return
            if not self._info_sent:
                model, mid = str_or_none(message.get("model")), str_or_none(message.get("id"))
                if model is not None or mid is not None:
                    self._info_sent = True
                    out.append(ResponseInfo(response_model=model, response_id=mid))
            if self._merge(message.get("usage"), with_output=False):
                out.append(self._usage())
        elif kind == "message_delta":
            delta = obj.get("delta")
            if type(delta) is dict:
                reason = delta.get("stop_reason")
                if isinstance(reason, str):
                    out.append(ResponseInfo(finish_reasons=(reason,)))
            if self._merge(obj.get("usage"), with_output=True):
                out.append(self._usage())
            if type(delta) is dict and isinstance(delta.get("stop_reason"), str):
                out.append(GenerationDone())  # the answer is whole; message_stop only closes
        elif kind == "message_stop":
            out.append(StreamEnd())
        elif kind == "error":
            out.append(error_of(obj) or StreamError(""))
        # ping, content_block_stop and unknown event types carry nothing to measure

    def _tool_start(self, index: Any, out: list[DialectEvent]) -> None:
        """A ``tool_use`` block opened: the call's first piece (its id and name)."""
        if type(index) is not int or index < 0:
            return
        blocks = self._tool_blocks
        if blocks is None:
            blocks = self._tool_blocks = set()
        if index not in blocks and len(blocks) >= self.MAX_TOOL_BLOCKS:
            return
        blocks.add(index)
        out.append(ToolCallDelta(index))

    def _merge(self, usage: Any, with_output: bool) -> bool:
        if type(usage) is not dict:
            return False
        changed = False
        total = _input_total(usage)
        if total is not None:
            self._input = total
            changed = True
        cached = int_or_none(usage.get("cache_read_input_tokens"))
        if cached is not None:
            self._cached = cached
            changed = True
        if with_output:
            output = int_or_none(usage.get("output_tokens"))
            if output is not None:
                self._output = output
                changed = True
        return changed

    def _usage(self) -> Usage:
        return Usage(
            input_tokens=self._input, output_tokens=self._output, cached_input_tokens=self._cached
        )


def _input_total(usage: dict[str, Any]) -> int | None:
    base = int_or_none(usage.get("input_tokens"))
    if base is None:
        return None
    created = int_or_none(usage.get("cache_creation_input_tokens")) or 0
    read = int_or_none(usage.get("cache_read_input_tokens")) or 0
    return base + created + read


def usage_from_anthropic(usage: Any) -> Usage | None:
    """A Message's ``usage`` object -> :class:`Usage` (``None`` if it is not one)."""
    if type(usage) is not dict:
        return None
    return Usage(
        input_tokens=_input_total(usage),
        output_tokens=int_or_none(usage.get("output_tokens")),
        cached_input_tokens=int_or_none(usage.get("cache_read_input_tokens")),
    )


def parse_anthropic_response(body: bytes) -> list[DialectEvent]:
    """A whole non-streaming Message (or ``{"type":"error",...}`` body) -> events.

    Tokens are not emitted one by one (they arrived at once); the usage carries the count.
    """
    obj = load_object(body)
    if isinstance(obj, list):
        return obj
    if obj.get("type") == "error" or (obj.get("type") != "message" and "error" in obj):
        err = error_of(obj)
        if err is not None:
            return [err]
    reason = obj.get("stop_reason")
    out: list[DialectEvent] = [
        ResponseInfo(
            response_model=str_or_none(obj.get("model")),
            response_id=str_or_none(obj.get("id")),
            finish_reasons=(reason,) if isinstance(reason, str) else (),
        )
    ]
    usage = usage_from_anthropic(obj.get("usage"))
    if usage is not None:
        out.append(usage)
    return out
