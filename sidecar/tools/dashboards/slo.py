"""The SLO dashboard, generated from the same spec as the rules so the two always agree.

It reads the recording rules ``sidecar.tools.slo`` renders (``llm:sli_error:ratio_rate<W>``,
``llm:burn_rate:ratio_rate<W>``, ``llm:error_budget_remaining:ratio``, ``llm:goodput:*``) and
the ``ALERTS`` series of the alerting rules. Targets, thresholds, windows and burn-rate
factors are computed from the spec with the functions the rules use, never typed in.
Recorded series are per ``model`` (summed over pods and routes, as the alerts see them); the
per-pod breakdown at the end of each objective reads the raw metrics instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dash_m
from prometheus_client.utils import floatToGoString

from ..slo import conventions as c
from ..slo.capacity import ALERT_NEAR_CAPACITY, capacity_objective
from ..slo.helm import SEVERITIES as CHART_SEVERITIES
from ..slo.rules import ERROR_CAUSES, objective_text
from ..slo.spec import Objective, Scope, SLOSpec
from ..slo.stall import ALERT_STREAMS_STALLED
from ..slo.windows import AlertWindow, burn_rate_factor, format_duration, format_number
from .capacity import capacity_row
from .panels import (
    Board,
    Query,
    bargauge_panel,
    dashed_threshold_lines,
    ref_id,
    stat_panel,
    table_panel,
    thresholds,
    timeseries_panel,
)
from .queries import (
    FILTER_LABELS,
    POD_LINES,
    Matcher,
    ratio_or_zero,
    raw_sum_rate,
    recorded,
    sum_rate,
    top_pods,
)

__all__ = ["UID", "TITLE", "BURN_RATE_UNIT", "alert_names", "build"]

UID = "llm-sidecar-slo"
TITLE = "LLM sidecar / SLOs"
BURN_RATE_UNIT = "suffix:×"

SEVERITIES = ("page", "ticket", "info")
OBJECTIVES = "llm_request_objectives_total"
BREAKDOWN_BY = ("namespace", "pod", "route", "model")


def alert_names(spec: SLOSpec) -> list[str]:
    """Every alert the rules rendered from ``spec`` can raise."""
    names = [
        *(c.alert_name(o.name) for o in spec.objectives),
        c.ALERT_TARGET_DOWN,
        c.ALERT_NO_TRAFFIC,
    ]
    names += [cause.alert for cause in ERROR_CAUSES]  # by error_type
    if spec.alerts.history_short.enabled:
        names.append(c.ALERT_HISTORY_SHORT)
    if capacity_objective(spec) is not None:
        names.append(ALERT_NEAR_CAPACITY)
    if spec.alerts.streams_stalled.enabled:
        names.append(ALERT_STREAMS_STALLED)
    return names


def _rec(spec: SLOSpec, record: str, extra: Sequence[Matcher] = ()) -> str:
    """A recorded series of the spec's rules, filtered by the grouping variables."""
    return recorded(record, extra, spec.grouping)


def _objectives_met(spec: SLOSpec) -> str:
    """The share of judged requests that met their own objectives, per grouping, release and
    objective, from the raw counter over the rate window (a detail view: READ_WHEN_DRAWN):
    the lowest :data:`POD_LINES` at each step, as a fleet has a line per release and model."""
    release = () if "llm_release" in spec.grouping else ("llm_release",)
    by = (*spec.grouping, *release, "objective")
    met = sum_rate(OBJECTIVES, by, [("result", "=", "met")])
    return f"bottomk({POD_LINES}, {ratio_or_zero(met, sum_rate(OBJECTIVES, by))})"


def _who(spec: SLOSpec) -> str:
    """Legend naming a deployment: its grouping labels (``{{cluster}} {{namespace}} {{model}}``),
    the model last, so a per-model override can match the name's end."""
    labels = [label for label in spec.grouping if label != c.LABEL_MODEL] + [c.LABEL_MODEL]
    return " ".join(f"{{{{{label}}}}}" for label in labels)


