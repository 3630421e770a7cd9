"""Structured logs: one JSON line per request, and nothing a user did not ask to reveal.

The request line carries figures and bounded labels only, read from the request's summary
(sidecar/measure/summary.py). Prompts, completions, headers and query strings never reach it:
the timeline does not hold them in the first place.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import FilteringBoundLogger

from ..base.outcomes import Outcome
from ..measure.summary import RequestSummary

__all__ = ["configure_logging", "RequestLogger"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(fmt: str = "json", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog for the process (called once by the CLI, never on import)."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    # Libraries (the OTel SDK, aiohttp) log through stdlib logging: render those lines the
    # same way, so the output stays one JSON object per line.
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(_LEVELS[level], logging.WARNING))
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stdout),
        cache_logger_on_first_use=True,
    )


MAX_REQUESTED_MODEL = 64
"""How much of a model name the request line repeats when the name got no label of its own."""


def requested_model(name: str) -> str:
    """A client's model name for the log: at most :data:`MAX_REQUESTED_MODEL` characters,
    each printable (others become ``?``), ``...`` when cut. A model name is not a prompt,
    but it is the client's text: bounded, so a hostile one cannot flood the log."""
    head = "".join(c if c.isprintable() else "?" for c in name[:MAX_REQUESTED_MODEL])
    return head + "..." if len(name) > MAX_REQUESTED_MODEL else head


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


class RequestLogger:
    """A recorder that writes the per-request line."""

    def __init__(self, logger: FilteringBoundLogger | None = None) -> None:
        self._log = logger or structlog.get_logger("sidecar.request")

    def __call__(self, t: RequestSummary) -> None:
        model_label = t.model_label
        # A failed request is an error line, so level filters and log alerts find it; a
        # client that went away or a 4xx (outcome ok) is routine traffic.
        emit = self._log.error if t.outcome is Outcome.ERROR else self._log.info
        # Filed under other/unknown: also say what was asked (else a 404 for a misspelt
        # model would say only "other").
        asked = (
            {"requested_model": requested_model(t.model)}
            if t.model and t.model != model_label
            else {}
        )
        emit(
            "request",
            method=t.method,
            route=t.route,
            model=model_label,
            status=t.status,
            outcome=t.outcome.value,
            error=None if t.outcome is Outcome.OK else t.error_type,
            # What the request asked: a 502 or a refusal never got a token stream, yet the
            # client asked for one. Without a JSON flag, whether the response was a stream.
            stream=t.streamed if t.request_stream is None else t.request_stream,
            ttfb_ms=_ms(t.ttfb),
            ttft_ms=_ms(t.ttft),
            tpot_ms=_ms(t.tpot),
            duration_ms=_ms(t.e2e),
            input_tokens=t.input_tokens,
            output_tokens=t.output_tokens,
            tokens_source=t.token_count_source.value,
            trace_id=t.trace_id,
            **asked,
        )
