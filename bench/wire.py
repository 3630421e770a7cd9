"""The bytes the benchmark upstream sends, shared with the load generator so it can
recompute every stream it should receive and compare byte for byte.

A stream is fully determined by its id (the ``X-Bench-Stream`` request header) and its
token count (``max_tokens`` in the request body): the vLLM chat chunk shape of
``sidecar/tools/sim/core.py`` (role chunk first, one ``data: {...chat.completion.chunk...}``
event per token, the last with ``finish_reason``, an optional usage-only chunk when the
request asked for ``stream_options.include_usage``, then ``data: [DONE]``). The token texts
are picked by a hash of (stream, position) from a list that includes 2, 3 and 4 byte UTF-8
characters, so a proxy that splits or re-encodes characters fails the checksum.

The mixed load shape (``--shape mixed``, :func:`mixed_request`) draws every request from
(connection index, request number) alone, so every target and every round sees the same
sequence: output length log-uniform in 20..800 tokens (many short requests, a long tail,
mean ~210, close to the steady shape's 200), 20 % non-streamed (``"stream": false``), four
model names with weights 4:3:2:1, 25 % of requests on ``/v1/completions`` (the rest chat);
every fourth connection (index % 4 == 3) opens a new TCP connection per request
(``Connection: close``). Chat streams keep :class:`StreamWire`'s chunk shape; completions
streams (:class:`CompletionWire`) and both non-streamed bodies (:func:`whole_body`) are vLLM
0.32's, as recorded in tests/fixtures/real/vllm-0.32.0/ (``system_fingerprint`` on the
finishing chunk, or on the usage chunk when the request asked for usage).
"""

from __future__ import annotations

from typing import NamedTuple

MODEL = "bench-model"
CREATED = 1_700_000_000
PATH = "/v1/chat/completions"
STREAM_HEADER = "X-Bench-Stream"

# JSON-encoded token texts, as vLLM's pydantic dump writes them (raw UTF-8, escapes only
# where JSON needs them).
_TOKENS: tuple[bytes, ...] = tuple(
    t.encode()
    for t in (
        '" the"',
        '" of"',
        '" and"',
        '" to"',
        '" a"',
        '" in"',
        '" is"',
        '" that"',
        '" for"',
        '" it"',
        '" with"',
        '" model"',
        '" token"',
        '" latency"',
        '" request"',
        '" server"',
        '" stream"',
        '" time"',
        '" first"',
        '" output"',
        '" queue"',
        '" batch"',
        '" cache"',
        '" decode"',
        '" prefill"',
        '" throughput"',
        '" tail"',
        '","',
        '"."',
        '":"',
        '"\'s"',
        '"ing"',
        '" ("',
        '")"',
        '"\\n"',
        '"\\n\\n"',
        '" 42"',
        '" ms"',
        '" \\""',
        '" café"',
        '" naïve"',
        '" Zürich"',
        '"—"',
        '" 日本"',
        '"語"',
        '" 🚀"',
        '" €"',
        '" π"',
    )
)
_DONE = b"data: [DONE]\n\n"


def token_json(stream_id: int, k: int) -> bytes:
    """The JSON string of token ``k`` of stream ``stream_id``."""
    return _TOKENS[((stream_id * 2_654_435_761) ^ (k * 40_503)) % len(_TOKENS)]


