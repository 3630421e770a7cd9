"""The sidecar's own error answers as aiohttp responses (the body: :mod:`sidecar.base.errors`)."""

from __future__ import annotations

from aiohttp import web

from ..base.errors import ERROR_HEADER, error_body

__all__ = ["error_response"]


def error_response(status: int, kind: str, message: str) -> web.Response:
    """An OpenAI-style error body, so SDKs surface a clean message instead of a parse error."""
    return web.Response(
        status=status,
        body=error_body(status, kind, message),
        content_type="application/json",
        headers={ERROR_HEADER: kind},
    )
