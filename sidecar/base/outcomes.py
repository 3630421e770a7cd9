"""How a request ended, as every layer names it: the ``outcome`` label, the error types that
more than one module spells, and the bounded ``error_type`` label of ``llm_requests_total``.

An error type is a short snake_case word; it becomes the ``error_type`` span attribute and the
``error.type`` of the OTel metrics, and the ``X-LLM-Sidecar-Error`` header and JSON ``type`` of
the sidecar's own error answers.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "Outcome",
    "STREAM_TRUNCATED",
    "STREAM_ERROR",
    "CLIENT_DISCONNECTED",
    "CLIENT_SEND_TIMEOUT",
    "UPSTREAM_STATUS",
    "INTERNAL",
    "ERROR_TYPES",
    "CANCEL_TYPES",
    "NO_ERROR",
    "OTHER_ERROR",
    "ERROR_TYPE_LABELS",
    "error_type_label",
]


class Outcome(str, Enum):
    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"


STREAM_TRUNCATED = "upstream_stream_truncated"
"""error_type of a stream that ended cleanly without its protocol's end marker."""

STREAM_ERROR = "stream_error"
"""error_type of a 2xx answer that carried an error object (an error event inside a stream)."""

CLIENT_DISCONNECTED = "client_disconnected"
"""error_type of a request whose client went away before the sidecar finished relaying."""

CLIENT_SEND_TIMEOUT = "client_send_timeout"
"""error_type of a request whose client stopped reading for ``--send-timeout`` (cancelled)."""

UPSTREAM_STATUS = "upstream_status"
"""error_type of a response the upstream answered with a 5xx status."""

INTERNAL = "internal"
"""error_type of a request the sidecar itself failed (a bug: logged with its traceback)."""

ERROR_TYPES: tuple[str, ...] = (
    "upstream_unreachable",  # no connection: refused, DNS, TLS (502)
    "upstream_timeout",  # no response head in time (504)
    "upstream_disconnected",  # the server closed the connection (before the head, or mid-body)
    "upstream_read_timeout",  # the body stalled past the read timeout
    "upstream_invalid_response",  # the server broke HTTP/1.1 framing
    UPSTREAM_STATUS,  # the server answered 5xx (the code label says which)
    STREAM_TRUNCATED,  # a 2xx stream ended cleanly before it was complete
    STREAM_ERROR,  # an error object inside a 2xx answer
    INTERNAL,  # the sidecar's own failure
)
"""Why a request ended with outcome ``error``: the whole set the relay and the timeline give
(sidecar/relay/data/upstream.py, sidecar/relay/data/proxy.py, sidecar/measure/timeline.py)."""

CANCEL_TYPES: tuple[str, ...] = (CLIENT_DISCONNECTED, CLIENT_SEND_TIMEOUT)
"""Why a request ended with outcome ``cancelled``: the client left, or stopped reading."""

NO_ERROR = "none"
"""``error_type`` of a request with outcome ``ok`` (a 4xx included: its ``code`` says it). A
real value rather than ``""``, which Prometheus reads as "no such label"."""

OTHER_ERROR = "other"
"""``error_type`` of a cause outside the sets above (none today: a guard, so a new cause never
becomes a new, unbounded label value before it is added here)."""

ERROR_TYPE_LABELS: frozenset[str] = frozenset((*ERROR_TYPES, *CANCEL_TYPES, NO_ERROR, OTHER_ERROR))
"""Every value the ``error_type`` label can take: 13 (9 errors, 2 cancellations, `none`, `other`)."""


def error_type_label(outcome: Outcome | None, error_type: str | None) -> str:
    """The bounded ``error_type`` label value of a finished request."""
    if outcome is Outcome.OK:
        return NO_ERROR
    allowed = CANCEL_TYPES if outcome is Outcome.CANCELLED else ERROR_TYPES
    return error_type if error_type in allowed else OTHER_ERROR
