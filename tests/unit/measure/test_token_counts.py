"""Exact token counts read passively from OpenAI-compatible streams, estimated otherwise.

Fixtures (tests/fixtures/streams/openai/, sources in ../SOURCES.md) are the shapes real
servers send without the sidecar asking for anything: vLLM 0.32's force-included usage
chunk (``--enable-force-include-usage``), its per-chunk usage on ``/v1/completions``, its
per-request ``metrics``; OpenAI's ``"usage": null`` on every chunk; llama.cpp's ``timings``
on the finish chunk, or on the usage chunk when the client asked for usage.

Each stream goes through the observer and the timeline, which say what the exporters will
report: the counts and their source. The events each stream reads as (and that they do
however the bytes arrive) are tests/unit/streams/test_dialect_conformance.py's part.
"""

from __future__ import annotations

import pytest

from sidecar.base.outcomes import Outcome
from sidecar.base.routes import ROUTES
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.timeline import RequestTimeline, TokenCountSource
from sidecar.streams.protocols.events import EngineTimings, TokenKind, Tokens, Usage
from sidecar.streams.protocols.openai import OpenAIStreamDialect, parse_openai_response
from tests.fixtures.streams.harness import load, run_whole

ANSWER = Tokens(TokenKind.ANSWER, 1)
MS = 1000.0


# name -> (route, (source, output, input, cached)); the events each stream reads as, and
# that they read the same however the bytes arrive, are in tests/fixtures/streams/expected.py
# and tests/unit/streams/test_dialect_conformance.py.
CASES: dict[str, tuple[str, tuple]] = {
    # "usage": null is not a count of zero: estimated from the stream, input unknown.
    "usage_null.txt": ("/v1/chat/completions", (TokenCountSource.ESTIMATED, 2, None, None)),
    # prompt_n (5 evaluated) + cache_n (4 reused) = the whole prompt of 9.
    "llamacpp_chat_timings.txt": ("/v1/chat/completions", (TokenCountSource.ENGINE, 3, 9, 4)),
    "llamacpp_chat_include_usage.txt": ("/v1/chat/completions", (TokenCountSource.USAGE, 3, 9, 4)),
}
NAMES = sorted(CASES)


def observed(route: str, chunks: list[bytes]) -> RequestTimeline:
    """What the proxy does with a 200 stream: observer per chunk, close, finish once."""
    t = RequestTimeline(0.0, "POST", route, "m")
    observer = ResponseObserver(ROUTES[route], t, "text/event-stream")
    t.response_started(0.001, 200, observer.streaming)
    for i, chunk in enumerate(chunks):
        observer.feed(chunk, 0.01 * (i + 1))
    observer.close(1.0)
    t.finish(Outcome.OK, 1.0)
    return t


@pytest.mark.parametrize("name", NAMES)
def test_counts_and_their_source(name):
    route, (source, output, input_, cached) = CASES[name]
    raw = load("openai", name)
    t = observed(route, [raw[i : i + 7] for i in range(0, len(raw), 7)])
    assert t.outcome is Outcome.OK
    assert t.token_count_source is source
    assert t.tokens_from_usage is (source is not TokenCountSource.ESTIMATED)
    assert (t.output_tokens, t.input_tokens, t.cached_input_tokens) == (output, input_, cached)


def test_estimate_drives_tpot_when_nothing_better():
    """No usage: TPOT and tokens/s use the stream's own count (2 tokens, 1 gap)."""
    raw = load("openai", "usage_null.txt")
    events = raw.split(b"\n\n")
    t = observed("/v1/chat/completions", [e + b"\n\n" for e in events if e])
    assert t.output_tokens == 2 and t.decode_seconds == pytest.approx(0.01)
    assert t.tpot == pytest.approx(0.01)


def test_usage_wins_over_the_engine_and_the_estimate():
    t = RequestTimeline(0.0, "POST", "/v1/chat/completions")
    t.response_started(0.0, 200, True)
    t.events([ANSWER, ANSWER], 0.1)
    assert (t.token_count_source, t.output_tokens) == (TokenCountSource.ESTIMATED, 2)
    t.events([Usage(input_tokens=20, output_tokens=5, cached_input_tokens=8, engine=True)], 0.2)
    assert (t.token_count_source, t.output_tokens, t.input_tokens) == (
        TokenCountSource.ENGINE,
        5,
        20,
    )
    # usage lacks cached tokens: that one count still comes from the engine
    t.events([Usage(input_tokens=21, output_tokens=6)], 0.3)
    assert (t.token_count_source, t.output_tokens, t.input_tokens) == (
        TokenCountSource.USAGE,
        6,
        21,
    )
    assert t.cached_input_tokens == 8


def test_input_only_usage_leaves_output_estimated():
    """Anthropic's message_start carries input only; a stream cut after it has no output count."""
    t = RequestTimeline(0.0, "POST", "/v1/messages")
    t.response_started(0.0, 200, True)
    t.events([Usage(input_tokens=30), ANSWER], 0.1)
    assert (t.token_count_source, t.output_tokens, t.input_tokens) == (
        TokenCountSource.ESTIMATED,
        1,
        30,
    )


def test_non_streamed_json_without_usage_has_no_count():
    t = RequestTimeline(0.0, "POST", "/v1/chat/completions")
    t.response_started(0.0, 200, False)
    t.events(parse_openai_response(b'{"id":"x","model":"m","choices":[]}'), 0.1)
    assert (t.token_count_source, t.output_tokens, t.input_tokens) == (
        TokenCountSource.NONE,
        None,
        None,
    )


