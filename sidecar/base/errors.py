"""The sidecar's own error answers: an OpenAI-style JSON body, so SDKs surface a clean
message instead of a parse error, and a header that tells them from the upstream's errors."""

from __future__ import annotations

import orjson

__all__ = ["ERROR_HEADER", "error_body"]

ERROR_HEADER = "X-LLM-Sidecar-Error"
"""Names the error type on every answer the sidecar gives itself (never on relayed ones)."""


def error_body(status: int, kind: str, message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "code": status}})
