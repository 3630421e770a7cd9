"""The per-token fast paths against the plain code they shortcut: same output, always.

Each oracle below is the straightforward implementation as it stood before the fast paths
(kept here verbatim, not imported, so a later edit to the module cannot change both sides):

- the OpenAI dialect, from bytes: general SSE framing only, blank ``data`` skipped before
  parsing, ``_error_of`` on every object, every delta key looked up, every choice's tool
  calls looked for (``tool_call_deltas``, shared: the oracle of when it is called), the
  choices tracked to the end of generation by their sets' sizes (``_oracle_track``);
- a ``usage`` object read with ``dict.get`` and ``int_or_none`` (``oracle_usage``);
- the timeline applying every :class:`Tokens` through ``_tokens``.

The SSE decoder's own fast paths are compared in ``test_sse_fast_path.py``; the batched
histogram observation in ``test_metrics_observe_many.py``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.events import (
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
    Usage,
)
from sidecar.streams.protocols.llamacpp import engine_timings_from_llamacpp
from sidecar.streams.protocols.openai import (
    OpenAIStreamDialect,
    _count_choices,
    _error_of,
    tool_call_deltas,
    usage_from_openai,
)
from sidecar.streams.protocols.responses import usage_from_responses
from sidecar.streams.sse import SSEDecoder, SSEEvent
from tests.fixtures.streams.harness import objects_from

FAST = settings(max_examples=300, deadline=None)

# -- the OpenAI dialect ------------------------------------------------------------------------


class GeneralOnlyFraming(SSEDecoder):
    """The dialect's SSE decoder with its fast paths off (never idle): the general path."""

    __slots__ = ()

    def _settle(self) -> None:
        self._idle = False


class OracleOpenAI(OpenAIStreamDialect):
    """The dialect as it was: ``_interpret`` and ``_chunk`` before the fast paths."""

    __slots__ = ()

    def __init__(self, max_line_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes)
        self._sse = GeneralOnlyFraming(max_line_bytes) if max_line_bytes else GeneralOnlyFraming()

    def feed(self, chunk: bytes) -> list[DialectEvent]:
        return self._oracle_interpret(self._sse.feed(chunk))

    def close(self) -> list[DialectEvent]:
        return self._oracle_interpret(self._sse.close())

    def _oracle_interpret(self, framed: list) -> list[DialectEvent]:
        out: list[DialectEvent] = []
        for ev in framed:
            if type(ev) is not SSEEvent:
                out.append(ParseError(ev.reason))
                continue
            data = ev.data
            if data == b"[DONE]":
                out.append(StreamEnd())
                continue
            if not data.strip():
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                out.append(ParseError("data is not JSON"))
                continue
            if type(obj) is not dict:
                out.append(ParseError("data is not a JSON object"))
                continue
            self._oracle_chunk(obj, out)
        return out

    def _oracle_chunk(self, obj: dict[str, Any], out: list[DialectEvent]) -> None:
        err = _error_of(obj)
        if err is not None:
            out.append(err)
            return
        if not self._seen_info:
            self._seen_info = True
            model, rid = obj.get("model"), obj.get("id")
            if isinstance(model, str) or isinstance(rid, str):
                out.append(
                    ResponseInfo(
                        response_model=model if isinstance(model, str) else None,
                        response_id=rid if isinstance(rid, str) else None,
                    )
                )
        usage = obj.get("usage")
        parsed = usage_from_openai(usage) if usage else None
        choices = obj.get("choices")
        if choices:
            if type(choices) is not list:
                out.append(ParseError("choices is not a list"))
            else:
                grown = None
                if parsed is None or parsed.output_tokens is None:
                    if oracle_count_choices(choices, out, None, self._started):
                        self._usage_per_chunk = False
                        self._started = True
                else:
                    if self._usage_per_chunk:
                        grown = parsed.output_tokens - self._completion_so_far
                    if oracle_count_choices(choices, out, grown, self._started):
                        self._started = True
                tool_call_deltas(choices, out)  # every event (the dialect skips a plain answer's)
                if not self._done:
                    self._oracle_track(choices, out)
        if parsed is not None:
            if parsed.output_tokens is not None:
                self._completion_so_far = parsed.output_tokens
            out.append(parsed)
        timings = obj.get("timings")
        if timings:
            engine = engine_timings_from_llamacpp(timings)
            if engine is not None:
                out.append(engine)

    def _oracle_track(self, choices: list, out: list[DialectEvent]) -> None:
        """``_track`` as it was: the choice sets' sizes taken with ``len`` at each new index."""
        finished = False
        opened, done = self._open, self._finished
        for choice in choices:
            if type(choice) is not dict:
                continue
            index = choice.get("index", 0)
            if type(index) is not int:
                index = 0
            if (
                index not in opened
                and index not in done
                and len(opened) + len(done) >= MAX_INDICES_PER_RESPONSE
            ):
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                done.add(index)
                opened.discard(index)
                finished = True
            elif index not in done:
                opened.add(index)
        if finished and not opened:
            self._done = True
            out.append(GenerationDone())


