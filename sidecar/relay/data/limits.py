"""The bounds the relay holds every request and response to, whichever way it is answered."""

from __future__ import annotations

from dataclasses import dataclass

from .client_pace import SEND_TIMEOUT

__all__ = ["RelayLimits", "CLIENT_BODY_TIMEOUT"]

CLIENT_BODY_TIMEOUT = 60.0
"""Idle seconds allowed between two reads of a request body from the client (nginx's
``client_body_timeout`` and its default); past it the request gets 408."""


@dataclass(frozen=True, slots=True)
class RelayLimits:
    """The bounds the proxy holds every request and response to (their settings and why:
    docs/reliability.md; the defaults are the settings' defaults)."""

    max_request_inspect_bytes: int = 32 << 20
    """A known API route's JSON body up to this is read whole to learn its model; larger is streamed."""
    max_request_body_bytes: int = 64 << 20
    """Past this a request body is refused with 413."""
    client_body_timeout: float = CLIENT_BODY_TIMEOUT
    """Idle seconds allowed between two reads of a request body (408 after)."""
    send_timeout: float = SEND_TIMEOUT
    """Seconds a client may take no bytes of a response that waits for it."""
    max_response_inspect_bytes: int = 16 << 20
    """A non-streamed JSON response up to this is read for its usage."""
    max_line_bytes: int | None = None
    """An SSE/NDJSON line past this is not parsed (None: the parser's default)."""
