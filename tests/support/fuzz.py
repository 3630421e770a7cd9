"""The hostile byte mix the stream parsers are fuzzed with
(``tests/unit/streams/test_fuzz_dialects.py``,
``tests/integration/relay/data/test_hostile_bytes.py``, ``scripts/fuzz.py``): real recorded
streams of every dialect cut into lines, random bytes, every line-end style, BOMs, long lines
past the bound, invalid UTF-8, and JSON objects built from the keys the dialects read.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from tests.fixtures.streams.harness import HERE, objects_from

RECORDED_LINES = sorted(
    {
        line + b"\n"
        for path in HERE.glob("*/*")
        if path.suffix in (".txt", ".ndjson", ".json")
        for line in path.read_bytes().split(b"\n")
    }
)
KEYS = sorted(
    {
        # what the OpenAI, Responses, Anthropic, TGI, Ollama, llama.cpp and Triton dialects read
        "id", "object", "model", "choices", "index", "delta", "content", "reasoning_content", "reasoning",
        "tool_calls", "function", "arguments", "text", "finish_reason", "usage", "prompt_tokens",
        "completion_tokens", "completion_tokens_details", "reasoning_tokens", "prompt_tokens_details",
        "cached_tokens", "error", "message", "type", "code", "response", "output_text", "item_id",
        "input_tokens", "output_tokens", "cache_read_input_tokens", "thinking", "partial_json",
        "stop_reason", "content_block", "token", "special", "generated_text", "details",
        "generated_tokens", "done", "done_reason", "eval_count", "prompt_eval_count",
        "load_duration", "prompt_eval_duration", "eval_duration", "stop", "timings",
        "predicted_n", "prompt_n", "text_output", "model_name",
    }
)  # fmt: skip
json_objects = objects_from(KEYS)
TOKENS = [
    b"\n", b"\r", b"\r\n", b"\n\n", b"\r\r", b"\r\n\r\n", b"data:", b"data: ", b"data: [DONE]\n\n",
    b"event: message_stop\n", b"event: ", b"id: 1\n", b"retry: 5\n", b": ping\n\n", b"\xef\xbb\xbf",
    b"\xff\xfe", b"\xe6\x97", b"{", b"}", b'{"', b"null", b'data: {"choices":[],"usage":{}}\n\n', b"\x00",
]  # fmt: skip


def _as_event(obj: dict, framing: str) -> bytes:
    raw = json.dumps(obj).encode()
    return raw + b"\n" if framing == "nd" else b"data: " + raw + b"\n\n"


fragment = st.one_of(
    st.sampled_from(RECORDED_LINES),
    st.sampled_from(TOKENS),
    st.binary(max_size=40),
    st.builds(
        lambda n, c: b"data: " + c * n,
        st.integers(0, 300),
        st.sampled_from([b"x", b"\xc3\xa9", b"\r", b"\n"]),
    ),
    st.builds(_as_event, json_objects, st.sampled_from(["sse", "nd"])),
)
hostile_bytes = st.lists(fragment, max_size=25).map(b"".join)