def test_non_streamed_llamacpp_timings_are_engine_counts():
    body = (
        b'{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Hi"}}],'
        b'"created":1,"model":"tiny","object":"chat.completion","id":"chatcmpl-1",'
        b'"timings":{"cache_n":0,"prompt_n":6,"prompt_ms":5.0,"predicted_n":2,"predicted_ms":8.0}}'
    )
    t = RequestTimeline(0.0, "POST", "/v1/chat/completions")
    t.response_started(0.0, 200, False)
    t.events(parse_openai_response(body), 0.1)
    assert (t.token_count_source, t.output_tokens, t.input_tokens) == (
        TokenCountSource.ENGINE,
        2,
        6,
    )


def test_vllm_metrics_garbage_is_ignored():
    d = OpenAIStreamDialect()
    out = d.feed(
        b'data: {"choices":[],"metrics":{"time_to_first_token_ms":"x","generation_time_ms":-1}}\n\n'
    )
    assert not any(type(e) is EngineTimings for e in out)
    out = d.feed(b'data: {"choices":[],"metrics":{}}\n\n')
    assert not any(type(e) is EngineTimings for e in out)


# -- recorded from real servers (see SOURCES.md): the same checks on genuine bytes ------------

# name -> (route, (source, output, input, cached))
RECORDED: dict[str, tuple[str, tuple]] = {
    # vLLM 0.32 --enable-force-include-usage --enable-per-request-metrics, a client that did
    # not ask: cumulative usage on EVERY chunk (the role chunk's completion_tokens is 0),
    # then a choices: [] usage chunk with the per-request metrics.
    "vllm032_chat_force_usage.txt": ("/v1/chat/completions", (TokenCountSource.USAGE, 4, 17, None)),
    "vllm032_completions_force_usage.txt": (
        "/v1/completions",
        (TokenCountSource.USAGE, 4, 5, None),
    ),
    # vLLM 0.32 without those flags: the client asked include_usage (one usage chunk) ...
    "vllm032_chat_include_usage.txt": (
        "/v1/chat/completions",
        (TokenCountSource.USAGE, 4, 17, None),
    ),
    # vLLM 0.32 --enable-prefix-caching --enable-prompt-tokens-details, the second request of
    # a 470-token prompt: prompt_tokens_details.cached_tokens 384 (whole 16-token blocks).
    "vllm032_chat_prefix_cached.txt": (
        "/v1/chat/completions",
        (TokenCountSource.USAGE, 4, 470, 384),
    ),
    # ... or did not: no usage key at all; estimated, input unknown.
    "vllm032_chat_no_usage.txt": (
        "/v1/chat/completions",
        (TokenCountSource.ESTIMATED, 4, None, None),
    ),
    # llama.cpp b11434, no include_usage: timings on the finish chunk, prompt_n 25, cache_n 0.
    "llamacpp_b11434_chat.txt": ("/v1/chat/completions", (TokenCountSource.ENGINE, 6, 25, 0)),
    # The same request again with include_usage: usage says prompt_tokens 25 with 24 cached,
    # and its timings say prompt_n 1 + cache_n 24: the engine formula agrees with usage.
    "llamacpp_b11434_chat_include_usage.txt": (
        "/v1/chat/completions",
        (TokenCountSource.USAGE, 6, 25, 24),
    ),
    # llama.cpp's /v1/completions puts usage on its finish chunk without being asked.
    "llamacpp_b11434_completions.txt": ("/v1/completions", (TokenCountSource.USAGE, 4, 5, 0)),
}
RECORDED_NAMES = sorted(RECORDED)


@pytest.mark.parametrize("name", RECORDED_NAMES)
def test_recorded_counts_and_their_source(name):
    route, (source, output, input_, cached) = RECORDED[name]
    raw = load("openai", name)
    t = observed(route, [raw[i : i + 64] for i in range(0, len(raw), 64)])
    assert (t.outcome, t.token_count_source) == (Outcome.OK, source)
    assert (t.output_tokens, t.input_tokens, t.cached_input_tokens) == (output, input_, cached)


@pytest.mark.parametrize(
    "name,prefill_ms,decode_ms,queue_ms",
    [
        (
            "vllm032_chat_force_usage.txt",
            127.4029689998315,
            105.76010100021449,
            0.03214800017303787,
        ),
        (
            "vllm032_completions_force_usage.txt",
            27.27981899988663,
            29.06002500003524,
            0.027349999982106965,
        ),
    ],
)
def test_recorded_vllm_per_chunk_usage_and_metrics(name, prefill_ms, decode_ms, queue_ms):
    """Per-chunk usage grows by one per chunk: one token each, one ITL gap each; the
    per-request metrics give the engine's queue, prefill and decode times."""
    raw = load("openai", name)
    t = observed(RECORDED[name][0], [e + b"\n\n" for e in raw.split(b"\n\n") if e])
    assert (t.stream_tokens, len(t.gaps)) == (4, 3)
    assert t.engine == EngineTimings(
        prefill_seconds=prefill_ms / MS, decode_seconds=decode_ms / MS, queue_seconds=queue_ms / MS
    )


def test_recorded_llamacpp_engine_counts_match_its_usage():
    """Both figures from one real chunk: prompt_n + cache_n is usage.prompt_tokens."""
    events = run_whole(
        OpenAIStreamDialect, load("openai", "llamacpp_b11434_chat_include_usage.txt")
    )
    usage = [e for e in events if type(e) is Usage and not e.engine]
    engine = [e for e in events if type(e) is Usage and e.engine]
    assert len(usage) == len(engine) == 1
    assert (usage[0].input_tokens, usage[0].output_tokens, usage[0].cached_input_tokens) == (
        engine[0].input_tokens, engine[0].output_tokens, engine[0].cached_input_tokens,
    )  # fmt: skip
