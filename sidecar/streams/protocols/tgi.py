"""Hugging Face Text Generation Inference native API: ``/generate_stream`` and ``/generate``.

``/generate_stream`` is SSE (``text/event-stream``, written by axum, so ``data:`` has no
space after the colon and keep-alives are ``:`` comment lines), one event per generated
token::

    data:{"index":1,"token":{"id":1246,"text":" Deep","logprob":-0.27,"special":false},"generated_text":null,"details":null}

The last event also carries ``generated_text`` (the whole text) and, when the request set
``parameters.details``, ``details``: ``finish_reason`` (``length``, ``eos_token``,
``stop_sequence``), ``generated_tokens``, ``seed`` and, on TGI 2.x, ``input_length``
(``/generate``'s details also list the ``prefill`` tokens when ``decoder_input_details``
is set). These are the engine's own counts (:class:`Usage` with ``engine=True``).
There is no ``[DONE]``; a non-null ``generated_text`` is the end marker.

What counts as a token: every event whose ``token`` is an object with ``special`` not
true, one each, even when its ``text`` is empty (a byte-fallback piece of a multi-byte
character is still one generated token, produced at that moment). A ``special: true``
token (the ``</s>`` / ``<|eot_id|>`` that ends most generations) is part of the stream but
not output text, so it is not counted; ``details.generated_tokens`` still includes it, and
being the server's own count, it wins as usage.

Errors inside a 200 stream are ``data:{"error":"...","error_type":"generation"}``; the
same object is the body of a failed ``/generate``.

Times: TGI's final event carries none; a non-streamed ``/generate`` answers with timing
headers (huggingface/text-generation-inference ``router/src/server.rs``, ``generate``,
commit d957e32601a99f9ec458ff081dc3b4c6659da8a4): ``x-queue-time`` (ms, queued -> batch
start), ``x-inference-time`` (ms, batch start -> end: prefill and decode together, so not
split here), ``x-validation-time``, ``x-total-time``, ``x-time-per-token`` (ms, integers),
``x-prompt-tokens`` and ``x-generated-tokens``. ``/generate_stream`` sends only
``x-compute-type`` and ``x-compute-characters``, as its times are not known at the head.
:func:`tgi_head_events` reads the queue time and the counts.

``/generate`` is also SGLang's native API (:mod:`.sglang`): its objects carry
``meta_info``, which TGI's never do, so each object says which engine sent it, and a TGI
stream or body is read exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ._base import (
    ANSWER,
    SSEJSONDialect,
    add_engine_usage,
    int_or_none,
    seconds_or_none,
    str_or_none,
)
from .events import DialectEvent, EngineTimings, ParseError, ResponseInfo, StreamEnd, StreamError
from .sglang import SGLangState, is_sglang, sglang_object, sglang_response

__all__ = ["TGIStreamDialect", "parse_tgi_response", "tgi_head_events"]


class TGIStreamDialect(SSEJSONDialect):
    """``/generate_stream`` SSE bytes in, :mod:`events` out. Sans-I/O; safe at any split."""

    __slots__ = ("_sglang",)

    def __init__(self, max_line_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes)
        self._sglang: SGLangState | None = None

    def _object(self, obj: dict[str, Any], event: str, out: list[DialectEvent]) -> None:
        err = _error_of(obj)
        if err is not None:
            out.append(err)
            return
        if is_sglang(obj):  # SGLang's /generate stream (module doc)
            if self._sglang is None:
                self._sglang = SGLangState()
            sglang_object(obj, self._sglang, out)
            return
        token = obj.get("token")
        if type(token) is dict and token.get("special") is not True:
            out.append(ANSWER)
        _details(obj.get("details"), out)
        if isinstance(obj.get("generated_text"), str):
            out.append(StreamEnd())


def _details(details: Any, out: list[DialectEvent]) -> None:
    if type(details) is not dict:
        return
    reason = details.get("finish_reason")
    if isinstance(reason, str):
        out.append(ResponseInfo(finish_reasons=(reason,)))
    add_engine_usage(out, _input_tokens(details), int_or_none(details.get("generated_tokens")))


def _input_tokens(details: dict[str, Any]) -> int | None:
    """``input_length`` (TGI 2.x), else the ``prefill`` tokens that ``/generate`` lists when
    the request set ``decoder_input_details`` (an empty list means not listed, not zero)."""
    length = int_or_none(details.get("input_length"))
    if length is not None:
        return length
    prefill = details.get("prefill")
    return len(prefill) if type(prefill) is list and prefill else None


def _error_of(obj: dict[str, Any]) -> StreamError | None:
    err = obj.get("error")
    if isinstance(err, str):
        return StreamError(err, str_or_none(obj.get("error_type")))
    if type(err) is dict:  # not TGI's own shape, but proxies in front of it use it
        return StreamError(str(err.get("message", "")), str_or_none(err.get("type")))
    return None


def parse_tgi_response(body: bytes) -> list[DialectEvent]:
    """A whole ``/generate`` body -> events (finish reason and usage when ``details`` was
    requested, or the error). TGI's compat route ``/`` answers with a one-element list of
    the same object; that is accepted too."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return [ParseError("response is not JSON")]
    if type(obj) is list and obj and all(type(o) is dict and is_sglang(o) for o in obj):
        return sglang_response(obj)  # SGLang's batch of prompts
    if type(obj) is list and len(obj) == 1:
        obj = obj[0]
    if type(obj) is dict and is_sglang(obj):
        return sglang_response([obj])
    if type(obj) is not dict:
        return [ParseError("response is not a JSON object")]
    err = _error_of(obj)
    if err is not None:
        return [err]
    out: list[DialectEvent] = []
    _details(obj.get("details"), out)
    return out


def tgi_head_events(headers: Mapping[str, str]) -> list[DialectEvent]:
    """TGI's timing and count headers on a non-streamed ``/generate`` (module doc) ->
    events: the queue time and the engine's counts. Anything else, or a malformed value,
    gives nothing."""
    out: list[DialectEvent] = []
    queue = _header_int(headers.get("x-queue-time"))
    if queue is not None:
        out.append(EngineTimings(queue_seconds=seconds_or_none(queue, 1000.0)))
    add_engine_usage(
        out,
        _header_int(headers.get("x-prompt-tokens")),
        _header_int(headers.get("x-generated-tokens")),
    )
    return out


def _header_int(value: str | None) -> int | None:
    """A header holding a non-negative decimal integer (how TGI writes them), else None."""
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    return int(value)
