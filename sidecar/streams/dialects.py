"""Dialect name (a route's ``dialect`` in :mod:`sidecar.base.routes`) -> its parsers.

The route table names dialects; this module is where a name becomes code: the sans-I/O stream
reader for an SSE/NDJSON answer, the parser of a whole JSON answer, and the reader of timing
headers where the server sends them (TGI).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..base.routes import Route
from .protocols.anthropic import AnthropicStreamDialect, parse_anthropic_response
from .protocols.events import DialectEvent
from .protocols.llamacpp import LlamaCppStreamDialect, parse_llamacpp_response
from .protocols.ollama import OllamaStreamDialect, parse_ollama_response
from .protocols.openai import OpenAIStreamDialect, parse_openai_response
from .protocols.responses import ResponsesStreamDialect, parse_responses_response
from .protocols.tgi import TGIStreamDialect, parse_tgi_response, tgi_head_events
from .protocols.triton import TritonStreamDialect, parse_triton_response

__all__ = ["Dialect", "DIALECTS", "StreamDialect", "dialect_of"]


class StreamDialect(Protocol):
    """One response's stream reader: SSE/NDJSON bytes -> events, sans I/O."""

    def feed(self, chunk: bytes) -> list[DialectEvent]: ...

    def close(self) -> list[DialectEvent]: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    stream: Callable[..., StreamDialect]  # a class: one reader per response
    json: Callable[[bytes], list[DialectEvent]]  # a whole JSON response -> events
    # Response headers -> events (TGI's timings).
    head: Callable[[Mapping[str, str]], list[DialectEvent]] | None = None


DIALECTS: dict[str, Dialect] = {
    "openai": Dialect(OpenAIStreamDialect, parse_openai_response),
    "responses": Dialect(ResponsesStreamDialect, parse_responses_response),
    "anthropic": Dialect(AnthropicStreamDialect, parse_anthropic_response),
    "tgi": Dialect(TGIStreamDialect, parse_tgi_response, tgi_head_events),
    "ollama": Dialect(OllamaStreamDialect, parse_ollama_response),
    "llamacpp": Dialect(LlamaCppStreamDialect, parse_llamacpp_response),
    "triton": Dialect(TritonStreamDialect, parse_triton_response),
}


def dialect_of(route: Route) -> Dialect | None:
    """The parsers of a route's answers; None for a route that is relayed unmeasured."""
    return None if route.dialect is None else DIALECTS[route.dialect]
