"""The fixed table of API routes: path -> route label (a template) and the name of the
dialect that measures its answers. Anything else is relayed all the same, labelled ``other``.

A fixed table keeps the ``route`` label bounded whatever paths clients send. Only names live
here, at the bottom of the package, so the exporters can list the route labels without
reaching up into the stream parsers; :mod:`sidecar.streams.dialects` maps a name to its
parsers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Route", "match_route", "OTHER", "ROUTES"]


@dataclass(frozen=True, slots=True)
class Route:
    template: str
    operation: str  # gen_ai.operation.name
    dialect: str | None = None  # a name in sidecar.streams.dialects.DIALECTS; None: not measured
    model_from_path: bool = False
    stream_mime: str = "text/event-stream"  # Ollama streams NDJSON instead
    reads_head: bool = False  # the response headers carry timings (TGI's /generate)

    @property
    def measured(self) -> bool:
        return self.dialect is not None


OTHER = Route("other", "other")

ROUTES: dict[str, Route] = {
    r.template: r
    for r in (
        Route("/v1/chat/completions", "chat", "openai"),
        Route("/v1/completions", "text_completion", "openai"),
        Route("/v1/responses", "chat", "responses"),
        Route("/v1/messages", "chat", "anthropic"),
        Route("/generate_stream", "text_completion", "tgi"),
        # TGI's and SGLang's native API both: the dialect tells them apart by SGLang's meta_info.
        Route("/generate", "text_completion", "tgi", reads_head=True),
        # TGI's compat route: huggingface_hub's InferenceClient(model="http://tgi:8080") posts here.
        Route("/", "text_completion", "tgi", reads_head=True),
        Route("/api/chat", "chat", "ollama", stream_mime="application/x-ndjson"),
        Route("/api/generate", "text_completion", "ollama", stream_mime="application/x-ndjson"),
        Route("/completion", "text_completion", "llamacpp"),
        Route(
            "/v2/models/{model}/generate_stream", "text_completion", "triton", model_from_path=True
        ),
    )
}

_TRITON = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/generate_stream$")


def match_route(path: str, method: str = "POST") -> tuple[Route, str | None]:
    """Route for a request path (no query string), and a model named by the path if any.

    Every API route is a POST: any other method on its path (a browser's CORS preflight
    ``OPTIONS``, a load balancer's ``HEAD`` or ``GET`` check, a GET / web page on TGI's
    ``/``) is not an LLM request and is counted apart from them (``llm_non_api_requests_total``).
    """
    if method != "POST":
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