def _alerts_selector(spec: SLOSpec, severity: str | None = None) -> str:
    """Firing alerts of the spec's rules. ``label=~"$label|"``: those of the selected
    deployments (grouping variables), and the health alerts, which lack some labels."""
    names = "|".join(alert_names(spec))
    # The spec's severity, or the one the Helm chart maps it to (page -> critical, ...).
    names_of = sorted({severity, CHART_SEVERITIES.get(severity, severity)}) if severity else []
    extra = f', severity=~"{"|".join(names_of)}"' if severity else ""
    labels = [label for label in spec.grouping if label in FILTER_LABELS]
    labels += ["llm_release"] if "llm_release" not in labels else []  # the chart's rules carry it
    groups = "".join(f', {label}=~"${label}|"' for label in labels)
    return f'ALERTS{{alertstate="firing", alertname=~"{names}"{groups}{extra}}}'


def _scope_matchers(scope: Scope) -> list[Matcher]:
    """The model matchers the rules give this scope (an override, or every other model)."""
    if scope.model is not None:
        return [(c.LABEL_MODEL, "=", scope.model)]
    return [(c.LABEL_MODEL, "!=", m) for m in scope.excluded]


def _slo(name: str) -> tuple[Matcher, ...]:
    return ((c.LABEL_SLO, "=", name),)


def _pct(target: float) -> float:
    """A percentage target as the ratio Grafana's percentunit shows (99.5 -> 0.995)."""
    return float(format_number(target / 100))


def _overrides_text(scopes: Sequence[Scope]) -> str:
    parts = [f"model {s.model}: {objective_text(s)}" for s in scopes[1:]]
    return (" Per-model overrides: " + "; ".join(parts) + ".") if parts else ""


# --------------------------------------------------------------------------- top row


def _summary(board: Board, spec: SLOSpec) -> None:
    board.row("Now: alerts, error budgets, goodput")
    board.add(
        stat_panel(
            "Alerts firing",
            "Firing llm-sidecar alerts by severity (the ALERTS series Prometheus writes for the "
            "rules rendered from the SLO spec): burn-rate alerts of the selected deployments, plus "
            "LLMSidecarDown and LLMNoTrafficData, and the error causes by error_type "
            "(LLMUpstreamUnreachable, LLMStreamsBroken). page: act now; ticket: within working hours; "
            "info: LLMSLOHistoryShort, the error budget covers less than the period (a young "
            "deployment, or Prometheus keeps too little history: see Retention in docs/slo.md). "
            "The Helm chart's critical and warning count as page and ticket.",
            [
                Query(f"count({_alerts_selector(spec, severity)}) or on () vector(0)", severity)
                for severity in SEVERITIES
            ],
            "short",
            w=4,
            h=8,
            steps=((None, "green"), (1, "red")),
        ),
        table_panel(
            "Firing alerts",
            "One line per firing alert with its labels: slo and model say which objective is "
            "burning, long_window and short_window which arm fired (both windows burned faster "
            "than its factor). Empty when nothing fires. Each alert's runbook_url annotation "
            "links to its section of docs/runbooks.md (the runbooks shipped with llm-sidecar).",
            Query(_alerts_selector(spec)),
            "short",
            w=10,
            h=8,
        ),
        bargauge_panel(
            f"Error budget remaining ({spec.period_name})",
            f"Every objective and model: 1 - (bad-event share over the last {spec.period_name}) / "
            "(error budget, 1 - target), from llm:error_budget_remaining:ratio. 100% = untouched, "
            "0 = spent, below 0 = overspent (the bar is empty, the number says by how much).",
            [Query(_rec(spec, c.ERROR_BUDGET_REMAINING), f"{{{{slo}}}} · {_who(spec)}")],
            "percentunit",
            w=10,
            h=8,
            steps=((None, "red"), (0, "orange"), (0.25, "green")),
            min_val=0,
            max_val=1,
        ),
        timeseries_panel(
            "Goodput share (5m)",
            "Share of ok requests that met every latency objective at once (the sidecar's "
            "--slo-ttft-seconds, --slo-tpot-seconds, --slo-e2e-seconds), per model, over 5 minutes: "
            "llm:goodput:ratio_rate5m. Keep those settings in line with the spec's thresholds.",
            [Query(_rec(spec, c.GOODPUT_RATIO), _who(spec))],
            "percentunit",
        ),
        timeseries_panel(
            "Goodput (5m)",
            "Requests per second that met every latency objective at once, per model, over 5 "
            "minutes: llm:goodput:rate5m.",
            [Query(_rec(spec, c.GOODPUT_RATE), _who(spec))],
            "reqps",
        ),
        timeseries_panel(
            f"Requests' own objectives met (the {POD_LINES} lowest)",
            "Share of streamed requests that met the objectives they asked for: the x-slo-ttft-ms "
            "and x-slo-tpot-ms headers (llm-d's per-request objectives), else the model's "
            "defaults (--slo-model-objectives, else --slo-ttft-seconds / --slo-tpot-seconds). "
            "all: ok, 2xx and every judged objective met (goodput against what each client asked "
            "for); ttft and tpot apart. Per release and model, the lowest shares at each step "
            f"(at most {POD_LINES} lines in a fleet); pick a release or model to see it. Read from "
            "llm_request_objectives_total when drawn (no alert reads it, so no rule records it).",
            [Query(_objectives_met(spec), f"{{{{objective}}}} · {_who(spec)} {{{{llm_release}}}}")],
            "percentunit",
            w=24,
        ),
    )


