"""OpenAI Responses API (``POST /v1/responses``): typed SSE events, ``text/event-stream``.

Each event is ``event: <type>`` + ``data: {"type":"<type>",...,"sequence_number":N}``; the
JSON ``type`` decides (the SSE event name is only a fallback, as llama.cpp's and some
proxies' streams are ``data:``-only). There is no ``[DONE]``: the stream ends with
``response.completed``, ``response.incomplete`` or ``response.failed``, each carrying the
whole Response object (an upstream that appends ``data: [DONE]`` anyway is tolerated).

What counts as a token (one per delta event whose ``delta`` is a non-empty string):
- ``response.output_text.delta``, ``response.refusal.delta``                -> answer
- ``response.reasoning_text.delta`` (gpt-oss / vLLM / llama.cpp raw reasoning),
  ``response.reasoning_summary_text.delta`` (OpenAI's reasoning summaries)  -> reasoning
- ``response.function_call_arguments.delta``, ``response.custom_tool_call_input.delta``,
  ``response.mcp_call_arguments.delta``, ``response.code_interpreter_call_code.delta`` -> tool
Lifecycle and bookkeeping events (``response.created``/``in_progress``/``queued``,
``output_item.*``, ``content_part.*``, every ``*.done``, annotations) are not tokens.

Tool calls (:class:`ToolCallDelta`, the item's ``output_index`` telling parallel calls
apart): ``response.output_item.added`` of a ``function_call`` or ``custom_tool_call`` item
(the call's id and name), and each non-empty ``response.function_call_arguments.delta`` or
``response.custom_tool_call_input.delta``. MCP and code-interpreter calls run on the server:
tool tokens, but no call the client waits on.

Usage (``response.usage``): ``input_tokens``, ``output_tokens``,
``output_tokens_details.reasoning_tokens``, ``input_tokens_details.cached_tokens``.
Finish reasons are the provider's own words: ``completed`` for ``response.completed``,
``incomplete_details.reason`` (``max_output_tokens``, ``content_filter``) or
``incomplete`` for ``response.incomplete``; a failed response has none, only its error.
Errors: ``response.failed`` (``response.error`` = ``{code, message}``) and the ``error``
event, spelled either flat (``{"type":"error","code":..,"message":..,"param":..}``) or
nested (``{"type":"error","error":{"type":..,"code":..,"message":..}}``).
"""

from __future__ import annotations

from typing import Any

from ._base import (
    ANSWER,
    REASONING,
    TOOL,
    SSEJSONDialect,
    code_or_none,
    load_object,
    str_or_none,
    usage_reader,
)
from .events import DialectEvent, ResponseInfo, StreamEnd, StreamError, Tokens, ToolCallDelta

__all__ = ["ResponsesStreamDialect", "parse_responses_response", "usage_from_responses"]

