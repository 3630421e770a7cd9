"""The stalled-streams alert: a hung engine, generated from the same spec as the SLO rules and
summed by its ``grouping`` (and so, in the chart, per release).

An inference server can hang without failing: its API process answers ``/health`` and
``/metrics``, the engine reports requests running, and no token comes. Every latency SLI
is observed when a request ends, so the burn-rate alerts stay silent until the read timeout
turns each stuck stream into an error. The sidecar reads its open streams at scrape time
(``llm_streams_stalled``: no byte for ``--stall-seconds``), and this alert fires when a pod
has stalled streams *and* answered no request whole (``outcome="ok"``, a 2xx) within the
spec's ``window``:

- a pod whose engine is only busy (a stream queued behind a long batch passes the
  threshold too) keeps completing requests, so it never fires;
- a slow but moving stream, or a long prefill under the threshold, is never stalled;
- an idle pod exports no ``llm_streams_stalled`` series at all.

It is per pod (``instance``, the scrape target, with the grouping labels for routing): one
hung engine among healthy replicas is a restart, not a degraded release. A pod that never
completed a request has no counter series to suppress it, and fires: its streams have
stalled since it started.
"""

from __future__ import annotations

from . import conventions as c
from .promql import Group, Rule, selector, spec_matchers
from .rules import _who
from .spec import SLOSpec
from .windows import format_duration

__all__ = ["ALERT_STREAMS_STALLED", "STALL_GROUP", "STALLED", "stall_group"]

ALERT_STREAMS_STALLED = "LLMStreamsStalled"
STALL_GROUP = "llm-sidecar-stalls"
STALLED = "llm_streams_stalled"
_POD = "instance"


def stall_group(spec: SLOSpec) -> Group | None:
    """The group holding the alert, or None when the spec turns it off."""
    alert = spec.alerts.streams_stalled
    if not alert.enabled:
        return None
    sel = spec_matchers(spec)
    by = [*spec.grouping, *((_POD,) if _POD not in spec.grouping else ())]
    pod = [label for label in by if label != c.LABEL_MODEL]
    window = format_duration(alert.window)
    stalled = f"sum by ({', '.join(by)}) ({selector(STALLED, sel)}) > 0"
    completed = selector(c.REQUESTS_TOTAL, [("outcome", "=", "ok"), ("code", "=~", "2.."), *sel])
    answered = f"sum by ({', '.join(pod)}) (increase({completed}[{window}])) > 0"
    who = _who(spec.grouping)
    rule = Rule(
        f"{stalled} unless on ({', '.join(pod)}) {answered}",
        alert=ALERT_STREAMS_STALLED,
        for_=alert.for_,
        labels={c.LABEL_SEVERITY: alert.severity},
        annotations={
            "summary": f"{who} on {{{{ $labels.instance }}}}: {{{{ $value }}}} streams stalled, none completed",
            "description": (
                f"{{{{ $value }}}} streams of {who} on {{{{ $labels.instance }}}} have had no byte "
                "from the model server for at least the sidecar's --stall-seconds, and the pod "
                f"answered no request whole in the last {window} (for {format_duration(alert.for_)}). "
                "The engine looks hung: its /health may still say 200. Its clients wait until the "
                "sidecar's read timeout ends each stream as an error."
            ),
            "runbook_url": f"{spec.alerts.runbook_url}#{c.runbook_anchor(ALERT_STREAMS_STALLED)}",
        },
    )
    return Group(STALL_GROUP, (rule,))
