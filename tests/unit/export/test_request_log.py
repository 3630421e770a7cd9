"""The per-request log line: failed requests at level error, routine traffic at info."""

from __future__ import annotations

import pytest
import structlog

from sidecar.base.outcomes import Outcome
from sidecar.export.logs import RequestLogger
from sidecar.measure.summary import summarize
from sidecar.measure.timeline import RequestTimeline


def finished(
    status: int | None, outcome: Outcome, error_type: str | None = None
) -> RequestTimeline:
    t = RequestTimeline(0.0, "POST", "/v1/chat/completions", "m")
    if status is not None:
        t.response_started(0.1, status, streamed=False)
    t.finish(outcome, 0.2, error_type)
    return t


@pytest.mark.parametrize(
    "status,outcome,error_type,level",
    [
        (200, Outcome.OK, None, "info"),
        (429, Outcome.OK, None, "info"),  # a client error the server answered: routine
        (None, Outcome.CANCELLED, "client_disconnected", "info"),
        (503, Outcome.ERROR, "upstream_status", "error"),
        (None, Outcome.ERROR, "upstream_unreachable", "error"),
        (200, Outcome.ERROR, "upstream_stream_truncated", "error"),
    ],
)
def test_level_follows_outcome(status, outcome, error_type, level):
    with structlog.testing.capture_logs() as logs:
        RequestLogger()(summarize(finished(status, outcome, error_type), "m"))
    (line,) = logs
    assert (line["log_level"], line["outcome"], line["error"]) == (level, outcome.value, error_type)
    assert line["tokens_source"] == "none"