# ----------------------------------------------------------------------- per objective


def _target_overrides(
    scopes: Sequence[Scope], default_target: float
) -> list[dash_m.DashboardFieldConfigSourceOverrides]:
    out = []
    for scope in scopes[1:]:
        if scope.target == default_target:
            continue
        out.append(
            dash_m.DashboardFieldConfigSourceOverrides(
                # The legend ends with the model (see _who): match the name's end.
                matcher=dash_m.MatcherConfig(
                    id_val="byRegexp", options=f"^(.* )?{re.escape(scope.model or '')}$"
                ),
                properties=[
                    dash_m.DynamicConfigValue(
                        id_val="thresholds",
                        value=thresholds((None, "red"), (_pct(scope.target), "green")).build(),
                    )
                ],
            )
        )
    return out


def _burn_panel(spec: SLOSpec, name: str, arm: AlertWindow, period_text: str) -> timeseries.Panel:
    factor = float(format_number(burn_rate_factor(arm, spec.period)))
    spent = format_number(arm.budget_consumed * 100)
    panel = timeseries_panel(
        f"{name}: burn rate {arm.long_name} / {arm.short_name} ({arm.severity} above {format_number(factor)}×)",
        f"How fast the error budget is being spent over the {arm.long_name} and {arm.short_name} "
        f"windows (llm:burn_rate:ratio_rate{arm.long_name} and ..._rate{arm.short_name}): the "
        f"bad-event share divided by the error budget. 1× spends exactly the budget over "
        f"{period_text}. The {arm.severity} alert {c.alert_name(name)} fires when both lines are "
        f"above the dashed threshold {format_number(factor)}× ({spent}% of the budget gone in "
        f"{arm.long_name}; factor = {spent}% × {period_text} / {arm.long_name}).",
        [
            Query(
                _rec(spec, c.burn_rate_record(arm.long), _slo(name)),
                f"{_who(spec)} {arm.long_name}",
            ),
            Query(
                _rec(spec, c.burn_rate_record(arm.short), _slo(name)),
                f"{_who(spec)} {arm.short_name}",
            ),
        ],
        BURN_RATE_UNIT,
        w=6,
        h=7,
    )
    return dashed_threshold_lines(panel, ((None, "green"), (factor, "red")))


