"""Genuine bytes from real servers, replayed through the sidecar's observer and dialects.

The recordings under tests/fixtures/real/<engine>-<version><variant>/ were written by
``scripts/record-real-streams.py`` from real vLLM 0.32 (CPU), llama.cpp and ``transformers
serve`` 5.23 (whose streams never send ``[DONE]``: complete all the same) serving
a tiny random model: every route, streamed and not, with and without include_usage. They
hold what docs-shaped fixtures miss: vLLM's ``prompt_token_ids``/``token_ids`` nulls, its
per-chunk usage under ``--enable-force-include-usage``, chunks whose text is empty while
usage grows (tokens that decode to half a UTF-8 character), llama.cpp's ``timings``.

Each body goes through :class:`ResponseObserver` (the proxy's own entry point) whole, byte
by byte, and at random split points, and must give the same events every way, no parse
error, a token count that matches an independent count of the client's view
(tests/real/wire.py), ITL observations = arrivals - 1, the counts' source (the API's usage,
else llama.cpp's own counts, else an estimate) and the engine's timings (llama.cpp's
``timings``, vLLM's per-request ``metrics``) where the body carries them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from sidecar.base.outcomes import Outcome
from sidecar.measure.timeline import RequestTimeline, TokenCountSource
from sidecar.streams.protocols.events import (
    EngineTimings,
    ParseError,
    StreamEnd,
    StreamError,
    Tokens,
)
from tests.fixtures.streams.harness import FAST, split_at
from tests.real.wire import engine_counts, json_events, reported_usage, token_arrivals
from tests.support.recordings import RECORDINGS, STREAMS, meta, replay


def test_there_are_recordings_of_every_server():
    folders = {p.parent.name for p in RECORDINGS}
    assert {
        "vllm-0.32.0",
        "vllm-0.32.0-force-include-usage",
        "vllm-0.32.0-per-request-metrics",
    } <= folders
    assert any(f.startswith("llama.cpp-") for f in folders)
    assert any(f.startswith("transformers-") for f in folders)
    for folder in {p.parent for p in RECORDINGS}:
        if folder.name.startswith("transformers-"):
            continue  # transformers serve has no /metrics
        assert (folder / "metrics.txt").read_text().strip(), (
            f"{folder.name} has no /metrics recording"
        )


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_replayed_whole_the_sidecar_reads_what_the_server_said(path: Path):
    body = path.read_bytes()
    info = meta(path)
    status = info["response"]["status"]
    streamed = path.suffix == ".sse"
    timeline, events = replay(path, [body])

    assert timeline.parse_errors == 0
    assert not any(isinstance(e, ParseError) for e in events)
    if status != 200:  # vLLM refuses stream_options without stream: a 400 error body
        assert timeline.stream_error is not None or not events
        return
    assert not any(isinstance(e, StreamError) for e in events)

    client_view = json_events(body, streamed)
    usage = reported_usage(client_view)
    if streamed:
        arrivals = token_arrivals(client_view)
        assert arrivals >= 2
        assert sum(e.count for e in events if isinstance(e, Tokens)) == arrivals
        assert timeline.stream_tokens == arrivals
        assert len(timeline.gaps) == arrivals - 1
        assert timeline.ttft is not None
        # Complete: the end marker, or (transformers serve never sends [DONE]) every choice
        # finished; either way the request is ok, not upstream_stream_truncated.
        assert timeline.complete
        assert any(isinstance(e, StreamEnd) for e in events) or not body.rstrip().endswith(
            b"data: [DONE]"
        )
        assert (timeline.outcome, timeline.error_type) == (Outcome.OK, None)
    engine = engine_counts(client_view)
    if usage is not None:
        assert timeline.token_count_source is TokenCountSource.USAGE
        assert (timeline.output_tokens, timeline.input_tokens) == (usage["output"], usage["input"])
    elif engine is not None:
        assert timeline.token_count_source is TokenCountSource.ENGINE
        assert (timeline.output_tokens, timeline.input_tokens) == (
            engine["output"],
            engine["input"],
        )
    else:
        assert streamed, "every non-streamed answer carries its counts"
        assert timeline.token_count_source is TokenCountSource.ESTIMATED
        assert timeline.output_tokens == timeline.stream_tokens
    if engine is not None:  # llama.cpp's timings: the engine's own prefill and decode
        timings = next(
            e["timings"] for e in reversed(client_view) if isinstance(e.get("timings"), dict)
        )
        measured = [e for e in events if isinstance(e, EngineTimings)]
        assert measured, "llama.cpp's timings were not read"
        assert measured[-1].decode_seconds == pytest.approx(timings["predicted_ms"] / 1000)
        assert measured[-1].prefill_seconds == pytest.approx(timings["prompt_ms"] / 1000)
    metrics = next(
        (e["metrics"] for e in reversed(client_view) if isinstance(e.get("metrics"), dict)), None
    )
    if metrics is not None:  # vLLM --enable-per-request-metrics: the engine's prefill and decode
        measured = [e for e in events if isinstance(e, EngineTimings)]
        assert measured, "vLLM's per-request metrics were not read"
        assert measured[-1].prefill_seconds == pytest.approx(
            metrics["time_to_first_token_ms"] / 1000
        )
        assert measured[-1].decode_seconds == pytest.approx(metrics["generation_time_ms"] / 1000)


def _summary(timeline: RequestTimeline, events: list) -> tuple:
    """What must not depend on how the bytes were split (timing aside)."""
    return (
        [e for e in events if not isinstance(e, Tokens)],
        sum(e.count for e in events if isinstance(e, Tokens)),
        timeline.parse_errors,
        timeline.output_tokens,
        timeline.input_tokens,
        timeline.finish_reasons,
    )


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_replayed_byte_by_byte_the_reading_is_the_same(path: Path):
    body = path.read_bytes()
    whole = _summary(*replay(path, [body]))
    assert _summary(*replay(path, [body[i : i + 1] for i in range(len(body))])) == whole


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
@FAST
@given(data=st.data())
def test_replayed_at_random_splits_the_reading_is_the_same(path: Path, data):
    body = path.read_bytes()
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    assert _summary(*replay(path, split_at(body, cuts))) == _summary(*replay(path, [body]))
