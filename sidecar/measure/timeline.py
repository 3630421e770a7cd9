"""One request's clock: token events in, latency figures out, finalised exactly once.

The timeline is the single record that flows from the proxy to every exporter. It holds
timestamps, not durations, so every figure is derived one way in one place:

- TTFB   first response byte (status line and headers) - request headers received
- TTFT   first generated token of any kind (answer, reasoning, tool call) - start
- TTFAT  first answer token - start; reported only when it differs from TTFT
- ITL    every gap between consecutive token-bearing arrivals; tokens that arrive in the
         same read share a timestamp, so their gap is 0 as the client saw it; an event
         that carries k tokens (per-chunk usage says so) gives k observations of gap / k
- TPOT   (last token - first token) / (output tokens - 1)
- TPS    (output tokens - 1) / (last token - first token): decode speed, 1 / TPOT
- E2E    end - start, where end is when the last byte was relayed (or the request failed)
- TTFTC  the first piece of a tool call (ToolCallDelta: its id and name) - start
- tool-call assembly, per call: its last piece - its first piece (parallel calls apart)

The sidecar's own cost, one figure per direction (``llm_sidecar_overhead_seconds``):

- request   the request body was in (or its head, without a body) -> the request was
            written to the upstream socket; includes connecting to the upstream when the
            pool had no idle connection. Receiving the body is the client's time, not ours,
            and a body too large to inspect is streamed, so it has no figure.
- response  the upstream's response head was read -> the head was written to the client.
            That is the first byte each way; later pieces go out in the same call that
            read them (one clock read per piece, already taken), so the first byte is where
            the sidecar can add time, and a second clock read per token would cost more
            than it tells.

Token counts, one precedence for every dialect (:attr:`RequestTimeline.token_count_source`):

1. ``usage``      the API's own usage object, when the response carried one;
2. ``engine``     the engine's own counts in its stream (llama.cpp ``timings``, TGI
                  ``details``, Ollama ``eval_count``), when no usage did;
3. ``estimated``  output only: the token-bearing deltas seen in the stream (one per
                  content-bearing event, k when per-chunk usage says k); input unknown;
4. ``none``       nothing to count from (a JSON body without usage, a non-API response).

Each count is taken field by field from the first source that has it, so a usage object
without ``cached_tokens`` still gets llama.cpp's ``cache_n``; input is never estimated.

Outcome, at the end of a stream (docs/metrics.md, "End of stream"): a stream is
*complete* when its dialect's end marker came (``[DONE]``, ``message_stop``,
``response.completed``, ``done: true`` ...: :class:`StreamEnd`) or when its content says
generation finished (every OpenAI choice has a ``finish_reason``, Anthropic's
``stop_reason``: :class:`GenerationDone`). A streamed 2xx response that ended cleanly at
the HTTP level but was not complete is what a server that died between two chunks looks
like, so :meth:`finish` turns its ``ok`` into ``error`` / ``upstream_stream_truncated``
(only where the protocol has a marker: ``end_marker_expected``). A client that disconnects
once the stream was complete (a load generator stops reading at ``[DONE]`` and closes before
the response's last chunk) got its whole answer: :meth:`finish` turns that ``cancelled`` into
``ok``. The events were observed after their bytes were written to the client, so what the
timeline saw, the client was sent.
The clock is injected so tests can script exact timings.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from enum import Enum
from typing import Any

from ..base.outcomes import Outcome, Verdict, verdict_of
from ..streams.protocols.events import (
    MAX_INDICES_PER_RESPONSE,
    DialectEvent,
    EngineTimings,
    GenerationDone,
    MaybeLastToken,
    ParseError,
    ResponseInfo,
    StreamEnd,
    StreamError,
    TokenKind,
    Tokens,
    ToolCallDelta,
    Usage,
)
from .concurrency import NO_TRACKER, DecodeConcurrency

__all__ = ["RequestTimeline", "TokenCountSource", "MAX_TOOL_CALLS", "MAX_FINISH_REASONS"]

MAX_TOOL_CALLS = MAX_INDICES_PER_RESPONSE
"""Tool calls timed per response; more are not kept (parallel calls are a handful). The
bound of every index an upstream chooses (sidecar/streams/protocols/events.py)."""

MAX_FINISH_REASONS = 64
"""Finish reasons kept per response (one per choice; a request asks a few at most): an
upstream that repeats them without end cannot grow the record. The span keeps as many, the
metric counts 16 (``sidecar/base/finish_reason.py``)."""

_ANSWER = TokenKind.ANSWER
_REASONING = TokenKind.REASONING


class TokenCountSource(str, Enum):
    """Where a request's output token count came from (see the module docstring)."""

    USAGE = "usage"
    ENGINE = "engine"
    ESTIMATED = "estimated"
    NONE = "none"