def _breakdown_query(scope: Scope) -> str:
    """Bad-event share by pod, route and model over $__rate_interval, from the raw metrics,
    with the same good/bad split as the rule's SLI: a drill-down, so only the top pods."""
    by: tuple[str, ...] = BREAKDOWN_BY
    sm = _scope_matchers(scope)
    sli = scope.objective.sli
    if sli == "availability":
        bad = raw_sum_rate(c.REQUESTS_TOTAL, by, [("outcome", "=", "error"), *sm])
        total = raw_sum_rate(c.REQUESTS_TOTAL, by, [("outcome", "!=", "cancelled"), *sm])
        return top_pods(ratio_or_zero(bad, total))
    latency = c.latency_sli(sli, scope.objective.cache_class)
    base = [(k, "=", v) for k, v in latency.matchers] + sm
    # The bucket bound as the sidecar and the rules write it (unannotated in prometheus_client).
    le: str = floatToGoString(scope.threshold)  # type: ignore[no-untyped-call]
    # Histograms are per model, not per route: neither grouped nor filtered by it.
    by = tuple(label for label in by if label != "route")
    labels = tuple(label for label in FILTER_LABELS if label != "route")
    total = raw_sum_rate(f"{latency.histogram}_count", by, base, labels)
    good = raw_sum_rate(f"{latency.histogram}_bucket", by, [*base, ("le", "=", le)], labels)
    return top_pods(f"({total} - {good}) / {total}")


def _objective(board: Board, spec: SLOSpec, objective: Objective) -> None:
    name = objective.name
    scopes = spec.scopes(objective)
    default = scopes[0]
    period = spec.period_name
    target_text = f"{format_number(default.target)}%"
    overrides = _overrides_text(scopes)
    sel = _slo(name)
    more = (
        f" ({len(scopes) - 1} per-model override{'s' if len(scopes) > 2 else ''})"
        if len(scopes) > 1
        else ""
    )
    board.row(f"SLO {name}: {objective_text(default)}, over {period}{more}")

    sli_stat = stat_panel(
        f"{name}: SLI over {period}",
        f"Share of good events over the last {period} (1 - llm:sli_error:ratio_rate{period}) per "
        f"model, against the target {target_text}: green at or above it, red below.{overrides}",
        [Query(f"1 - {_rec(spec, c.sli_error_record(spec.period), sel)}", _who(spec))],
        "percentunit",
        w=4,
        h=7,
        steps=((None, "red"), (_pct(default.target), "green")),
        decimals=3,
    ).overrides(_wrap(_target_overrides(scopes, default.target)))

    budget_stat = stat_panel(
        f"{name}: error budget remaining",
        f"1 - (bad-event share over {period}) / (1 - target), per model "
        f"(llm:error_budget_remaining:ratio): 100% untouched, 0 spent, negative overspent.",
        [Query(_rec(spec, c.ERROR_BUDGET_REMAINING, sel), _who(spec))],
        "percentunit",
        w=4,
        h=7,
        steps=((None, "red"), (0, "orange"), (0.25, "green")),
        decimals=1,
    )

    fast, slow = spec.alert_windows[0].long, spec.alert_windows[-1].long
    exhaustion = [
        Query(
            f"clamp_max(clamp_min({_rec(spec, c.ERROR_BUDGET_REMAINING, sel)}, 0) * {spec.period} / "
            f"{_rec(spec, c.burn_rate_record(window), sel)}, {spec.period})",
            f"{_who(spec)} at the {format_duration(window)} rate",
        )
        for window in (fast, slow)
    ]
    exhaustion_stat = stat_panel(
        f"{name}: budget runs out in",
        f"When the remaining error budget runs out if the burn rate of the last "
        f"{format_duration(fast)} (what the page alert sees) or of the last {format_duration(slow)} "
        f"(the trend) goes on: remaining × {period} / burn rate, as the alert descriptions "
        f"compute it. 'spent': nothing left; 'not within {period}': the budget outlasts the "
        "period at that rate; 'no events': no traffic to judge.",
        exhaustion,
        "s",
        w=4,
        h=7,
        mappings=[
            dash_m.SpecialValueMap(
                options=dash_m.DashboardSpecialValueMapOptions(
                    match=dash_m.SpecialValueMatch.NULL_AND_NAN,
                    result=dash_m.ValueMappingResult(text="no events"),
                )
            ),
            dash_m.RangeMap(
                options=dash_m.DashboardRangeMapOptions(
                    from_val=0, to=0, result=dash_m.ValueMappingResult(text="spent", color="red")
                )
            ),
            dash_m.RangeMap(
                options=dash_m.DashboardRangeMapOptions(
                    from_val=spec.period,
                    to=spec.period,
                    result=dash_m.ValueMappingResult(text=f"not within {period}", color="green"),
                )
            ),
        ],
    )

    short, long_ = spec.alert_windows[0].short, spec.alert_windows[0].long
    sli_queries = [
        Query(f"1 - {_rec(spec, c.sli_error_record(w), sel)}", f"{_who(spec)} {format_duration(w)}")
        for w in (short, long_)
    ]
    target_queries = [
        Query(
            f"0 * {_rec(spec, c.sli_error_record(spec.period), [*sel, *_scope_matchers(s)])} + {_pct(s.target):g}",
            f"{_who(spec)} target",
        )
        for s in scopes
    ]
    sli_series = timeseries_panel(
        f"{name}: SLI vs target",
        f"Share of good events over the last {format_duration(short)} and {format_duration(long_)} "
        f"(1 - llm:sli_error:ratio_rate<window>), per model, with each model's target as a dashed "
        f"line ({target_text} unless overridden).{overrides} Dips below the target spend "
        "error budget.",
        [*sli_queries, *target_queries],
        "percentunit",
        h=7,
        min_zero=False,
    ).overrides(_wrap(_dashed_queries(len(sli_queries), len(target_queries))))

    board.add(sli_stat, budget_stat, exhaustion_stat, sli_series)
    board.add(*(_burn_panel(spec, name, arm, period) for arm in spec.alert_windows))
    board.add(
        timeseries_panel(
            f"{name}: bad-event share by pod and route",
            "Where the bad events come from: the SLI's bad-event share per namespace/pod, route "
            "and model over each $__rate_interval window, from the raw metrics (the rules above "
            f"sum over pods and routes), for the {POD_LINES} worst at each step. Follows the namespace, pod, route and model variables; "
            f"the other panels of this objective follow the model variable only. The error budget "
            f"is {format_number(default.error_budget * 100)}% of events"
            + (" (per-model overrides have their own)." if len(scopes) > 1 else "."),
            [
                Query(_breakdown_query(s), "{{namespace}}/{{pod}} {{route}} {{model}}")
                for s in scopes
            ],
            "percentunit",
            w=24,
            h=7,
        )
    )


