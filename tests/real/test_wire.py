"""The live tests' own reading of response bodies (tests/real/wire.py), checked without a
server: a miscount here would let a wrong measurement through."""

from __future__ import annotations

from tests.real.wire import content_events, json_events, token_arrivals


def test_arrivals_follow_per_chunk_usage():
    events = [
        {"choices": [{"delta": {"content": "a"}}], "usage": {"completion_tokens": 1}},
        {"choices": [{"delta": {"content": ""}}], "usage": {"completion_tokens": 2}},
        {"choices": [{"delta": {"content": "b c"}}], "usage": {"completion_tokens": 4}},
        {"choices": [], "usage": {"completion_tokens": 4}},
    ]
    assert content_events(events) == 2
    assert (
        token_arrivals(events) == 4
    )  # "a", a token not yet a character, then "b c" carried 2 (4 - 2)
    # Without per-chunk usage: one each; an empty delta before any text, or with a role, is none.
    deltas = (
        {"role": "assistant", "content": ""},
        {"content": ""},
        {"content": "a"},
        {"content": ""},
        {"content": "b"},
    )
    plain = [{"choices": [{"delta": d, "finish_reason": None}]} for d in deltas]
    assert token_arrivals(plain) == 3
    body = b'data: {"id":"x1","text":"a \\"id\\" b"}\n\ndata: [DONE]\n\n'
    assert json_events(body, True) == [{"id": "x1", "text": 'a "id" b'}]