def same_choice_state(fast: OpenAIStreamDialect, oracle: OpenAIStreamDialect) -> bool:
    """The choice sets and the end alike, and the fast dialect's counts its sets' sizes."""
    return (
        (fast._open, fast._finished, fast._done) == (oracle._open, oracle._finished, oracle._done)
        and fast._tracked == len(fast._open) + len(fast._finished)
        and fast._ended == len(fast._finished)
    )


def oracle_count_choices(
    choices: list, out: list[DialectEvent], grown: int | None = None, started: bool = False
) -> int:
    answer = reasoning = tool = 0
    finish: list[str] | None = None
    maybe_last = False
    for choice in choices:
        if type(choice) is not dict:
            out.append(ParseError("choice is not an object"))
            continue
        delta = choice.get("delta")
        if type(delta) is dict:
            kinds = 0
            if delta.get("content") or delta.get("refusal"):
                answer += 1
                kinds += 1
            if delta.get("reasoning_content") or delta.get("reasoning"):
                reasoning += 1
                kinds += 1
            if delta.get("tool_calls") or delta.get("function_call"):
                tool += 1
                kinds += 1
            empty = (
                delta.get("content") == ""
                and "role" not in delta
                and not choice.get("finish_reason")  # "": unfinished (Ollama, SGLang)
            )
            if started and empty and not kinds:
                answer += 1
            finishing = (
                delta.get("content") == "" and "role" not in delta and choice.get("finish_reason")
            )
            if started and finishing and not kinds:
                maybe_last = True
        elif choice.get("text"):
            answer += 1
        elif started and choice.get("text") == "" and choice.get("finish_reason"):
            maybe_last = True
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            if finish is None:
                finish = []
            finish.append(reason)
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
    if reasoning:
        out.append(Tokens(TokenKind.REASONING, reasoning))
    if tool:
        out.append(Tokens(TokenKind.TOOL, tool))
    if answer:
        out.append(Tokens(TokenKind.ANSWER, answer))
    elif maybe_last and not (reasoning or tool):
        out.append(MaybeLastToken())
    if finish:
        out.append(ResponseInfo(finish_reasons=tuple(finish)))
    return answer + reasoning + tool


values = st.sampled_from(
    [None, "", "x", " tok", 0, 1, True, False, [], [{}], {}, {"a": 1}, "stop", 5]
)
delta = st.fixed_dictionaries(
    {},
    optional={
        k: values
        for k in (
            "role",
            "content",
            "refusal",
            "reasoning_content",
            "reasoning",
            "tool_calls",
            "function_call",
        )
    },
)
# What servers send: vLLM's content-only delta, SGLang's delta with every key (mostly null).
common_delta = st.one_of(
    st.fixed_dictionaries({"content": values}),
    st.fixed_dictionaries({"content": values, "reasoning_content": values}),
    st.fixed_dictionaries(
        {"role": values, "content": values, "reasoning_content": values, "tool_calls": values}
    ),
    st.fixed_dictionaries({"reasoning_content": values}),
)
finish = st.sampled_from(["stop", None, "length", 5, ""])
choice = st.one_of(
    st.fixed_dictionaries(
        {"index": st.just(0), "delta": common_delta, "logprobs": st.none(), "finish_reason": finish}
    ),
    st.fixed_dictionaries(
        {"index": st.integers(0, 2), "delta": delta},
        optional={"finish_reason": values, "logprobs": st.none(), "text": values},
    ),
    st.fixed_dictionaries(
        {"index": st.integers(0, 2), "text": values}, optional={"finish_reason": values}
    ),
    values,  # not an object at all
)
usage = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": st.integers(-1, 50),
            "completion_tokens": st.integers(-1, 50) | st.none(),
            "completion_tokens_details": st.fixed_dictionaries(
                {}, optional={"reasoning_tokens": st.integers(0, 9)}
            ),
        },
    ),
)
chunk_object = st.one_of(
    st.fixed_dictionaries(
        {"id": st.just("chatcmpl-1"), "object": st.just("chat.completion.chunk"), "model": st.just("m")},
        optional={
            "choices": st.lists(choice, min_size=1, max_size=1) | st.lists(choice, max_size=3) | values,
            "usage": usage,
            "error": st.sampled_from([None, "boom", {"message": "m", "type": "t", "code": 1}, 3, {}]),
            "timings": st.sampled_from([None, {}, {"prompt_ms": 1.5, "predicted_ms": 3.0}]),
        },
    ),
    st.fixed_dictionaries({"object": st.sampled_from(["error", "chat.completion.chunk"]), "message": values}),
    objects_from(["id", "object", "model", "choices", "index", "delta", "content", "reasoning_content",
                  "reasoning", "tool_calls", "text", "finish_reason", "usage", "completion_tokens",
                  "prompt_tokens", "error", "message", "type", "code", "timings", "refusal"]),
)  # fmt: skip


