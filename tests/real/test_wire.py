"""The live tests' own byte comparison (tests/real/wire.py), checked without a server:
a mask that hid too much, or a scanner that read keys inside generated text, would let a
changed byte through."""

from __future__ import annotations

import pytest

from tests.real.wire import content_events, differing_keys, json_events, mask, scalars, token_arrivals

A = b'data: {"id":"x1","created":1,"text":"a \\"id\\":\\"q\\" b","n":[1,2]}\n\ndata: [DONE]\n\n'
B = b'data: {"id":"x2","created":2,"text":"a \\"id\\":\\"q\\" b","n":[1,2]}\n\ndata: [DONE]\n\n'


def test_keys_inside_generated_text_are_not_keys():
    assert [k for k, *_ in scalars(A)] == ["id", "created", "text"]


def test_only_the_differing_keys_are_found_and_masked():
    assert differing_keys(A, B) == {"id", "created"}
    assert mask(A, {"id", "created"}) == mask(B, {"id", "created"})
    assert mask(A, {"id"}) != mask(B, {"id"})


def test_a_byte_outside_the_masked_values_still_differs():
    c = B.replace(b'"n":[1,2]', b'"n":[1,3]')
    assert differing_keys(A, c) == {"id", "created"}  # arrays are not scalars: not maskable
    assert mask(A, {"id", "created"}) != mask(c, {"id", "created"})


def test_a_different_shape_is_an_error_not_a_difference():
    with pytest.raises(AssertionError, match="shape"):
        differing_keys(A, A.replace(b'"created":1,', b""))


def test_arrivals_follow_per_chunk_usage():
    events = [
        {"choices": [{"delta": {"content": "a"}}], "usage": {"completion_tokens": 1}},
        {"choices": [{"delta": {"content": ""}}], "usage": {"completion_tokens": 2}},
        {"choices": [{"delta": {"content": "b c"}}], "usage": {"completion_tokens": 4}},
        {"choices": [], "usage": {"completion_tokens": 4}},
    ]
    assert content_events(events) == 2
    assert token_arrivals(events) == 4  # "a", a token not yet a character, then "b c" carried 2 (4 - 2)
    # Without per-chunk usage: one each; an empty delta before any text, or with a role, is none.
    deltas = ({"role": "assistant", "content": ""}, {"content": ""}, {"content": "a"}, {"content": ""}, {"content": "b"})
    plain = [{"choices": [{"delta": d, "finish_reason": None}]} for d in deltas]
    assert token_arrivals(plain) == 3
    assert json_events(A, True)[0]["id"] == "x1"
