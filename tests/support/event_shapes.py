"""OpenAI chat-chunk payloads in the shapes servers write them, with ``"@"`` where the token
text goes: what the event template (the dialect's fast path) must learn or refuse. Used by
the template's tests (``tests/unit/streams/test_event_template.py``) and the token lane's.
"""

from __future__ import annotations

import orjson
from hypothesis import strategies as st

VLLM = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"@"},"logprobs":null,"finish_reason":null}]}'
)
SHAPES = [
    VLLM,
    # llama.cpp: the delta first, created and ids after it
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"@"}}],"created":1,"id":"c","model":"m","object":"chat.completion.chunk"}',
    # spaced separators, as Python's json.dumps writes
    b'{"id": "c", "choices": [{"index": 0, "delta": {"content": "@"}, "finish_reason": null}]}',
    b'{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"@","content":null},"finish_reason":null}]}',
    b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"@","finish_reason":null}]}',
    b'{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"@"}}]},"finish_reason":null}]}',
    # the text where another field could be mistaken for it
    b'{"id":"@","model":"@","choices":[{"index":0,"delta":{"content":"@"},"finish_reason":null}]}',
]
OTHERS = [
    b'{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
    b'{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}',
    b'{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}',
    b'{"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}',
    b'{"id":"chatcmpl-1","choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}',
    b'{"error":{"message":"boom","type":"internal"}}',
    b"[DONE]",
    b"not json",
]

# What goes where the token text was: valid JSON string contents and anything else.
texts = st.one_of(
    st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.text(max_size=6).map(lambda t: orjson.dumps(t)[1:-1]),  # as a JSON writer escapes it
    st.sampled_from(
        [b"\\u00e9", b'\\"', b"\\\\", b"\\n", b"a\\/b", b"@", b"chatcmpl-1", b"m", b"c"]
    ),
    st.binary(max_size=6),
)
