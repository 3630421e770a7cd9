"""The bytes the benchmark upstream sends, shared with the load generator so it can
recompute every stream it should receive and compare byte for byte.

A stream is fully determined by its id (the ``X-Bench-Stream`` request header) and its
token count (``max_tokens`` in the request body): the vLLM chat chunk shape of
``sidecar/tools/sim/core.py`` (role chunk first, one ``data: {...chat.completion.chunk...}``
event per token, the last with ``finish_reason``, an optional usage-only chunk when the
request asked for ``stream_options.include_usage``, then ``data: [DONE]``). The token texts
are picked by a hash of (stream, position) from a list that includes 2, 3 and 4 byte UTF-8
characters, so a proxy that splits or re-encodes characters fails the checksum.
"""

from __future__ import annotations

MODEL = "bench-model"
CREATED = 1_700_000_000
PATH = "/v1/chat/completions"
STREAM_HEADER = "X-Bench-Stream"

# JSON-encoded token texts, as vLLM's pydantic dump writes them (raw UTF-8, escapes only
# where JSON needs them).
_TOKENS: tuple[bytes, ...] = tuple(
    t.encode()
    for t in (
        '" the"', '" of"', '" and"', '" to"', '" a"', '" in"', '" is"', '" that"', '" for"',
        '" it"', '" with"', '" model"', '" token"', '" latency"', '" request"', '" server"',
        '" stream"', '" time"', '" first"', '" output"', '" queue"', '" batch"', '" cache"',
        '" decode"', '" prefill"', '" throughput"', '" tail"', '","', '"."', '":"', '"\'s"',
        '"ing"', '" ("', '")"', '"\\n"', '"\\n\\n"', '" 42"', '" ms"', '" \\""',
        '" café"', '" naïve"', '" Zürich"', '"—"', '" 日本"', '"語"', '" 🚀"', '" €"', '" π"',
    )
)
_DONE = b"data: [DONE]\n\n"


def token_json(stream_id: int, k: int) -> bytes:
    """The JSON string of token ``k`` of stream ``stream_id``."""
    return _TOKENS[((stream_id * 2_654_435_761) ^ (k * 40_503)) % len(_TOKENS)]


class StreamWire:
    """Event bytes of one stream (``data: ...\\n\\n``, not yet HTTP-chunked)."""

    __slots__ = ("stream_id", "tokens", "_head", "_usage_head")

    def __init__(self, stream_id: int, tokens: int) -> None:
        self.stream_id = stream_id
        self.tokens = tokens
        common = b'{"id":"chatcmpl-%032x","object":"chat.completion.chunk","created":%d,"model":"%s"' % (
            stream_id, CREATED, MODEL.encode(),
        )
        self._head = b"data: " + common + b',"choices":[{"index":0,"delta":'
        self._usage_head = b"data: " + common + b',"choices":[],"usage":'

    def role(self) -> bytes:
        return self._head + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'

    def token(self, k: int) -> bytes:
        if k == self.tokens - 1:
            end = b'},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
        else:
            end = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        return b'%s{"content":%s%s' % (self._head, token_json(self.stream_id, k), end)

    def usage(self, prompt_tokens: int) -> bytes:
        return b'%s{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (
            self._usage_head, prompt_tokens, prompt_tokens + self.tokens, self.tokens,
        )

    @staticmethod
    def done() -> bytes:
        return _DONE

    def client_body(self) -> bytes:
        """What a client that did not ask for usage must receive, byte for byte."""
        return b"".join([self.role(), *(self.token(k) for k in range(self.tokens)), _DONE])


PROMPT_TOKENS = 12


def request_body(tokens: int) -> bytes:
    return (
        b'{"model":"%s","messages":[{"role":"user","content":"Write about latency."}],'
        b'"stream":true,"max_tokens":%d}' % (MODEL.encode(), tokens)
    )


def request_bytes(host: str, stream_id: int, tokens: int) -> bytes:
    body = request_body(tokens)
    return (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Accept: text/event-stream\r\n%s: %d\r\nContent-Length: %d\r\n\r\n%s"
        % (PATH.encode(), host.encode(), STREAM_HEADER.encode(), stream_id, len(body), body)
    )
