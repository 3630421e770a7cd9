"""A process-wide budget for request bodies held in memory while they arrive.

A known API route's JSON body is read whole before it is forwarded, so its model can label
the figures (:mod:`sidecar.measure.request_fields`). Each body is bounded
(``max_request_inspect_bytes``), but that alone does not bound them together: 16 clients
sending 30 MiB each and withholding the last byte (a byte a minute keeps them alive) would
hold 536 MiB, past the chart's 512Mi limit, and the kubelet would kill every stream in the
pod.

The budget counts the bytes promised to bodies being held. A body whose declared length
does not fit is not refused: it is streamed to the upstream as it arrives (as nginx's
``proxy_request_buffering off`` does), its fields read in flight, so a client under a
flood of others is still served; only what the sidecar holds is bounded.
"""

from __future__ import annotations

__all__ = ["BodyBudget"]


class BodyBudget:
    """Bytes of request bodies that may be held at once, across every connection."""

    __slots__ = ("limit", "held", "overflows")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.overflows = 0  # bodies streamed because they did not fit

    def reserve(self, size: int) -> bool:
        """Promise ``size`` bytes to one body; False (nothing promised) when they do not fit."""
        if self.held + size > self.limit:
            self.overflows += 1
            return False
        self.held += size
        return True

    def release(self, size: int) -> None:
        self.held -= size
