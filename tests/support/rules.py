"""SLO specs for tests of the rule generator: the shipped default, and one that makes the
generator emit every kind of alert it knows."""

from __future__ import annotations

from sidecar.tools.slo import conventions as c
from sidecar.tools.slo.spec import parse_spec
from tests.support.paths import ROOT

SPEC = ROOT / "deploy" / "slo" / "default.yaml"


def every_alert_spec():
    """A spec that makes the generator emit every kind of alert it knows: one objective per
    SLI kind (the capacity alert follows ITL), a prompt-class objective and a per-model
    override, with history_short on."""
    objectives = [{"name": "availability", "sli": "availability", "target": 99.5}]
    for sli in c.LATENCY_SLIS:
        objectives.append(
            {
                "name": sli,
                "sli": sli,
                "target": 95,
                "threshold_seconds": _threshold(c.LATENCY_SLIS[sli].buckets),
                "models": {"big": {"target": 90}},
            }
        )
    return parse_spec(
        {"version": 1, "objectives": objectives, "alerts": {"history_short": {"enabled": True}}}
    )


def _threshold(buckets: tuple[float, ...]) -> float:
    """1 s where it is a bound; else the default decode objective (ITL, TPOT, under 1 s);
    else the lowest bound above 1 s (e2e)."""
    if 1.0 in buckets:
        return 1.0
    return 0.1 if max(buckets) < 1.0 else min(b for b in buckets if b > 1.0)
