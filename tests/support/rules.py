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
                # 1 s, or the default decode objective where 1 s is not a bound (ITL, TPOT).
                "threshold_seconds": 1.0 if 1.0 in c.LATENCY_SLIS[sli].buckets else 0.1,
                "models": {"big": {"target": 90}},
            }
        )
    return parse_spec(
        {"version": 1, "objectives": objectives, "alerts": {"history_short": {"enabled": True}}}
    )
