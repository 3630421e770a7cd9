"""How a request ended, as every layer names it: the ``outcome`` label and the error types
that more than one module spells.

An error type is a short snake_case word; it becomes the ``error_type`` span attribute and the
``error.type`` of the OTel metrics, and the ``X-LLM-Sidecar-Error`` header and JSON ``type`` of
the sidecar's own error answers.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Outcome", "STREAM_TRUNCATED", "CLIENT_DISCONNECTED", "UPSTREAM_STATUS", "INTERNAL"]


class Outcome(str, Enum):
    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"


STREAM_TRUNCATED = "upstream_stream_truncated"
"""error_type of a stream that ended cleanly without its protocol's end marker."""

CLIENT_DISCONNECTED = "client_disconnected"
"""error_type of a request whose client went away before the sidecar finished relaying."""

UPSTREAM_STATUS = "upstream_status"
"""error_type of a response the upstream answered with a 5xx status."""

INTERNAL = "internal"
"""error_type of a request the sidecar itself failed (a bug: logged with its traceback)."""