class RequestTimeline:
    """Mutable while the request is in flight; read-only once :meth:`finish` returns True."""

    __slots__ = (
        "method",
        "route",
        "model",
        "streamed",
        "status",
        "start",
        "first_byte",
        "first_token",
        "first_token_kind",
        "first_answer_token",
        "last_token",
        "end",
        "gaps",
        "gap_streams",
        "decode",
        "stream_tokens",
        "reasoning_stream_tokens",
        "usage",
        "engine_usage",
        "response_model",
        "response_id",
        "finish_reasons",
        "stream_error",
        "saw_end_marker",
        "generation_done",
        "_maybe_last",
        "end_marker_expected",
        "parse_errors",
        "verdict",
        "outcome",
        "error_type",
        "request_max_tokens",
        "trace",
        "trace_id",
        "engine",
        "request_stream",
        "body_received",
        "upstream_sent",
        "client_head_sent",
        "_grouped",
        "tenant",
        "first_tool_call",
        "tool_calls",
        "objectives",
    )

    def __init__(
        self, start: float, method: str = "GET", route: str = "other", model: str = ""
    ) -> None:
        self.method = method
        self.route = route
        self.model = model  # raw request model; exporters bound it before using it as a label
        self.streamed = False
        self.status: int | None = None
        self.start = start
        self.first_byte: float | None = None
        self.first_token: float | None = None
        self.first_token_kind: TokenKind | None = None
        self.first_answer_token: float | None = None
        self.last_token: float | None = None
        self.end: float | None = None
        self.gaps = array("d")
        # Beside each ``gaps`` entry: how many streams of this model were decoding when the
        # gap ended (sidecar/measure/concurrency.py); one integer read per token.
        self.gap_streams = array("I")
        self.decode: DecodeConcurrency = NO_TRACKER
        # The ``gaps`` entries that stand for several tokens' gaps: (index of the entry, how
        # many gaps it stands for, whether together they are one chunk's gap). An event of
        # k tokens is one entry however large k is, so a hostile count costs O(1); the
        # one-token path, nearly every event, never touches it (:meth:`gap_runs`).
        self._grouped: list[tuple[int, int, bool]] | None = None
        self.stream_tokens = 0
        self.reasoning_stream_tokens = 0
        self.usage: Usage | None = None  # the API's usage object
        self.engine_usage: Usage | None = None  # the engine's own counts
        self.response_model: str | None = None
        self.response_id: str | None = None
        self.finish_reasons: list[str] = []
        self.stream_error: StreamError | None = None
        self.saw_end_marker = False
        self.generation_done = False  # the content said generation finished (GenerationDone)
        self._maybe_last: tuple[float, int] | None = (
            None  # a MaybeLastToken: (when, streams decoding)
        )
        self.end_marker_expected = False  # the stream's dialect has an end marker to see
        self.parse_errors = 0
        # The verdict, once finished; outcome and error_type are its words (None when ok).
        self.verdict: Verdict | None = None
        self.outcome: Outcome | None = None
        self.error_type: str | None = None  # short machine-readable cause, never content
        self.request_max_tokens: int | None = None
        self.trace: object | None = None  # the tracer's handle for this request's span
        self.trace_id: str | None = None  # hex trace id, for exemplars and logs
        self.request_stream: bool | None = None  # the request body's "stream" flag, if JSON
        self.engine: EngineTimings | None = None  # the engine's own load/prefill/decode times
        self.body_received: float | None = None  # request body in, ready to send upstream
        self.upstream_sent: float | None = None  # request written to the upstream socket
        self.client_head_sent: float | None = None  # response head written to the client
        self.tenant: str | None = None  # bounded tenant label, only when --tenant-header is set
        # Tool calls (ToolCallDelta): when the first piece of any came, and per call (choice,
        # index) the [first, last] piece's times; None until a response makes one.
        self.first_tool_call: float | None = None
        self.tool_calls: dict[tuple[int, int], list[float]] | None = None
        # The client's own objectives (x-llm-d-slo-*-ms or x-slo-*-ms), read from its request
        # headers (sidecar/measure/objectives.py); None when it sent neither.
        self.objectives: object | None = None

    # -- feeding ---------------------------------------------------------------------

    def response_started(self, now: float, status: int, streamed: bool) -> None:
        if self.first_byte is None:
            self.first_byte = now
            self.status = status
            self.streamed = streamed

    def events(self, events: list[DialectEvent], now: float) -> None:
        """Apply a batch of dialect events that arrived together at ``now``."""
        # Dispatched on type(ev), taken once per event: mypy does not narrow through ``t``.
        ev: Any
        for ev in events:
            t = type(ev)
            if t is Tokens:
                if (
                    self.first_token is not None and ev.count == 1
                ):  # steady decode: nearly every event
                    self.add_tokens(1, (now - self.last_token,), (self.decode.n,), now, ev.kind)  # type: ignore[operator]  # a token before: last_token set
                else:
                    self._tokens(ev, now)
            elif t is Usage:
                if ev.engine:
                    self.engine_usage = ev
                else:
                    self.usage = ev
                    if self._maybe_last is not None:
                        self._settle_last(ev)
            elif t is MaybeLastToken:
                if self.first_token is not None:
                    self._maybe_last = (now, self.decode.n)
            elif t is ResponseInfo:
                if ev.response_model is not None:
                    self.response_model = ev.response_model
                if ev.response_id is not None:
                    self.response_id = ev.response_id
                if ev.finish_reasons:
                    room = MAX_FINISH_REASONS - len(self.finish_reasons)
                    if room > 0:
                        self.finish_reasons.extend(ev.finish_reasons[:room])
            elif t is StreamEnd:
                self.saw_end_marker = True
            elif t is GenerationDone:
                self.generation_done = True
            elif t is StreamError:
                if self.stream_error is None:
                    self.stream_error = ev
            elif t is ParseError:
                self.parse_errors += 1
            elif t is EngineTimings:
                # Field by field, the later one winning (EngineTimings.merged says why).
                self.engine = ev if self.engine is None else self.engine.merged(ev)
            elif t is ToolCallDelta:
                self._tool_call(ev, now)

    def _tool_call(self, ev: ToolCallDelta, now: float) -> None:
        """A piece of one tool call: the first piece of any is the first tool call; each
        call keeps its first and last piece's time (its assembly). At most
        :data:`MAX_TOOL_CALLS` calls are kept, so a stream cannot grow the record."""
        calls = self.tool_calls
        if calls is None:
            calls = self.tool_calls = {}
            self.first_tool_call = now
        key = (ev.choice, ev.call)
        times = calls.get(key)
        if times is not None:
            times[1] = now
        elif len(calls) < MAX_TOOL_CALLS:
            calls[key] = [now, now]

    def add_tokens(
        self,
        count: int,
        gaps: Iterable[float],
        streams: Iterable[int],
        at: float,
        kind: TokenKind | None,
    ) -> None:
        """The per-token rule, the one place tokens are added: ``count`` tokens of ``kind``
        (None: a kind that was not said) that arrived by ``at``, with the gaps before them
        (seconds; one per token after the first of the response) and, beside each gap, how
        many streams of this model were decoding when it ended (``gaps`` and ``streams`` are
        sequences of equal length, or arrays of this record's type codes). Called by the
        Python path for each event and by the token lane for each batch it noted
        (sidecar/relay/data/token_lane.py), so both add the same figures."""
        if gaps:  # (none before a response's first token)
            self.gaps.extend(gaps)
            self.gap_streams.extend(streams)
        self.last_token = at
        self.stream_tokens += count
        if kind is _ANSWER:
            if self.first_answer_token is None:
                self.first_answer_token = at
        elif kind is _REASONING:
            self.reasoning_stream_tokens += count

    def _tokens(self, ev: Tokens, now: float) -> None:
        """An event that is not one steady token: the response's first, or several at once.

        k tokens that arrived together are one ``gaps`` entry standing for k gaps (or k - 1
        in the first event), whatever k is: an upstream claiming millions of tokens in one
        event costs the same as one that claims two."""
        k = ev.count
        if self.first_token is None:
            self.first_token = now
            self.first_token_kind = ev.kind
            self.decode.enter(now)
            if k > 1:  # k tokens in the first event arrived together: k - 1 gaps of 0
                self._group(len(self.gaps), k - 1, False)
                self.add_tokens(k, (0.0,), (self.decode.n,), now, ev.kind)
            else:
                self.add_tokens(k, (), (), now, ev.kind)
        elif k == 1:
            self.add_tokens(1, (now - self.last_token,), (self.decode.n,), now, ev.kind)  # type: ignore[operator]  # a token before: last_token set
        elif k > 1:
            # k tokens in one event: the gap since the previous event is split evenly
            # into k observations, so ITL's count matches the token count and its sum
            # still equals the time spent decoding.
            self._group(len(self.gaps), k, True)
            gap = (now - self.last_token) / k  # type: ignore[operator]  # a token before: last_token set
            self.add_tokens(k, (gap,), (self.decode.n,), now, ev.kind)

    def _settle_last(self, usage: Usage) -> None:
        """A :class:`MaybeLastToken` was a token when the usage counts exactly one more than
        arrived (vLLM counts its end-of-sequence token; a bare terminator adds nothing). It
        arrived then, so its gap is observed and TPOT's span ends there, as the usage count
        it is divided by says. Counting it otherwise left vLLM's every naturally finished
        stream one gap short and its TPOT low by 1/(n-1)."""
        at, decoding = self._maybe_last  # type: ignore[misc]  # called when one is held
        self._maybe_last = None
        last = self.last_token
        if usage.output_tokens != self.stream_tokens + 1 or last is None or at < last:
            return
        self.add_tokens(1, (at - last,), (decoding,), at, None)

    def _group(self, index: int, count: int, chunk_gap: bool) -> None:
        if self._grouped is None:
            self._grouped = []
        self._grouped.append((index, count, chunk_gap))

    def gap_runs(self) -> list[tuple[int, int]]:
        """The ``gaps`` entries that stand for more than one gap: (index, how many). Every
        other entry stands for one. An exporter observes entry ``index`` that many times
        (``observe_many`` over ``gaps``, then the surplus of each run at once)."""
        grouped = self._grouped
        return [] if grouped is None else [(i, n) for i, n, _ in grouped if n != 1]

    @property
    def gap_count(self) -> int:
        """Gaps between tokens (ITL's observations): one per token after the response's
        first, counted from the runs, never by expanding them."""
        grouped = self._grouped
        n = len(self.gaps)
        return n if grouped is None else n + sum(count - 1 for _, count, _ in grouped)

    def chunk_gaps(self) -> list[float]:
        """One value per token-bearing event after the first: the time from the previous
        such event (OTel's ``time_per_output_chunk``). ``gaps`` is per *token*: an event
        of k tokens is one entry holding a k-th of its gap, multiplied back here."""
        grouped = self._grouped
        if not grouped:
            return list(self.gaps)
        out: list[float] = []
        gaps, i = self.gaps, 0
        for index, count, chunk_gap in grouped:
            out.extend(gaps[i:index])
            if chunk_gap:
                out.append(gaps[index] * count)
            i = index + 1
        out.extend(gaps[i:])
        return out

    def finish(self, outcome: Outcome | Verdict, now: float, error_type: str | None = None) -> bool:
        """Finalise once, with the relay's verdict (or its outcome and error type), refined
        by what the stream said (:meth:`refined`). Returns False (and changes nothing) if
        already finished."""
        if self.verdict is not None:
            return False
        verdict = outcome if type(outcome) is Verdict else verdict_of(outcome, error_type)  # type: ignore[arg-type]  # an Outcome
        verdict = self.refined(verdict)
        self.verdict = verdict
        self.outcome = verdict.outcome
        self.error_type = None if verdict is Verdict.OK else verdict.error_type
        self.end = now
        if self.first_token is not None:
            self.decode.leave(now)
        return True

    def refined(self, verdict: Verdict) -> Verdict:
        """The relay's verdict, read again with what the stream said: the one place a
        request's verdict changes after the relay gave it."""
        # The client left after the whole answer was relayed to it (module doc): not a cancel,
        # but what the exchange would have been had it stayed (a 5xx stays an upstream error).
        if verdict is Verdict.CLIENT_DISCONNECTED and self.complete:
            if self.status is not None and self.status >= 500:
                return Verdict.UPSTREAM_STATUS  # as the relay files a 5xx
            verdict = Verdict.OK
        # An error object in a 2xx/3xx body is a failure the status hid; in a 4xx body it is
        # just how the API words a client error, which stays outcome ok with its code.
        if verdict is Verdict.OK:
            if self.stream_error is not None and (self.status is None or self.status < 400):
                return Verdict.STREAM_ERROR
            if self.truncated:
                return Verdict.STREAM_TRUNCATED
        return verdict

    # -- figures (seconds; None when not applicable) --------------------------------------

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def request_overhead(self) -> float | None:
        """Seconds the sidecar held the request before the upstream had it (module doc)."""
        if self.body_received is None or self.upstream_sent is None:
            return None
        return self.upstream_sent - self.body_received

    @property
    def response_overhead(self) -> float | None:
        """Seconds from the upstream's response head to the client's (module doc)."""
        if self.first_byte is None or self.client_head_sent is None:
            return None
        return self.client_head_sent - self.first_byte

    @property
    def ttfb(self) -> float | None:
        return None if self.first_byte is None else self.first_byte - self.start

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def ttfat(self) -> float | None:
        """Time to first answer token, only when the first token was reasoning or a tool call."""
        if self.first_answer_token is None or self.first_token_kind is TokenKind.ANSWER:
            return None
        return self.first_answer_token - self.start

    @property
    def time_to_first_tool_call(self) -> float | None:
        """Seconds from the request to the first piece of a tool call (its id and name)."""
        return None if self.first_tool_call is None else self.first_tool_call - self.start

    @property
    def tool_call_count(self) -> int:
        """Tool calls in the response (at most :data:`MAX_TOOL_CALLS`)."""
        return 0 if self.tool_calls is None else len(self.tool_calls)

    def tool_call_assembly(self) -> list[float]:
        """Per tool call, seconds from its first piece to its last (what an agent waits for
        once the call has begun before it can act on it); 0 for a call that came whole."""
        calls = self.tool_calls
        return [] if calls is None else [last - first for first, last in calls.values()]

    @property
    def complete(self) -> bool:
        """A token stream whose end marker came or whose content said generation finished."""
        return self.streamed and (self.saw_end_marker or self.generation_done)

    @property
    def truncated(self) -> bool:
        """A 2xx token stream whose protocol has an end marker, that never sent it, and whose
        content never said generation finished. (HEAD and 204 have no body to end; a stream
        the observer gave up on is unknown.)"""
        return (
            self.streamed
            and self.end_marker_expected
            and not self.saw_end_marker
            and not self.generation_done
            and self.status is not None
            and 200 <= self.status < 300
            and self.status != 204
            and self.method != "HEAD"
        )

    def _exact(self, field: str) -> int | None:
        """One count, from the first source that has it: usage, then the engine's own."""
        for counts in (self.usage, self.engine_usage):
            if counts is not None:
                value: int | None = getattr(counts, field)
                if value is not None:
                    return value
        return None

    @property
    def token_count_source(self) -> TokenCountSource:
        """Where :attr:`output_tokens` came from; the precedence lives here, once."""
        if self.usage is not None and self.usage.output_tokens is not None:
            return TokenCountSource.USAGE
        if self.engine_usage is not None and self.engine_usage.output_tokens is not None:
            return TokenCountSource.ENGINE
        return TokenCountSource.ESTIMATED if self.streamed else TokenCountSource.NONE

    @property
    def tokens_from_usage(self) -> bool:
        """The output count is exact (the server's usage or the engine's own count)."""
        return self.token_count_source in (TokenCountSource.USAGE, TokenCountSource.ENGINE)

    @property
    def output_tokens(self) -> int | None:
        exact = self._exact("output_tokens")
        if exact is not None:
            return exact
        return self.stream_tokens if self.streamed else None

    @property
    def input_tokens(self) -> int | None:
        """Never estimated: None unless the response carried it."""
        return self._exact("input_tokens")

    @property
    def reasoning_tokens(self) -> int | None:
        exact = self._exact("reasoning_tokens")
        if exact is not None:
            return exact
        return self.reasoning_stream_tokens if self.reasoning_stream_tokens else None

    @property
    def cached_input_tokens(self) -> int | None:
        return self._exact("cached_input_tokens")

    @property
    def decode_seconds(self) -> float | None:
        if self.first_token is None or self.last_token is None:
            return None
        return self.last_token - self.first_token

    @property
    def tpot(self) -> float | None:
        n, d = self.output_tokens, self.decode_seconds
        if n is None or d is None or n < 2:
            return None
        return d / (n - 1)

    @property
    def tokens_per_second(self) -> float | None:
        n, d = self.output_tokens, self.decode_seconds
        if n is None or d is None or n < 2 or d <= 0:
            return None
        return (n - 1) / d
