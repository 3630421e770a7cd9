"""Pure rule generation: an :class:`~.spec.SLOSpec` in, plain rule data out (no I/O, no YAML).

For every objective and scope (the objective's default, then each per-model override):

1. ``llm:sli_error:ratio_rate<W>`` for every window the alerts read and for the period;
2. ``llm:burn_rate:ratio_rate<W>`` = that ratio / error budget, for the alert windows;
3. ``llm:error_budget_remaining:ratio`` = 1 - period error ratio / error budget;
4. one ``LLM<Objective>BurnRate`` alert per row of :data:`~.windows.WORKBOOK_WINDOWS`:
   burn rate over the long window *and* over the short window above the row's factor.

A scope's records and alerts live in the objective's group, records first, so an alert reads
records of the same evaluation. Then goodput records and the sidecar's health alerts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

from . import conventions as c
from .spec import SLOSpec, Scope
from .windows import (
    WORKBOOK_WINDOWS,
    AlertWindow,
    burn_rate_factor,
    format_duration,
    format_number,
    record_windows,
)

__all__ = ["Rule", "Group", "RuleSet", "generate", "promql_string"]

Matcher = tuple[str, str, str]  # (label, operator, value)


@dataclass(frozen=True, slots=True)
class Rule:
    """One recording rule (``record``) or alerting rule (``alert``)."""

    expr: str
    record: str | None = None
    alert: str | None = None
    for_: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    rules: tuple[Rule, ...]


@dataclass(frozen=True, slots=True)
class RuleSet:
    spec: SLOSpec
    groups: tuple[Group, ...]

    def rules(self) -> Iterable[Rule]:
        for g in self.groups:
            yield from g.rules


# ------------------------------------------------------------------- PromQL helpers


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def selector(metric: str, matchers: Sequence[Matcher] = ()) -> str:
    if not matchers:
        return metric
    return metric + "{" + ",".join(f"{k}{op}{promql_string(v)}" for k, op, v in matchers) + "}"


def _sum_rate(metric: str, matchers: Sequence[Matcher], window: int) -> str:
    return f"sum by ({c.LABEL_MODEL}) (rate({selector(metric, matchers)}[{format_duration(window)}]))"


def _le(bound: float) -> str:
    """The ``le`` label value prometheus_client writes for a bucket bound ("2.0", "0.1")."""
    return floatToGoString(bound)


def _scope_matchers(scope: Scope) -> list[Matcher]:
    if scope.model is not None:
        return [(c.LABEL_MODEL, "=", scope.model)]
    return [(c.LABEL_MODEL, "!=", m) for m in scope.excluded]


def _record_matchers(scope: Scope) -> list[Matcher]:
    return [(c.LABEL_SLO, "=", scope.objective.name), *_scope_matchers(scope)]


def _static_labels(scope: Scope) -> dict[str, str]:
    labels = {c.LABEL_SLO: scope.objective.name}
    if scope.model is not None:
        # Also what the expression yields; it keeps each override's rules distinct for
        # promtool's duplicate-rule lint.
        labels[c.LABEL_MODEL] = scope.model
    return labels


# ---------------------------------------------------------------------- the SLIs


def sli_error_expr(scope: Scope, window: int) -> str:
    """Share of bad events over ``window`` for one scope, by model."""
    sm = _scope_matchers(scope)
    sli = scope.objective.sli
    if sli == "availability":
        # Bad: failed by the server (5xx, upstream failure, broken stream). Client
        # cancellations are neither good nor bad; 4xx answers are the client's doing (ok).
        bad = _sum_rate(c.REQUESTS_TOTAL, [("outcome", "=", "error"), *sm], window)
        total = _sum_rate(c.REQUESTS_TOTAL, [("outcome", "!=", "cancelled"), *sm], window)
        # The error series appears only after a first error: "or 0 * total" keeps a ratio
        # (of 0) for models that never failed.
        return f"({bad} or 0 * {total}) / {total}"
    latency = c.LATENCY_SLIS[sli]
    assert scope.threshold is not None  # validated by the spec
    base = [(k, "=", v) for k, v in latency.matchers] + sm
    total = _sum_rate(f"{latency.histogram}_count", base, window)
    good = _sum_rate(f"{latency.histogram}_bucket", [*base, ("le", "=", _le(scope.threshold))], window)
    return f"({total} - {good}) / {total}"


def objective_text(scope: Scope) -> str:
    """One sentence a person on call can read: what must be true, how often."""
    target = format_number(scope.target)
    sli = scope.objective.sli
    if sli == "availability":
        return f"{target}% of requests succeed (client cancellations not counted)"
    latency = c.LATENCY_SLIS[sli]
    return f"{latency.measure} <= {format_number(scope.threshold or 0)}s for {target}% of {latency.events}"


# ------------------------------------------------------------------- generation


def _scope_rules(spec: SLOSpec, scope: Scope) -> list[Rule]:
    labels = _static_labels(scope)
    rm = _record_matchers(scope)
    budget = format_number(scope.error_budget)
    windows = record_windows()
    rules: list[Rule] = []
    for w in [*windows, spec.period]:
        rules.append(Rule(sli_error_expr(scope, w), record=c.sli_error_record(w), labels=labels))
    for w in windows:
        rules.append(
            Rule(f"{selector(c.sli_error_record(w), rm)} / {budget}", record=c.burn_rate_record(w), labels=labels)
        )
    rules.append(
        Rule(
            f"1 - {selector(c.sli_error_record(spec.period), rm)} / {budget}",
            record=c.ERROR_BUDGET_REMAINING,
            labels=labels,
        )
    )
    for window in WORKBOOK_WINDOWS:
        rules.append(_burn_alert(spec, scope, window))
    return rules


def _burn_alert(spec: SLOSpec, scope: Scope, window: AlertWindow) -> Rule:
    name = scope.objective.name
    alert = c.alert_name(name)
    factor = format_number(burn_rate_factor(window, spec.period))
    rm = _record_matchers(scope)
    expr = (
        f"{selector(c.burn_rate_record(window.long), rm)} > {factor}"
        f" and {selector(c.burn_rate_record(window.short), rm)} > {factor}"
    )
    period = spec.period_name
    spent = format_number(window.budget_consumed * 100)
    # Prometheus templates have no arithmetic; `query` evaluates a little PromQL instead.
    budget_text = (
        'At this rate a whole budget lasts {{ with query (printf "<PERIOD_S> / %g" $value) }}'
        "{{ . | first | value | humanizeDuration }}{{ end }}. "
        '{{ with query (printf "<REMAINING>{slo=%q,model=%q}" "<SLO>" $labels.model) }}'
        "{{ $left := . | first | value }}{{ $left | humanizePercentage }} of the budget for the "
        "last <PERIOD> is left{{ if gt $left 0.0 }}, gone in "
        '{{ with query (printf "%g * <PERIOD_S> / %g" $left $value) }}'
        "{{ . | first | value | humanizeDuration }}{{ end }} at this rate"
        "{{ else }}: it is spent{{ end }}.{{ else }}The remaining budget is unknown.{{ end }}"
    )
    for marker, value in (
        ("<PERIOD_S>", str(spec.period)),
        ("<PERIOD>", period),
        ("<REMAINING>", c.ERROR_BUDGET_REMAINING),
        ("<SLO>", name),
    ):
        budget_text = budget_text.replace(marker, value)
    description = (
        f"Objective: {objective_text(scope)}, over {period}. "
        f"Over the last {window.long_name}, and still over the last {window.short_name}, model "
        '{{ $labels.model }} spent its error budget {{ printf "%.1f" $value }}x as fast as the '
        f"{period} budget allows (this {window.severity} alert fires above {factor}x, "
        f"i.e. when {spent}% of the budget is gone in {window.long_name}). {budget_text}"
    )
    labels = {
        c.LABEL_SEVERITY: window.severity,
        **_static_labels(scope),
        c.LABEL_LONG_WINDOW: window.long_name,
        c.LABEL_SHORT_WINDOW: window.short_name,
    }
    return Rule(
        expr,
        alert=alert,
        labels=labels,
        annotations={
            "summary": (
                f"{{{{ $labels.model }}}}: {name} error budget burning at "
                '{{ printf "%.1f" $value }}x the sustainable rate'
                f" over {window.long_name}"
            ),
            "description": description,
            "runbook_url": f"{spec.alerts.runbook_url}#{c.runbook_anchor(c.alert_name(scope.objective.sli))}",
        },
    )


def _goodput_rules() -> list[Rule]:
    five_min = 5 * 60
    ok = _sum_rate(c.REQUESTS_TOTAL, [("outcome", "=", "ok")], five_min)
    good = _sum_rate(c.REQUESTS_WITHIN_SLO_TOTAL, [], five_min)
    return [
        Rule(f"{good} or 0 * {ok}", record=c.GOODPUT_RATE),
        Rule(f"({good} or 0 * {ok}) / {ok}", record=c.GOODPUT_RATIO),
    ]


def _health_rules(spec: SLOSpec) -> list[Rule]:
    down = spec.alerts.target_down
    no_traffic = spec.alerts.no_traffic
    up = selector("up", [("job", "=", down.job)])
    url = spec.alerts.runbook_url
    quiet = format_duration(no_traffic.for_)
    return [
        Rule(
            f"{up} == 0 or absent({up})",
            alert=c.ALERT_TARGET_DOWN,
            for_=down.for_,
            labels={c.LABEL_SEVERITY: down.severity},
            annotations={
                "summary": (
                    "llm-sidecar target {{ with $labels.instance }}{{ . }}{{ else }}(none found){{ end }} "
                    "is down or not scraped"
                ),
                "description": (
                    f'Prometheus cannot scrape the sidecar (up{{job="{down.job}"}} is 0 or absent) '
                    f"for {format_duration(down.for_)}. Its clients may be failing, and every "
                    "SLO alert for it is blind: no data is not good data."
                ),
                "runbook_url": f"{url}#{c.runbook_anchor(c.ALERT_TARGET_DOWN)}",
            },
        ),
        Rule(
            f"absent({c.REQUESTS_TOTAL}) or sum(rate({c.REQUESTS_TOTAL}[5m])) == 0",
            alert=c.ALERT_NO_TRAFFIC,
            for_=no_traffic.for_,
            labels={c.LABEL_SEVERITY: no_traffic.severity},
            annotations={
                "summary": f"No LLM requests counted for {quiet}",
                "description": (
                    f"{c.REQUESTS_TOTAL} has had no samples or no increase for {quiet}. The SLO "
                    "alerts cannot fire without traffic data, so this silence is not a healthy "
                    "sign until someone confirms that no traffic is expected."
                ),
                "runbook_url": f"{url}#{c.runbook_anchor(c.ALERT_NO_TRAFFIC)}",
            },
        ),
    ]


def generate(spec: SLOSpec) -> RuleSet:
    """All groups for ``spec``. Never empty: a spec has at least one objective."""
    groups = []
    for objective in spec.objectives:
        rules: list[Rule] = []
        for scope in objective.scopes():
            rules.extend(_scope_rules(spec, scope))
        groups.append(Group(c.group_name(objective.name), tuple(rules)))
    groups.append(Group(c.GOODPUT_GROUP, tuple(_goodput_rules())))
    groups.append(Group(c.HEALTH_GROUP, tuple(_health_rules(spec))))
    if not any(g.rules for g in groups[:-2]):  # pragma: no cover - the spec guarantees it
        raise ValueError("the spec produced no SLO rules")
    return RuleSet(spec, tuple(groups))