@FAST
@given(
    st.lists(choice, min_size=1, max_size=1) | st.lists(choice, max_size=3),
    st.none() | st.integers(-2, 6),
)
def test_count_choices_equals_the_plain_implementation(choices, grown):
    got: list = []
    want: list = []
    assert _count_choices(choices, got, grown) == oracle_count_choices(choices, want, grown)
    assert got == want


def test_count_choices_fast_shape_with_a_finish_reason_or_growth():
    """The shape the shortcut takes, except for the one thing it must not skip."""
    for choices, grown in (
        ([{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}], None),
        ([{"index": 0, "delta": {"content": "x"}, "finish_reason": None}], 3),
        (
            [
                {
                    "index": 0,
                    "delta": {"content": "x", "reasoning_content": "y"},
                    "finish_reason": None,
                }
            ],
            None,
        ),
        ([{"index": 0, "delta": {"content": "x"}, "finish_reason": 5}], None),
    ):
        got: list = []
        want: list = []
        assert _count_choices(choices, got, grown) == oracle_count_choices(choices, want, grown)
        assert got == want


event_bytes = st.one_of(
    chunk_object.map(lambda o: b"data: " + orjson.dumps(o) + b"\n\n"),
    chunk_object.map(lambda o: b"data: " + json.dumps(o).encode() + b"\n\n"),  # spaced separators
    st.sampled_from(
        [
            b"data: [DONE]\n\n",
            b"data: \n\n",
            b"data:  \t \n\n",
            b"data:\x0b\n\n",
            b"data: \x0c\n\n",
            b"data:\ndata:\n\n",  # "\n": blank, skipped
            b"data: nope\n\n",
            b"data: [1]\n\n",
            b"data: {\n\n",
            b": ping\n\n",
            b"data: {}\r\n\r\n",
            b'event: x\ndata: {"choices":[{"delta":{"content":"a"}}]}\n\n',
        ]
    ),
)


@FAST
@given(st.lists(event_bytes, max_size=12), st.data())
def test_openai_dialect_equals_the_plain_implementation(events, data):
    fast, oracle = OpenAIStreamDialect(), OracleOpenAI()
    raw = b"".join(events)
    if data.draw(st.booleans()):
        chunks = events  # one event per chunk: the fast path's case
    else:
        cuts = sorted(set(data.draw(st.lists(st.integers(0, len(raw)), max_size=8))))
        chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    for chunk in chunks:
        assert fast.feed(chunk) == oracle.feed(chunk)
        assert (fast._seen_info, fast._completion_so_far, fast._usage_per_chunk, fast._started) == (
            oracle._seen_info,
            oracle._completion_so_far,
            oracle._usage_per_chunk,
            oracle._started,
        )
        assert same_choice_state(fast, oracle)
    assert fast.close() == oracle.close()


def content_event(text: str, usage: object = "absent", finish: str | None = None) -> bytes:
    obj: dict[str, Any] = {
        "id": "c",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }
    if usage != "absent":
        obj["usage"] = usage
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def counts(completion: int | None) -> dict[str, Any]:
    return {"prompt_tokens": 3, "completion_tokens": completion}


@pytest.mark.parametrize(
    "usages",
    [
        [counts(1), counts(2), counts(5), counts(6)],  # per chunk, one chunk of three tokens
        [counts(2), counts(2), counts(1), counts(9)],  # stalled, shrunk, then a jump
        ["absent", counts(4), counts(7), counts(8)],  # a chunk without: a total, not per chunk
        ["absent", "absent", "absent", counts(3)],  # llama.cpp: on the last content chunk
        [None, None, counts(None), {"prompt_tokens": 2}],  # null, and no completion count
        [counts(0), counts(-1), counts(True), counts(1.5)],  # bad counts
    ],
)
def test_one_content_choice_with_usage_equals_the_plain_implementation(usages):
    """The one-answer-token event with a usage on it, as each server shapes the counts."""
    fast, oracle = OpenAIStreamDialect(), OracleOpenAI()
    events = [content_event("a", u) for u in usages] + [content_event("", counts(12), "stop")]
    for chunk in events:
        assert fast.feed(chunk) == oracle.feed(chunk)
        assert (fast._completion_so_far, fast._usage_per_chunk, fast._started) == (
            oracle._completion_so_far,
            oracle._usage_per_chunk,
            oracle._started,
        )