_DELTA_KINDS: dict[str, Tokens] = {
    "response.output_text.delta": ANSWER,
    "response.refusal.delta": ANSWER,
    "response.reasoning_text.delta": REASONING,
    "response.reasoning_summary_text.delta": REASONING,
    "response.function_call_arguments.delta": TOOL,
    "response.custom_tool_call_input.delta": TOOL,
    "response.mcp_call_arguments.delta": TOOL,
    "response.code_interpreter_call_code.delta": TOOL,
}
# The deltas of calls the client runs (its tools), and the items that open them.
_CLIENT_CALL_DELTAS = frozenset(
    {"response.function_call_arguments.delta", "response.custom_tool_call_input.delta"}
)
_CLIENT_CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})
_STARTED = frozenset({"response.created", "response.in_progress", "response.queued"})
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesStreamDialect(SSEJSONDialect):
    """``/v1/responses`` SSE bytes in, :mod:`events` out. Sans-I/O; safe at any split."""

    __slots__ = ("_model", "_id")

    def __init__(self, max_line_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes)
        self._model: str | None = None
        self._id: str | None = None

    def _object(self, obj: dict[str, Any], event: str, out: list[DialectEvent]) -> None:
        kind = obj.get("type")
        if not isinstance(kind, str):
            kind = event
        tokens = _DELTA_KINDS.get(kind)
        if tokens is not None:
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                out.append(tokens)
                if tokens is TOOL and kind in _CLIENT_CALL_DELTAS:
                    _call(obj.get("output_index"), out)
            return
        if kind == "response.output_item.added":
            item = obj.get("item")
            if type(item) is dict and item.get("type") in _CLIENT_CALL_ITEMS:
                _call(obj.get("output_index"), out)
        elif kind in _STARTED:
            self._info(obj.get("response"), out)
        elif kind in _TERMINAL:
            response = obj.get("response")
            self._info(response, out)
            if type(response) is not dict:
                response = {}
            if kind == "response.failed":
                out.append(_failure(response.get("error")))
            else:
                out.append(ResponseInfo(finish_reasons=(_finish_reason(kind, response),)))
            usage = usage_from_responses(response.get("usage"))
            if usage is not None:
                out.append(usage)
            out.append(StreamEnd())
        elif kind == "error":
            out.append(_error_event(obj))

    def _info(self, response: Any, out: list[DialectEvent]) -> None:
        """Model and id once each, as soon as a Response object names them."""
        if type(response) is not dict:
            return
        model, rid = str_or_none(response.get("model")), str_or_none(response.get("id"))
        new_model = model if model is not None and self._model is None else None
        new_id = rid if rid is not None and self._id is None else None
        if new_model is None and new_id is None:
            return
        if new_model is not None:
            self._model = new_model
        if new_id is not None:
            self._id = new_id
        out.append(ResponseInfo(response_model=new_model, response_id=new_id))


def _call(index: Any, out: list[DialectEvent]) -> None:
    """A piece of the client tool call at ``output_index`` (none without a valid index)."""
    if type(index) is int and index >= 0:
        out.append(ToolCallDelta(index))


def _finish_reason(kind: str, response: dict[str, Any]) -> str:
    if kind == "response.incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if type(details) is dict else None
        return reason if isinstance(reason, str) and reason else "incomplete"
    return "completed"


def _failure(error: Any) -> StreamError:
    if type(error) is dict:
        return StreamError(
            str(error.get("message", "")), str_or_none(error.get("type")), _code(error)
        )
    return StreamError("response failed")


def _error_event(obj: dict[str, Any]) -> StreamError:
    nested = obj.get("error")
    if type(nested) is dict:
        return StreamError(
            str(nested.get("message", "")), str_or_none(nested.get("type")), _code(nested)
        )
    return StreamError(str(obj.get("message", "")), None, _code(obj))


def _code(obj: dict[str, Any]) -> int | str | None:
    return code_or_none(obj.get("code"))


usage_from_responses = usage_reader(
    "input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details"
)


def parse_responses_response(body: bytes) -> list[DialectEvent]:
    """A whole non-streaming Response object (or an error body) -> events.

    Tokens are not emitted one by one (they arrived at once); the usage carries the count.
    """
    obj = load_object(body)
    if isinstance(obj, list):
        return obj
    status = obj.get("status")
    is_response = obj.get("object") == "response" or isinstance(status, str)
    if not is_response:
        err = obj.get("error")
        if type(err) is dict:
            return [
                StreamError(str(err.get("message", "")), str_or_none(err.get("type")), _code(err))
            ]
        if isinstance(err, str):
            return [StreamError(err)]
    out: list[DialectEvent] = []
    finish: tuple[str, ...] = ()
    if status == "completed":
        finish = ("completed",)
    elif status == "incomplete":
        finish = (_finish_reason("response.incomplete", obj),)
    out.append(
        ResponseInfo(
            response_model=str_or_none(obj.get("model")),
            response_id=str_or_none(obj.get("id")),
            finish_reasons=finish,
        )
    )
    if status == "failed" or type(obj.get("error")) is dict:
        out.append(_failure(obj.get("error")))
    usage = usage_from_responses(obj.get("usage"))
    if usage is not None:
        out.append(usage)
    return out
