"""The vocabulary every dialect speaks: what a stream said, stripped of its wire format.

A dialect turns framed events (SSE or NDJSON) into these; the timeline turns them into
figures. Keeping the set small is what lets one timeline serve every API.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "TokenKind",
    "Tokens",
    "Usage",
    "ResponseInfo",
    "StreamError",
    "StreamEnd",
    "GenerationDone",
    "MaybeLastToken",
    "ParseError",
    "EngineTimings",
    "ToolCallDelta",
    "DialectEvent",
    "MAX_INDICES_PER_RESPONSE",
]

MAX_INDICES_PER_RESPONSE = 128
"""The most indices an upstream chooses that one response's state keeps, of each kind:
choices (``n``; OpenAI's API takes at most 128), tool calls (their timings in the record)
and content blocks. Past it an index is not tracked, so a hostile stream numbering its
events 0, 1, 2, ... cannot grow the state of its response without bound (tokens are still
counted). Parallel tool calls and choices are a handful in practice."""


class TokenKind(str, Enum):
    ANSWER = "answer"  # visible content / text
    REASONING = "reasoning"  # reasoning_content, thinking
    TOOL = "tool"  # tool / function-call arguments


@dataclass(slots=True)  # not frozen: built for nearly every stream event, and cheaper so
class Tokens:
    """``count`` generated tokens of one kind arrived (one per content-bearing delta
    unless the stream says more precisely)."""

    kind: TokenKind
    count: int = 1


@dataclass(slots=True, frozen=True)
class Usage:
    """Exact token counts the response carried. ``None`` means not reported.

    ``engine`` says where they came from: False for the API's own ``usage`` object
    (OpenAI, Anthropic, Responses), True for the engine's own accounting in its stream
    (llama.cpp ``timings``/``tokens_predicted``, TGI ``details``, Ollama ``eval_count``).
    Both are exact; the timeline prefers ``usage`` when a stream carries both.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_input_tokens: int | None = None
    engine: bool = False


@dataclass(slots=True, frozen=True)
class ResponseInfo:
    """Descriptive facts about the response (for spans and logs, never content)."""

    response_model: str | None = None
    response_id: str | None = None
    finish_reasons: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class StreamError:
    """The server reported an error inside a 200 stream."""

    message: str
    type: str | None = None
    code: int | str | None = None


@dataclass(slots=True, frozen=True)
class StreamEnd:
    """The stream's own end marker (``[DONE]``, ``message_stop``, ``response.completed``,
    ``done: true``, ``stop: true``, TGI's ``generated_text``). A stream that ends cleanly
    without it is how a server that died between two chunks looks."""


@dataclass(slots=True, frozen=True)
class GenerationDone:
    """The stream's content says generation finished, end marker or not: every OpenAI
    choice seen has a ``finish_reason``, Anthropic's ``message_delta`` has a
    ``stop_reason``. Servers that end a complete stream without the marker
    (``transformers serve`` never sends ``data: [DONE]``), and clients that leave as soon as
    every choice finished, are complete, not truncated or cancelled (docs/metrics.md,
    "End of stream"). Dialects whose only sign of the end *is* the marker send
    :class:`StreamEnd` alone."""


@dataclass(slots=True, frozen=True)
class MaybeLastToken:
    """A choice finished on a delta whose ``content`` (or ``text``) is empty, after tokens
    came. vLLM sends this for its last token when it has no text of its own (the end of
    sequence token, or the tail of a character split over tokens) and counts it in the
    usage; llama.cpp and ``transformers serve`` send the same shape as a bare terminator
    and do not. So it is a token exactly when the usage that follows counts one more than
    arrived: the timeline decides then (:class:`~sidecar.measure.timeline.RequestTimeline`)."""


@dataclass(slots=True, frozen=True)
class ParseError:
    """An event the dialect could not understand; the bytes were relayed regardless."""

    reason: str


@dataclass(slots=True, frozen=True)
class EngineTimings:
    """The engine's own account of where the time went, in seconds, when its response says
    (Ollama ``load_duration``/``prompt_eval_duration``/``eval_duration``, llama.cpp
    ``timings``, vLLM's per-request ``metrics``, TGI's ``x-queue-time`` header, SGLang's
    ``meta_info.queue_time``). Lets users split TTFT into engine queue, engine prefill and
    the rest (network, tokenisation, HTTP, the sidecar).

    ``queue_seconds``: waiting in the engine's scheduler queue before the request ran.
    A field left ``None`` was not reported; several events for one request merge field by
    field, the later one winning (:meth:`merged`)."""

    load_seconds: float | None = None
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    queue_seconds: float | None = None

    def merged(self, later: EngineTimings) -> EngineTimings:
        """This account updated by a later one: each field the later one reports wins (the
        figures are cumulative where repeated); the others are kept (a header's queue time
        and a body's prefill time are two halves of one account)."""
        return EngineTimings(
            load_seconds=self.load_seconds if later.load_seconds is None else later.load_seconds,
            prefill_seconds=self.prefill_seconds
            if later.prefill_seconds is None
            else later.prefill_seconds,
            decode_seconds=self.decode_seconds
            if later.decode_seconds is None
            else later.decode_seconds,
            queue_seconds=self.queue_seconds
            if later.queue_seconds is None
            else later.queue_seconds,
        )


@dataclass(slots=True, frozen=True)
class ToolCallDelta:
    """A piece of one tool call arrived: its opening (id and name) or a piece of its
    arguments. Rare beside text tokens, and the only source of the tool-call timings (time
    to the first tool call, each call's assembly from its first piece to its last): the
    timeline keeps one first and last time per call, so parallel calls are told apart by
    ``call`` (OpenAI ``tool_calls[].index``, the Anthropic ``tool_use`` block's ``index``,
    the Responses item's ``output_index``, Ollama's running count) within ``choice`` (an
    OpenAI choice's ``index`` when ``n`` > 1). Client tools only: calls the server runs
    itself (Anthropic ``server_tool_use``, Responses MCP and code interpreter) are not the
    agent's action to wait for."""

    call: int
    choice: int = 0


DialectEvent = (
    Tokens
    | Usage
    | ResponseInfo
    | StreamError
    | StreamEnd
    | GenerationDone
    | MaybeLastToken
    | ParseError
    | EngineTimings
    | ToolCallDelta
)