def _dashed_queries(first: int, count: int) -> list[dash_m.DashboardFieldConfigSourceOverrides]:
    return [
        dash_m.DashboardFieldConfigSourceOverrides(
            matcher=dash_m.MatcherConfig(id_val="byFrameRefID", options=ref_id(first + i)),
            properties=[
                dash_m.DynamicConfigValue(
                    id_val="custom.lineStyle", value={"dash": [10, 10], "fill": "dash"}
                ),
                dash_m.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
            ],
        )
        for i in range(count)
    ]


class _Override(cogbuilder.Builder[dash_m.DashboardFieldConfigSourceOverrides]):
    """Hands an already built override to the SDK's ``overrides()``, which builds each item."""

    def __init__(self, model: dash_m.DashboardFieldConfigSourceOverrides) -> None:
        self._model = model

    def build(self) -> dash_m.DashboardFieldConfigSourceOverrides:
        return self._model


def _wrap(
    models: Sequence[dash_m.DashboardFieldConfigSourceOverrides],
) -> list[cogbuilder.Builder[dash_m.DashboardFieldConfigSourceOverrides]]:
    return [_Override(m) for m in models]


def build(spec: SLOSpec) -> dash_m.Dashboard:
    """The SLO dashboard model for ``spec`` (the spec the committed rules were rendered from)."""
    board = Board(
        UID,
        TITLE,
        f"Service level objectives of llm-sidecar ({len(spec.objectives)} objectives over "
        f"{spec.period_name}): each SLI against its target, error budget remaining, burn rate per "
        "alert window with the alert thresholds, firing alerts and when the budget runs out. "
        "Reads the recording rules rendered from the same SLO spec. Generated by "
        "`python -m sidecar.tools.dashboards`; DO NOT EDIT (changes are lost on the next generation).",
        ["llm-sidecar", "llm", "slo"],
    )
    _summary(board, spec)
    for objective in spec.objectives:
        _objective(board, spec, objective)
    capacity_row(board, spec)  # the throughput-latency curve
    return board.build()
