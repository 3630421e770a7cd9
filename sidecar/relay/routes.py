"""The fixed table of API routes: path -> route label (a template) and the dialect that
measures its stream. Anything else is relayed all the same, labelled ``other``.

A fixed table keeps the ``route`` label bounded whatever paths clients send.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..streams.protocols.anthropic import AnthropicStreamDialect, parse_anthropic_response
from ..streams.protocols.llamacpp import LlamaCppStreamDialect, parse_llamacpp_response
from ..streams.protocols.ollama import OllamaStreamDialect, parse_ollama_response
from ..streams.protocols.openai import OpenAIStreamDialect, parse_openai_response
from ..streams.protocols.responses import ResponsesStreamDialect, parse_responses_response
from ..streams.protocols.tgi import TGIStreamDialect, parse_tgi_response, tgi_head_events
from ..streams.protocols.triton import TritonStreamDialect, parse_triton_response

__all__ = ["Route", "match_route", "OTHER", "ROUTES"]


@dataclass(frozen=True, slots=True)
class Route:
    template: str
    operation: str  # gen_ai.operation.name
    stream_dialect: Callable[..., object] | None = None  # SSE/NDJSON bytes -> events
    json_parser: Callable[[bytes], list] | None = None  # whole JSON response -> events
    model_from_path: bool = False
    stream_mime: str = "text/event-stream"  # Ollama streams NDJSON instead
    head_parser: Callable[..., list] | None = None  # response headers -> events (TGI's timings)

    @property
    def measured(self) -> bool:
        return self.stream_dialect is not None or self.json_parser is not None


OTHER = Route("other", "other")

ROUTES: dict[str, Route] = {
    r.template: r
    for r in (
        Route("/v1/chat/completions", "chat", OpenAIStreamDialect, parse_openai_response),
        Route("/v1/completions", "text_completion", OpenAIStreamDialect, parse_openai_response),
        Route("/v1/responses", "chat", ResponsesStreamDialect, parse_responses_response),
        Route("/v1/messages", "chat", AnthropicStreamDialect, parse_anthropic_response),
        Route("/generate_stream", "text_completion", TGIStreamDialect, parse_tgi_response),
        # TGI's and SGLang's native API both: the dialect tells them apart by SGLang's meta_info.
        Route("/generate", "text_completion", TGIStreamDialect, parse_tgi_response, head_parser=tgi_head_events),
        # TGI's compat route: huggingface_hub's InferenceClient(model="http://tgi:8080") posts here.
        Route("/", "text_completion", TGIStreamDialect, parse_tgi_response, head_parser=tgi_head_events),
        Route("/api/chat", "chat", OllamaStreamDialect, parse_ollama_response, stream_mime="application/x-ndjson"),
        Route("/api/generate", "text_completion", OllamaStreamDialect, parse_ollama_response, stream_mime="application/x-ndjson"),
        Route("/completion", "text_completion", LlamaCppStreamDialect, parse_llamacpp_response),
        Route(
            "/v2/models/{model}/generate_stream", "text_completion", TritonStreamDialect, parse_triton_response,
            model_from_path=True,
        ),
    )
}

_TRITON = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/generate_stream$")


def match_route(path: str, method: str = "POST") -> tuple[Route, str | None]:
    """Route for a request path (no query string), and a model named by the path if any.

    ``/`` is an API route (TGI's) only for POST: a GET / is a health check or a web page.
    """
    if path == "/" and method != "POST":
        return OTHER, None
    route = ROUTES.get(path)
    if route is None and len(path) > 1 and path.endswith("/"):
        route = ROUTES.get(path.rstrip("/"))
    if route is not None:
        return route, None
    m = _TRITON.match(path)
    if m:
        return ROUTES["/v2/models/{model}/generate_stream"], m.group(1)
    return OTHER, None
