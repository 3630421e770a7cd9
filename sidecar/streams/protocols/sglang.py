"""SGLang's native ``/generate`` API: what its ``meta_info`` says about tokens and time.

Read from SGLang's source (sgl-project/sglang, ``python/sglang/srt/managers/
tokenizer_manager.py``, ``_handle_batch_output``, and ``entrypoints/http_server.py``,
``generate_request``); no SGLang server runs here, so none of this is recorded from one.

With ``"stream": true`` the answer is SSE, one ``data: {json}`` per decode step, ending
with ``data: [DONE]``::

    data: {"text": " Paris", "output_ids": [...], "meta_info": {"id": "...",
           "finish_reason": null, "prompt_tokens": 7, "completion_tokens": 2,
           "cached_tokens": 0, ...}}

``text`` is the whole text so far (or the new piece with ``--stream-output``); what the
sidecar counts never depends on which: ``meta_info.completion_tokens`` is cumulative, so a
step that grew it by k carries k tokens (one when the field is missing). The last step's
``finish_reason`` is an object (``{"type": "length", "length": 8}``, ``{"type": "stop",
"matched": ...}``) and its ``meta_info`` adds ``e2e_latency`` (seconds, the server's own
receive-to-finish). With ``--enable-metrics`` ``meta_info`` also has ``queue_time``
(seconds waiting for the scheduler), read as :attr:`EngineTimings.queue_seconds`;
``prefill_launch_delay`` / ``prefill_launch_latency`` are not read (their meaning has
changed between versions). Counts (``prompt_tokens``, ``completion_tokens``,
``cached_tokens``) are the engine's own (:class:`Usage` with ``engine=True``).

Without ``stream`` the body is one such object (a list of them for a batch of prompts).
An error is ``{"error": {"message": ...}}`` (inside a 200 stream, or as the body).
"""

from __future__ import annotations

from typing import Any

from ._base import (
    ANSWER,
    NO_ENGINE_COUNTS,
    add_engine_usage,
    int_or_none,
    seconds_or_none,
    str_or_none,
)
from .events import DialectEvent, EngineTimings, ResponseInfo, TokenKind, Tokens, Usage

__all__ = ["SGLangState", "sglang_object", "sglang_response", "is_sglang"]


def is_sglang(obj: dict[str, Any]) -> bool:
    """SGLang's objects carry ``meta_info``; TGI's, which share ``/generate``, never do."""
    return type(obj.get("meta_info")) is dict


class SGLangState:
    """What one stream remembers between steps: the completion count so far."""

    __slots__ = ("completion_so_far", "seen_info")

    def __init__(self) -> None:
        self.completion_so_far = 0
        self.seen_info = False


def sglang_object(obj: dict[str, Any], state: SGLangState, out: list[DialectEvent]) -> None:
    """One streamed step (``obj`` holds ``meta_info``) -> events."""
    meta = obj["meta_info"]
    if not state.seen_info:
        state.seen_info = True
        rid = str_or_none(meta.get("id"))
        if rid is not None:
            out.append(ResponseInfo(response_id=rid))
    completion = int_or_none(meta.get("completion_tokens"))
    if completion is not None:
        grown = completion - state.completion_so_far
        state.completion_so_far = completion
        if grown > 0:
            out.append(Tokens(TokenKind.ANSWER, grown))
    elif obj.get("text"):
        out.append(ANSWER)
    _final(meta, out)


def _final(meta: dict[str, Any], out: list[DialectEvent]) -> None:
    """Counts (every step carries them; the last wins), finish reason and queue time.
    The counts are built here, not by add_engine_usage: this runs for every token."""
    usage = Usage(
        input_tokens=int_or_none(meta.get("prompt_tokens")),
        output_tokens=int_or_none(meta.get("completion_tokens")),
        cached_input_tokens=int_or_none(meta.get("cached_tokens")),
        engine=True,
    )
    if usage != NO_ENGINE_COUNTS:
        out.append(usage)
    reason = meta.get("finish_reason")
    if type(reason) is dict:
        kind = str_or_none(reason.get("type"))
        if kind is not None:
            out.append(ResponseInfo(finish_reasons=(kind,)))
    queue = seconds_or_none(meta.get("queue_time"), 1.0)
    if queue is not None:
        out.append(EngineTimings(queue_seconds=queue))


def sglang_response(objs: list[dict[str, Any]]) -> list[DialectEvent]:
    """A whole non-streamed ``/generate`` body (one object, or a batch) -> events. A batch's
    counts add up; its queue time is the longest any prompt waited."""
    out: list[DialectEvent] = []
    prompt = completion = cached = 0
    known = [False, False, False]
    queue: float | None = None
    reasons: list[str] = []
    for obj in objs:
        meta = obj["meta_info"]
        for i, (name, value) in enumerate(
            (
                ("prompt", meta.get("prompt_tokens")),
                ("completion", meta.get("completion_tokens")),
                ("cached", meta.get("cached_tokens")),
            )
        ):
            n = int_or_none(value)
            if n is None:
                continue
            known[i] = True
            if name == "prompt":
                prompt += n
            elif name == "completion":
                completion += n
            else:
                cached += n
        reason = meta.get("finish_reason")
        if type(reason) is dict and isinstance(reason.get("type"), str):
            reasons.append(reason["type"])
        q = seconds_or_none(meta.get("queue_time"), 1.0)
        if q is not None:
            queue = q if queue is None else max(queue, q)
    rid = str_or_none(objs[0]["meta_info"].get("id")) if len(objs) == 1 else None
    out.append(ResponseInfo(response_id=rid, finish_reasons=tuple(reasons)))
    add_engine_usage(
        out,
        prompt if known[0] else None,
        completion if known[1] else None,
        cached if known[2] else None,
    )
    if queue is not None:
        out.append(EngineTimings(queue_seconds=queue))
    return out
