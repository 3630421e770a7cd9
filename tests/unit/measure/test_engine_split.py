"""Where the time goes, per request: each engine's own queue / prefill / decode figures,
read passively from what it sends, on recorded or source-cited bytes.

- vLLM 0.32: recorded from a real server started with ``--enable-per-request-metrics``
  (tests/fixtures/streams/openai/vllm032_*per_request_metrics*).
- TGI: its timing headers as ``router/src/server.rs`` writes them (integer milliseconds).
- SGLang: ``meta_info`` on its native ``/generate``, as ``tokenizer_manager.py`` builds it
  (tests/fixtures/streams/sglang/).
Every stream is fed whole, byte by byte and at random splits.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, strategies as st

from sidecar.base.outcomes import Outcome
from sidecar.measure.timeline import RequestTimeline, TokenCountSource
from sidecar.streams.protocols.events import (
    EngineTimings,
    ResponseInfo,
    StreamEnd,
    TokenKind,
    Tokens,
    Usage,
)
from sidecar.streams.protocols.openai import OpenAIStreamDialect, parse_openai_response
from sidecar.streams.protocols.tgi import TGIStreamDialect, parse_tgi_response, tgi_head_events
from tests.fixtures.streams.harness import FAST, load, run_bytewise, run_whole, split_at

VLLM_CHAT = load("openai", "vllm032_chat_per_request_metrics.txt")
SGLANG_STREAM = load("sglang", "generate_stream_metrics.txt")


def _engine(events) -> EngineTimings | None:
    timeline = RequestTimeline(0.0)
    timeline.events(events, 1.0)
    return timeline.engine


def _vllm_metrics(body: bytes) -> dict:
    """The ``metrics`` object of the recorded stream, read independently of the dialect."""
    for line in body.split(b"\n"):
        if line.startswith(b"data: {") and b'"metrics"' in line:
            return orjson.loads(line[6:])["metrics"]
    raise AssertionError("no metrics in the recording")


# -- vLLM ------------------------------------------------------------------------------------


def test_vllm_recorded_stream_gives_queue_prefill_and_decode():
    m = _vllm_metrics(VLLM_CHAT)
    engine = _engine(run_whole(OpenAIStreamDialect, VLLM_CHAT))
    assert engine == EngineTimings(
        prefill_seconds=m["time_to_first_token_ms"] / 1000,
        decode_seconds=m["generation_time_ms"] / 1000,
        queue_seconds=m["queue_time_ms"] / 1000,
    )
    assert engine.queue_seconds is not None and engine.queue_seconds > 0


def test_vllm_recorded_stream_bytewise_is_the_same():
    assert run_bytewise(OpenAIStreamDialect, VLLM_CHAT) == run_whole(OpenAIStreamDialect, VLLM_CHAT)


@FAST
@given(st.lists(st.integers(0, len(VLLM_CHAT)), max_size=12))
def test_vllm_recorded_stream_at_random_splits(cuts):
    assert [e for e in _run(OpenAIStreamDialect, split_at(VLLM_CHAT, cuts))] == run_whole(
        OpenAIStreamDialect, VLLM_CHAT
    )


def _run(make, chunks):
    d = make()
    out = []
    for c in chunks:
        out += d.feed(c)
    return out + d.close()


def test_vllm_without_usage_sends_no_metrics_and_none_is_invented():
    events = run_whole(
        OpenAIStreamDialect, load("openai", "vllm032_chat_per_request_metrics_no_usage.txt")
    )
    assert not [e for e in events if type(e) is EngineTimings]


def test_vllm_recorded_non_streamed_body_gives_queue():
    body = load("openai", "vllm032_completions_per_request_metrics.json")
    m = orjson.loads(body)["metrics"]
    engine = _engine(parse_openai_response(body))
    assert engine is not None and engine.queue_seconds == m["queue_time_ms"] / 1000
    assert engine.prefill_seconds == m["time_to_first_token_ms"] / 1000


@pytest.mark.parametrize("bad", [-1, "12", None, True, [], {}])
def test_vllm_bad_queue_value_is_dropped_and_keeps_the_rest(bad):
    line = orjson.dumps(
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2},
         "metrics": {"queue_time_ms": bad, "time_to_first_token_ms": 5.0}}
    )  # fmt: skip
    events = run_whole(OpenAIStreamDialect, b"data: " + line + b"\n\n")
    assert [e for e in events if type(e) is EngineTimings] == [EngineTimings(prefill_seconds=0.005)]


# -- llama.cpp -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["llamacpp_b11434_chat.txt", "llamacpp_b11434_chat_include_usage.txt"]
)
def test_llamacpp_recorded_timings_give_prefill_and_decode_and_no_queue(name):
    """A real llama-server b11434 stream: ``prompt_ms`` is prefill, ``predicted_ms`` decode;
    llama.cpp reports no queue time per request, so none is invented."""
    raw = load("openai", name)
    timings = None
    for line in raw.split(b"\n"):
        if b'"timings"' in line:
            timings = orjson.loads(line[6:])["timings"]
    assert timings is not None
    assert _engine(run_whole(OpenAIStreamDialect, raw)) == EngineTimings(
        prefill_seconds=timings["prompt_ms"] / 1000, decode_seconds=timings["predicted_ms"] / 1000
    )


# -- merging: one account from several places -------------------------------------------------


def test_engine_timings_merge_field_by_field_later_wins():
    timeline = RequestTimeline(0.0)
    timeline.events([EngineTimings(queue_seconds=0.5)], 0.1)  # a header
    timeline.events([EngineTimings(prefill_seconds=0.2, decode_seconds=1.0)], 0.2)  # the body
    timeline.events([EngineTimings(decode_seconds=1.5)], 0.3)  # cumulative, repeated
    assert timeline.engine == EngineTimings(
        prefill_seconds=0.2, decode_seconds=1.5, queue_seconds=0.5
    )


# -- TGI -------------------------------------------------------------------------------------

# What router/src/server.rs `generate` writes on a non-streamed /generate (integer ms).
TGI_HEADERS = {
    "x-compute-type": "gpu+optimized",
    "x-compute-time": "1.234",
    "x-compute-characters": "42",
    "x-total-time": "1234",
    "x-validation-time": "3",
    "x-queue-time": "187",
    "x-inference-time": "1044",
    "x-time-per-token": "52",
    "x-prompt-tokens": "11",
    "x-generated-tokens": "20",
}


def test_tgi_headers_give_queue_and_engine_counts():
    assert tgi_head_events(TGI_HEADERS) == [
        EngineTimings(queue_seconds=0.187),
        Usage(input_tokens=11, output_tokens=20, engine=True),
    ]


def test_tgi_stream_head_has_no_timing_headers_and_gives_nothing():
    assert tgi_head_events({"x-compute-type": "gpu+optimized", "x-compute-characters": "42"}) == []


@pytest.mark.parametrize("value", ["-5", "1.5", "", " 7", "7 ", "٣", "9" * 40, "0x10"])
def test_tgi_malformed_header_values_are_ignored(value):
    events = tgi_head_events({"x-queue-time": value, "x-generated-tokens": value})
    assert events == []


def test_tgi_header_counts_and_details_agree_through_the_timeline():
    timeline = RequestTimeline(0.0, "POST", "/generate")
    timeline.events(tgi_head_events(TGI_HEADERS), 0.0)
    timeline.events(parse_tgi_response(load("tgi", "generate.json")), 1.0)
    assert timeline.engine == EngineTimings(queue_seconds=0.187)
    assert timeline.token_count_source is TokenCountSource.ENGINE


# -- SGLang ----------------------------------------------------------------------------------


def test_sglang_stream_counts_tokens_by_completion_growth_and_reads_meta_info():
    events = run_whole(TGIStreamDialect, SGLANG_STREAM)
    tokens = [e.count for e in events if type(e) is Tokens]
    assert tokens == [1, 1, 2, 1]  # completion_tokens 1, 2, 4, 5
    assert all(e.kind is TokenKind.ANSWER for e in events if type(e) is Tokens)
    usages = [e for e in events if type(e) is Usage]
    assert usages[-1] == Usage(input_tokens=7, output_tokens=5, cached_input_tokens=3, engine=True)
    assert [e for e in events if type(e) is EngineTimings][-1] == EngineTimings(
        queue_seconds=0.0123
    )
    assert ResponseInfo(finish_reasons=("length",)) in events
    assert ResponseInfo(response_id="8f2c1e0d9b7a4c3e") in events
    assert events[-1] == StreamEnd()


def test_sglang_stream_bytewise_is_the_same():
    assert run_bytewise(TGIStreamDialect, SGLANG_STREAM) == run_whole(
        TGIStreamDialect, SGLANG_STREAM
    )


@FAST
@given(st.lists(st.integers(0, len(SGLANG_STREAM)), max_size=12))
def test_sglang_stream_at_random_splits(cuts):
    assert _run(TGIStreamDialect, split_at(SGLANG_STREAM, cuts)) == run_whole(
        TGIStreamDialect, SGLANG_STREAM
    )


def test_sglang_stream_through_the_timeline_is_ok_with_engine_counts():
    timeline = RequestTimeline(0.0, "POST", "/generate")
    timeline.response_started(0.01, 200, streamed=True)
    timeline.end_marker_expected = TGIStreamDialect.HAS_END_MARKER
    for i, event in enumerate(run_whole(TGIStreamDialect, SGLANG_STREAM)):
        timeline.events([event], 0.1 + i * 0.01)
    assert timeline.finish(Outcome.OK, 1.0)
    assert timeline.outcome is Outcome.OK  # [DONE] is SGLang's end marker
    assert (
        timeline.output_tokens == 5
        and timeline.input_tokens == 7
        and timeline.cached_input_tokens == 3
    )
    assert timeline.token_count_source is TokenCountSource.ENGINE


def test_sglang_non_streamed_body():
    events = parse_tgi_response(load("sglang", "generate.json"))
    assert events == [
        ResponseInfo(response_id="a1b2c3", finish_reasons=("stop",)),
        Usage(input_tokens=9, output_tokens=6, cached_input_tokens=0, engine=True),
    ]


def test_sglang_batch_body_adds_counts_and_takes_the_longest_queue():
    one = {"text": "a", "meta_info": {"prompt_tokens": 3, "completion_tokens": 4, "cached_tokens": 1, "queue_time": 0.2,
                                      "finish_reason": {"type": "length"}}}  # fmt: skip
    two = {"text": "b", "meta_info": {"prompt_tokens": 5, "completion_tokens": 6, "cached_tokens": 0, "queue_time": 0.5,
                                      "finish_reason": {"type": "stop"}}}  # fmt: skip
    events = parse_tgi_response(orjson.dumps([one, two]))
    assert events == [
        ResponseInfo(finish_reasons=("length", "stop")),
        Usage(input_tokens=8, output_tokens=10, cached_input_tokens=1, engine=True),
        EngineTimings(queue_seconds=0.5),
    ]


def test_tgi_streams_on_generate_are_read_as_before():
    """SGLang's branch only takes objects with meta_info: TGI's own bytes are unchanged."""
    data = load("tgi", "generate_stream.txt")
    events = run_whole(TGIStreamDialect, data)
    assert not [e for e in events if type(e) is EngineTimings]
    assert any(type(e) is Usage and e.engine for e in events)
    assert events[-1] == StreamEnd() or StreamEnd() in events
