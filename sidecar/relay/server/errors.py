"""The sidecar's own error answers (the body: :mod:`sidecar.base.errors`): as aiohttp responses,
and as whole raw responses for a bare transport before aiohttp has a request."""

from __future__ import annotations

from aiohttp import web

from ...base.errors import ERROR_HEADER, error_body

__all__ = ["error_response", "raw_error_response"]


def error_response(status: int, kind: str, message: str) -> web.Response:
    """An OpenAI-style error body, so SDKs surface a clean message instead of a parse error."""
    return web.Response(
        status=status,
        body=error_body(status, kind, message),
        content_type="application/json",
        headers={ERROR_HEADER: kind},
    )


def raw_error_response(
    status: int,
    reason: str,
    kind: str,
    message: str,
    extra_headers: bytes = b"",
    *,
    keep_alive: bool = False,
) -> bytes:
    """A whole HTTP/1.1 response carrying the sidecar's JSON error body, for the places that
    answer on a bare transport, with no aiohttp response (a connection past the cap, a request
    head past its budget, a request the relay carries: sidecar/relay/data/exchange.py).
    ``Connection: close`` unless ``keep_alive``; ``extra_headers``: complete
    ``Name: value\\r\\n`` lines."""
    body = error_body(status, kind, message)
    return (
        b"HTTP/1.1 %d %b\r\nContent-Type: application/json\r\n%b%b: %b\r\n"
        b"%bContent-Length: %d\r\n\r\n%b"
        % (
            status,
            reason.encode(),
            extra_headers,
            ERROR_HEADER.encode(),
            kind.encode(),
            b"" if keep_alive else b"Connection: close\r\n",
            len(body),
            body,
        )
    )
