"""llama.cpp server's native ``POST /completion`` (also ``/completions``, ``/infill``).

SSE, ``text/event-stream``, ``data: {json}\\n\\n`` (nlohmann ``ordered_json``, compact).
Each partial result is one sampled token::

    data: {"index":0,"content":" Paris","tokens":[12366],"stop":false,"id_slot":0,"tokens_predicted":1,"tokens_evaluated":12}

The final result has ``"stop": true`` and the request's accounting: ``model``,
``tokens_predicted`` (output), ``tokens_evaluated`` (the whole prompt, cached part
included), ``stop_type`` (``eos``, ``limit``, ``word``; the finish reason; older builds
had ``stopped_eos`` / ``stopped_word`` / ``stopped_limit`` booleans instead), and
``timings`` in MILLIseconds::

    {"cache_n":..,"prompt_n":..,"prompt_ms":..,"prompt_per_token_ms":..,"prompt_per_second":..,
     "predicted_n":..,"predicted_ms":..,"predicted_per_token_ms":..,"predicted_per_second":..}

-> :class:`Usage` (``cached_input_tokens`` = ``timings.cache_n``, the prompt tokens served
from the KV cache; older builds lack it) and :class:`EngineTimings` (``prefill`` =
``prompt_ms / 1000``, ``decode`` = ``predicted_ms / 1000``; llama.cpp has no load phase per
request). There is no ``[DONE]``; ``stop: true`` is the end marker.

What counts as a token: a partial (``stop`` false) with non-empty ``content``. Partials with
empty content (a ``return_progress`` prompt-progress update, a token held back while it
might begin a stop word, half of a UTF-8 character) are not tokens. The final result never
counts: current builds send ``"content":""`` there when streaming, and older builds repeat
the WHOLE generated text in it, so counting it would add a phantom token.

Errors inside a 200 stream are ``data: {"error":{"code":500,"message":"...","type":"server_error"}}``.
Builds from before 2025 wrote them as a non-standard ``error: {...}`` SSE field, which an
SSE decoder ignores by the spec, so those errors are invisible here (the request still ends
without a ``stop: true`` and so without usage).
"""

from __future__ import annotations

from typing import Any

from ._base import (
    ANSWER,
    NO_ENGINE_COUNTS,
    SSEJSONDialect,
    add_engine_usage,
    code_or_none,
    int_or_none,
    load_object,
    seconds_or_none,
    str_or_none,
)
from .events import DialectEvent, EngineTimings, ResponseInfo, StreamEnd, StreamError, Usage

__all__ = [
    "LlamaCppStreamDialect",
    "parse_llamacpp_response",
    "engine_timings_from_llamacpp",
    "engine_counts_from_llamacpp",
]

_MS = 1000.0
_OLD_STOP_FLAGS = ("eos", "word", "limit")


class LlamaCppStreamDialect(SSEJSONDialect):
    """``/completion`` SSE bytes in, :mod:`events` out. Sans-I/O; safe at any split."""

    __slots__ = ()

    def _object(self, obj: dict[str, Any], event: str, out: list[DialectEvent]) -> None:
        err = _error_of(obj)
        if err is not None:
            out.append(err)
            return
        if obj.get("stop") is True:
            _final(obj, out)
            out.append(StreamEnd())
            return
        content = obj.get("content")
        if isinstance(content, str) and content:
            out.append(ANSWER)


def _final(obj: dict[str, Any], out: list[DialectEvent]) -> None:
    model = str_or_none(obj.get("model"))
    reason = obj.get("stop_type")
    if not isinstance(reason, str):  # builds before stop_type had one boolean per cause
        reason = next((r for r in _OLD_STOP_FLAGS if obj.get("stopped_" + r) is True), None)
    finish = (reason,) if isinstance(reason, str) and reason and reason != "none" else ()
    if model is not None or finish:
        out.append(ResponseInfo(response_model=model, finish_reasons=finish))
    timings = obj.get("timings")
    add_engine_usage(
        out,
        int_or_none(obj.get("tokens_evaluated")),
        int_or_none(obj.get("tokens_predicted")),
        int_or_none(timings.get("cache_n")) if type(timings) is dict else None,
    )
    engine = engine_timings_from_llamacpp(timings)
    if engine is not None:
        out.append(engine)


def engine_timings_from_llamacpp(timings: Any) -> EngineTimings | None:
    """A llama.cpp ``timings`` object (milliseconds) -> :class:`EngineTimings` in seconds.

    Also what llama.cpp puts on the last chunk of its OpenAI-compatible streams (and on
    every chunk with ``timings_per_token``; the values are cumulative, so the last wins).
    """
    if type(timings) is not dict:
        return None
    engine = EngineTimings(
        prefill_seconds=seconds_or_none(timings.get("prompt_ms"), _MS),
        decode_seconds=seconds_or_none(timings.get("predicted_ms"), _MS),
    )
    return None if engine == EngineTimings() else engine


def engine_counts_from_llamacpp(timings: Any) -> Usage | None:
    """A llama.cpp ``timings`` object -> the engine's token counts, as on the finish chunk
    of its OpenAI-compatible streams (or on the usage chunk when the client asked for one).

    ``predicted_n`` is the output; ``prompt_n`` is the prompt tokens evaluated this time and
    ``cache_n`` those reused from the slot's KV cache, so the whole prompt is their sum (what
    llama.cpp's own ``usage.prompt_tokens`` reports) and ``cache_n`` is the cached input.
    Builds without ``cache_n`` evaluated the whole prompt: ``prompt_n`` alone.
    """
    if type(timings) is not dict:
        return None
    prompt, cached = int_or_none(timings.get("prompt_n")), int_or_none(timings.get("cache_n"))
    usage = Usage(
        input_tokens=None if prompt is None else prompt + (cached or 0),
        output_tokens=int_or_none(timings.get("predicted_n")),
        cached_input_tokens=cached,
        engine=True,
    )
    return None if usage == NO_ENGINE_COUNTS else usage


def _error_of(obj: dict[str, Any]) -> StreamError | None:
    err = obj.get("error")
    if type(err) is dict:
        return StreamError(
            str(err.get("message", "")), str_or_none(err.get("type")), code_or_none(err.get("code"))
        )
    if isinstance(err, str):
        return StreamError(err)
    return None


def parse_llamacpp_response(body: bytes) -> list[DialectEvent]:
    """A whole non-streaming ``/completion`` body -> events (model, stop type, usage,
    engine timings, or the error)."""
    obj = load_object(body, _error_of)
    if isinstance(obj, list):
        return obj
    out: list[DialectEvent] = []
    _final(obj, out)
    return out
