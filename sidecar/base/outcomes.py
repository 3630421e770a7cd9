"""How a request ended, in the one vocabulary every layer reads: :class:`Verdict`, whose
members carry the ``outcome`` label, the bounded ``error_type`` label of
``llm_requests_total``, the status the sidecar answers with when it answers itself, OTel's
``error.type`` and the alert that names the cause.

The relay gives each request one verdict, once; the timeline may refine it once, from what
the stream said (:func:`refined`); the exporters only read it. An error type is a short
snake_case word; it becomes the ``error_type`` span attribute and the ``error.type`` of the
OTel metrics, and the ``X-LLM-Sidecar-Error`` header and JSON ``type`` of the sidecar's own
error answers.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "Outcome",
    "Verdict",
    "STREAMS_BROKEN_ALERT",
    "UPSTREAM_UNREACHABLE_ALERT",
    "verdict_of",
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

NO_ERROR = "none"
"""``error_type`` of a request with outcome ``ok`` (a 4xx included: its ``code`` says it). A
real value rather than ``""``, which Prometheus reads as "no such label"."""

OTHER_ERROR = "other"
"""``error_type`` of a cause outside the sets above (none today: a guard, so a new cause never
becomes a new, unbounded label value before it is added here)."""


def error_type_label(outcome: Outcome | None, error_type: str | None) -> str:
    """The bounded ``error_type`` label value of a finished request."""
    return verdict_of(outcome or Outcome.ERROR, error_type).error_type


UPSTREAM_UNREACHABLE_ALERT = "LLMUpstreamUnreachable"
STREAMS_BROKEN_ALERT = "LLMStreamsBroken"


class Verdict(Enum):
    """How one request ended. Each member: ``outcome``; ``error_type`` (the label value,
    ``none`` when ok); ``answer_status``, the status of the sidecar's own answer when the
    verdict is reached before any upstream head (502, 504, 500), None when it never answers
    itself (the client got the upstream's status, or nothing); ``alert``, the
    error-cause alert that names it (sidecar/tools/slo/rules.py's ``ERROR_CAUSES``), None when
    only the availability burn rate counts it or it is not an error."""

    OK = (Outcome.OK, NO_ERROR, None, None)
    # outcome error: no connection (refused, DNS, TLS); no head in time; the server closed
    # the connection (before the head, or mid-body); the body stalled past the read timeout;
    # the server broke HTTP/1.1 framing; it answered 5xx (the code label says which); a 2xx
    # stream ended cleanly before it was complete; an error object inside a 2xx answer; the
    # sidecar's own failure. Outcome cancelled: the client left, or stopped reading.
    UPSTREAM_UNREACHABLE = (Outcome.ERROR, "upstream_unreachable", 502, UPSTREAM_UNREACHABLE_ALERT)
    UPSTREAM_TIMEOUT = (Outcome.ERROR, "upstream_timeout", 504, UPSTREAM_UNREACHABLE_ALERT)
    UPSTREAM_DISCONNECTED = (Outcome.ERROR, "upstream_disconnected", 502, STREAMS_BROKEN_ALERT)
    UPSTREAM_READ_TIMEOUT = (Outcome.ERROR, "upstream_read_timeout", None, STREAMS_BROKEN_ALERT)
    UPSTREAM_INVALID_RESPONSE = (
        Outcome.ERROR, "upstream_invalid_response", 502, STREAMS_BROKEN_ALERT
    )  # fmt: skip
    UPSTREAM_STATUS = (Outcome.ERROR, "upstream_status", None, None)
    STREAM_TRUNCATED = (Outcome.ERROR, "upstream_stream_truncated", None, STREAMS_BROKEN_ALERT)
    STREAM_ERROR = (Outcome.ERROR, "stream_error", None, STREAMS_BROKEN_ALERT)
    INTERNAL = (Outcome.ERROR, "internal", 500, None)
    CLIENT_DISCONNECTED = (Outcome.CANCELLED, "client_disconnected", None, None)
    CLIENT_SEND_TIMEOUT = (Outcome.CANCELLED, "client_send_timeout", None, None)
    OTHER_ERROR = (Outcome.ERROR, "other", 500, None)
    OTHER_CANCEL = (Outcome.CANCELLED, "other", None, None)

    def __init__(
        self, outcome: Outcome, error_type: str, answer_status: int | None, alert: str | None
    ) -> None:
        self.outcome = outcome
        self.error_type = error_type
        self.answer_status = answer_status
        self.alert = alert

    def code(self, status: int | None) -> str:
        """The ``code`` label: the status the client got; with none, nginx's 499 for a client
        that left, else 500."""
        if status is not None:
            return str(status)
        return "499" if self.outcome is Outcome.CANCELLED else "500"

    def otel_error_type(self, status: int | None) -> str | None:
        """OTel's ``error.type``: the HTTP status as a string for an upstream's 5xx (and, as
        HTTP client spans do, a 4xx answered ok), else the error type; None when the request
        did not end in an error (a cancel is the client's doing: ``llm_sidecar.cancelled``)."""
        if self.outcome is Outcome.ERROR:
            if self is Verdict.UPSTREAM_STATUS and status is not None:
                return str(status)
            return "_OTHER" if self is Verdict.OTHER_ERROR else self.error_type  # semconv's own
        if self.outcome is Outcome.OK and status is not None and status >= 400:
            return str(status)
        return None


ERROR_TYPES: tuple[str, ...] = tuple(
    v.error_type for v in Verdict if v.outcome is Outcome.ERROR and v is not Verdict.OTHER_ERROR
)
"""Why a request ended with outcome ``error``: the error rows of :class:`Verdict`."""

CANCEL_TYPES: tuple[str, ...] = tuple(
    v.error_type
    for v in Verdict
    if v.outcome is Outcome.CANCELLED and v is not Verdict.OTHER_CANCEL
)
"""Why a request ended with outcome ``cancelled``: the client left, or stopped reading."""

ERROR_TYPE_LABELS: frozenset[str] = frozenset(v.error_type for v in Verdict)
"""Every value the ``error_type`` label can take: 13 (9 errors, 2 cancellations, `none`, `other`)."""

_BY_PAIR: dict[tuple[Outcome, str], Verdict] = {(v.outcome, v.error_type): v for v in Verdict}


def verdict_of(outcome: Outcome, error_type: str | None) -> Verdict:
    """The member for an outcome and the error type the relay or the upstream pool named;
    a cause outside the set is ``other`` (a guard: a new cause never becomes a new, unbounded
    label value before it is added here)."""
    if outcome is Outcome.OK:
        return Verdict.OK
    found = _BY_PAIR.get((outcome, error_type or ""))
    if found is not None:
        return found
    return Verdict.OTHER_CANCEL if outcome is Outcome.CANCELLED else Verdict.OTHER_ERROR


# The words are the constants above (the members spell them out: an Enum's body would read a
# member's name, not the constant, once it is defined).
assert {
    STREAM_TRUNCATED, STREAM_ERROR, CLIENT_DISCONNECTED, CLIENT_SEND_TIMEOUT, UPSTREAM_STATUS,
    INTERNAL, NO_ERROR, OTHER_ERROR,
} <= ERROR_TYPE_LABELS  # fmt: skip