@FAST
@given(
    st.lists(
        st.lists(
            st.fixed_dictionaries(
                {"index": st.integers(0, 200) | st.sampled_from([None, "1", True, -1])},
                optional={"finish_reason": finish, "delta": st.just({"content": "x"})},
            )
            | values,
            min_size=1,
            max_size=4,
        ),
        max_size=10,
    ),
    st.integers(0, 140),
)
def test_choice_tracking_equals_the_plain_implementation(events, before):
    """The choices' tracking to the end of generation, up to and past the bound on indices
    (``before`` distinct ones opened first), against ``_track`` as it was."""
    fast, oracle = OpenAIStreamDialect(), OracleOpenAI()
    opening = [{"index": i, "delta": {"role": "assistant"}} for i in range(before)]
    for choices in [opening, *events] if opening else events:
        chunk = b"data: " + orjson.dumps({"choices": choices}) + b"\n\n"
        assert fast.feed(chunk) == oracle.feed(chunk)
        assert same_choice_state(fast, oracle)


def int_or_none(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def oracle_usage(usage: Any, keys: tuple[str, str, str, str]) -> Usage | None:
    """``usage_reader``'s reader as it was: ``dict.get`` and ``int_or_none``."""
    input_key, output_key, input_details_key, output_details_key = keys
    if type(usage) is not dict:
        return None
    input_details = usage.get(input_details_key)
    output_details = usage.get(output_details_key)
    return Usage(
        input_tokens=int_or_none(usage.get(input_key)),
        output_tokens=int_or_none(usage.get(output_key)),
        reasoning_tokens=int_or_none(output_details.get("reasoning_tokens"))
        if type(output_details) is dict
        else None,
        cached_input_tokens=int_or_none(input_details.get("cached_tokens"))
        if type(input_details) is dict
        else None,
    )


count = st.sampled_from([0, 1, -1, None, True, False, 1.0, "3", [], {}]) | st.integers(-2, 2**40)
details = count | st.fixed_dictionaries(
    {}, optional={"reasoning_tokens": count, "cached_tokens": count, "audio_tokens": count}
)
usage_keys = (
    "prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details",
    "input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details",
)  # fmt: skip
any_usage = st.fixed_dictionaries(
    {}, optional={key: details if key.endswith("_details") else count for key in usage_keys}
) | st.sampled_from([None, [], "x", 3])


@FAST
@given(any_usage)
def test_usage_readers_equal_the_plain_implementation(usage):
    """Both spellings (Chat Completions and Responses), whatever the values."""
    assert usage_from_openai(usage) == oracle_usage(usage, usage_keys[:4])
    assert usage_from_responses(usage) == oracle_usage(usage, usage_keys[4:])


# -- the timeline ---------------------------------------------------------------------------------


class OracleTimeline(RequestTimeline):
    """``events`` as it was: every Tokens through ``_tokens``."""

    __slots__ = ()

    def events(self, events: list[DialectEvent], now: float) -> None:
        for ev in events:
            if type(ev) is Tokens:
                self._tokens(ev, now)
            else:
                super().events([ev], now)


kinds = st.sampled_from(list(TokenKind))
timeline_event = st.one_of(
    st.builds(Tokens, kinds, st.just(1)),
    st.builds(Tokens, kinds, st.integers(1, 4)),  # dialects never send 0
    st.builds(Usage, st.none() | st.integers(0, 9), st.none() | st.integers(0, 9)),
    st.builds(
        ResponseInfo, st.none() | st.just("m"), st.none() | st.just("id"), st.just(("stop",))
    ),
    st.builds(StreamEnd),
    st.builds(StreamError, st.just("e")),
    st.builds(ParseError, st.just("p")),
    st.builds(EngineTimings, st.none() | st.just(0.5)),
)


@FAST
@given(st.lists(st.tuples(st.lists(timeline_event, max_size=4), st.floats(0, 0.5)), max_size=20))
def test_timeline_equals_tokens_one_by_one(batches):
    fast, oracle = RequestTimeline(100.0), OracleTimeline(100.0)
    now = 100.0
    for events, step in batches:
        now += step
        fast.events(events, now)
        oracle.events(events, now)
    for name in RequestTimeline.__slots__:
        a, b = getattr(fast, name), getattr(oracle, name)
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), name
        assert type(a) is type(b), name
