"""Request timelines scripted by hand, for tests of what is computed from a finished record
(instruments, prompt classes) without a parser or a socket in between."""

from __future__ import annotations

from sidecar.base.outcomes import Outcome
from sidecar.measure.timeline import RequestTimeline
from sidecar.streams.protocols.events import TokenKind, Tokens, Usage

ROUTE = "/v1/chat/completions"


def streamed(
    times: list[float], kinds=None, usage: Usage | None = None, outcome=Outcome.OK, end=None
) -> RequestTimeline:
    """A streamed chat request of model ``m`` started at 100.0 with headers at 100.01, a token
    (of ``kinds[i]``, else an answer token) at each of ``times``, then ``usage`` and the end."""
    t = RequestTimeline(100.0, "POST", ROUTE, "m")
    t.response_started(100.01, 200, streamed=True)
    for i, at in enumerate(times):
        kind = kinds[i] if kinds else TokenKind.ANSWER
        t.events([Tokens(kind)], at)
    if usage:
        t.events([usage], times[-1])
    t.finish(outcome, end if end is not None else times[-1] + 0.001)
    return t


def per_token_gaps(t: RequestTimeline) -> list[float]:
    """``t``'s gaps one per token, its runs (an event of k tokens is one entry standing for k
    gaps) written out: what observing one by one would see. For the small records of tests."""
    runs = dict(t.gap_runs())
    out: list[float] = []
    for i, gap in enumerate(t.gaps):
        out.extend([gap] * runs.get(i, 1))
    return out