class StreamWire:
    """Event bytes of one stream (``data: ...\\n\\n``, not yet HTTP-chunked)."""

    __slots__ = ("stream_id", "tokens", "_head", "_usage_head")

    def __init__(self, stream_id: int, tokens: int, model: str = MODEL) -> None:
        self.stream_id = stream_id
        self.tokens = tokens
        common = (
            b'{"id":"chatcmpl-%032x","object":"chat.completion.chunk","created":%d,"model":"%s"'
            % (
                stream_id,
                CREATED,
                model.encode(),
            )
        )
        self._head = b"data: " + common + b',"choices":[{"index":0,"delta":'
        self._usage_head = b"data: " + common + b',"choices":[],"usage":'

    def role(self) -> bytes:
        return (
            self._head
            + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def token(self, k: int) -> bytes:
        if k == self.tokens - 1:
            end = b'},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
        else:
            end = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        return b'%s{"content":%s%s' % (self._head, token_json(self.stream_id, k), end)

    def usage(self, prompt_tokens: int) -> bytes:
        return b'%s{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (
            self._usage_head,
            prompt_tokens,
            prompt_tokens + self.tokens,
            self.tokens,
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


# ------------------------------------------------------------------ the mixed load shape

COMPLETIONS_PATH = "/v1/completions"
ROUTES = (PATH, COMPLETIONS_PATH)
MODELS = ("bench-llama-8b", "bench-qwen-7b", "bench-mistral-7b", "bench-gemma-2b")
_MODEL_WEIGHTS = (4, 3, 2, 1)
MIXED_TOKENS = (20, 800)
NONSTREAM_SHARE = 0.20
COMPLETIONS_SHARE = 0.25
FINGERPRINT = b'"vllm-0.32.0-b3c4d5e6"'
_COMPLETION_NULLS = b',"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n'


class CompletionWire:
    """Event bytes of one ``/v1/completions`` stream in vLLM 0.32's shape
    (tests/fixtures/real/vllm-0.32.0/completions-stream*.sse): no role chunk, one
    ``text_completion`` chunk per token, ``system_fingerprint`` on the finishing chunk, or on
    the usage chunk when the request asked for usage. Same interface as :class:`StreamWire`."""

    __slots__ = ("stream_id", "tokens", "usage_asked", "_head", "_usage_head")

    def __init__(self, stream_id: int, tokens: int, model: str, usage_asked: bool = False) -> None:
        self.stream_id = stream_id
        self.tokens = tokens
        self.usage_asked = usage_asked
        common = b'{"id":"cmpl-%016x","object":"text_completion","created":%d,"model":"%s"' % (
            stream_id,
            CREATED,
            model.encode(),
        )
        self._head = b"data: " + common + b',"choices":[{"index":0,"text":'
        self._usage_head = b"data: " + common + b',"choices":[],"usage":'

    def role(self) -> bytes:
        return b""  # completions have no role chunk

    def token(self, k: int) -> bytes:
        tok = token_json(self.stream_id, k)
        if k < self.tokens - 1:
            return self._head + tok + _COMPLETION_NULLS
        tail = b"}\n\n" if self.usage_asked else b',"system_fingerprint":%s}\n\n' % FINGERPRINT
        return (
            b'%s%s,"logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]%s'
            % (
                self._head,
                tok,
                tail,
            )
        )

    def usage(self, prompt_tokens: int) -> bytes:
        return (
            b'%s{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d},"system_fingerprint":%s}\n\n'
            % (
                self._usage_head,
                prompt_tokens,
                prompt_tokens + self.tokens,
                self.tokens,
                FINGERPRINT,
            )
        )

    @staticmethod
    def done() -> bytes:
        return _DONE

    def client_body(self) -> bytes:
        return b"".join([*(self.token(k) for k in range(self.tokens)), _DONE])


def whole_text(stream_id: int, tokens: int) -> bytes:
    """The JSON string of a whole answer: the same token texts, joined."""
    return b'"%s"' % b"".join(token_json(stream_id, k)[1:-1] for k in range(tokens))


def whole_body(route: str, stream_id: int, tokens: int, model: str) -> bytes:
    """A non-streamed answer, byte for byte as vLLM 0.32's ``model_dump`` writes it
    (tests/fixtures/real/vllm-0.32.0/chat.json and completions.json): every field, nulls
    included, ``usage`` always present."""
    usage = (
        b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,'
        b'"prompt_tokens_details":null,"completion_tokens_details":null}'
        % (PROMPT_TOKENS, PROMPT_TOKENS + tokens, tokens)
    )
    text = whole_text(stream_id, tokens)
    if route == COMPLETIONS_PATH:
        return (
            b'{"id":"cmpl-%016x","object":"text_completion","created":%d,"model":"%s","choices":[{"index":0,'
            b'"text":%s,"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,'
            b'"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,'
            b'"system_fingerprint":%s,%s,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
            % (stream_id, CREATED, model.encode(), text, FINGERPRINT, usage)
        )
    return (
        b'{"id":"chatcmpl-%016x","object":"chat.completion","created":%d,"model":"%s","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":%s,"refusal":null,"annotations":null,"audio":null,'
        b'"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,'
        b'"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":%s,%s,'
        b'"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,'
        b'"ec_transfer_params":null,"metrics":null}'
        % (stream_id, CREATED, model.encode(), text, FINGERPRINT, usage)
    )


class MixedRequest(NamedTuple):
    """One request of the mixed shape: where it goes, what it asks, whether it streams."""

    route: str
    model: str
    tokens: int
    stream: bool

    @property
    def kind(self) -> str:
        return ("completions" if self.route == COMPLETIONS_PATH else "chat") + (
            "_stream" if self.stream else "_whole"
        )

    def events(self) -> int:
        """SSE events the client receives: (role,) tokens, [DONE]; 0 for a JSON body."""
        if not self.stream:
            return 0
        return self.tokens + (1 if self.route == COMPLETIONS_PATH else 2)


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an integer, the same in every
    process (Python's ``hash`` of a string is salted per process)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


# Picked so that even the quick run's first requests (one per connection, 10 connections)
# cover all four kinds and all four models; any seed gives the same proportions at length.
MIXED_SEED = 18


def _uniform(conn: int, seq: int, salt: int) -> float:
    """A number in [0, 1) fixed by (connection, request number, what it decides)."""
    return _mix(_mix(_mix(conn) ^ seq) ^ (salt + (MIXED_SEED << 8))) / 2.0**64


def mixed_request(conn: int, seq: int, token_range: tuple[int, int] = MIXED_TOKENS) -> MixedRequest:
    """Request ``seq`` of connection ``conn`` in the mixed shape (see the module doc)."""
    lo, hi = token_range
    tokens = min(hi, max(lo, round(lo * (hi / lo) ** _uniform(conn, seq, 1))))  # log-uniform
    stream = _uniform(conn, seq, 2) >= NONSTREAM_SHARE
    route = COMPLETIONS_PATH if _uniform(conn, seq, 3) < COMPLETIONS_SHARE else PATH
    pick = _uniform(conn, seq, 4) * sum(_MODEL_WEIGHTS)
    for model, weight in zip(MODELS, _MODEL_WEIGHTS, strict=True):  # noqa: B007
        if pick < weight:
            break
        pick -= weight
    return MixedRequest(route, model, tokens, stream)


def closes_per_request(conn: int) -> bool:
    """Whether connection ``conn`` of the mixed shape opens a new TCP connection for every
    request (``Connection: close``), as clients without a pool do: one in four."""
    return conn % 4 == 3


def mixed_request_bytes(host: str, stream_id: int, req: MixedRequest, close: bool) -> bytes:
    if req.route == COMPLETIONS_PATH:
        body = b'{"model":"%s","prompt":"Write about latency.","stream":%s,"max_tokens":%d}' % (
            req.model.encode(),
            b"true" if req.stream else b"false",
            req.tokens,
        )
    else:
        body = (
            b'{"model":"%s","messages":[{"role":"user","content":"Write about latency."}],'
            b'"stream":%s,"max_tokens":%d}'
            % (req.model.encode(), b"true" if req.stream else b"false", req.tokens)
        )
    return (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s%s: %d\r\n%sContent-Length: %d\r\n\r\n%s"
        % (
            req.route.encode(), host.encode(),
            b"Accept: text/event-stream\r\n" if req.stream else b"Accept: application/json\r\n",
            STREAM_HEADER.encode(), stream_id,
            b"Connection: close\r\n" if close else b"",
            len(body), body,
        )
    )  # fmt: skip


def expected_body(stream_id: int, req: MixedRequest) -> bytes:
    """What the client of a mixed-shape request must receive (it never asks for usage)."""
    if not req.stream:
        return whole_body(req.route, stream_id, req.tokens, req.model)
    if req.route == COMPLETIONS_PATH:
        return CompletionWire(stream_id, req.tokens, req.model).client_body()
    return StreamWire(stream_id, req.tokens, req.model).client_body()
