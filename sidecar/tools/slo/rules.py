"""Pure rule generation: an :class:`~.spec.SLOSpec` in, plain rule data out (no I/O, no YAML).

For every objective and scope (the objective's default, then each per-model override), all
summed by the spec's ``grouping`` labels (one SLO per deployment, not per Prometheus):

0. ``llm:sli_bad_events:rate5m`` and ``llm:sli_events:rate5m``, the base window's event rates
   (sums of the aggregates group's 5m records, :mod:`.aggregates`, where one keeps every
   label the scope selects on; else of the raw series);
1. ``llm:sli_error:ratio_rate<W>`` for every window the alerts read and for the period: the
   base window's from (0), every longer one (30m ... 3d, the period) from (0) with
   ``sum_over_time``, so no rule reads a raw series over more than the base window;
2. ``llm:burn_rate:ratio_rate<W>`` = that ratio / error budget, for the alert windows;
3. ``llm:error_budget_remaining:ratio`` = 1 - period error ratio / error budget;
4. one ``LLM<Objective>BurnRate`` alert per alert window (:func:`~.windows.windows_for_period`):
   burn rate over the long window *and* over the short window above the row's factor.

The aggregates group comes first. A scope's records and alerts live in the objective's group,
records first, so an alert reads records of the same evaluation. Then the requests group
(each error type's share of requests, alerts that carry ``error_type`` for Alertmanager to
route on, and goodput) and the sidecar's health alerts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.utils import floatToGoString

from ...base.outcomes import (
    ERROR_TYPES,
    STREAM_ERROR,
    STREAM_TRUNCATED,
    STREAMS_BROKEN_ALERT,
    UPSTREAM_UNREACHABLE_ALERT,
)
from . import aggregates, conventions as c
from .promql import Group, Matcher, Rule, selector, spec_matchers
from .spec import DEFAULT_GROUPING, Scope, SLOSpec
from .windows import (
    AlertWindow,
    burn_rate_factor,
    format_duration,
    format_number,
    record_windows,
)

__all__ = [
    "RuleSet", "LongWindows", "Numbers", "LITERAL", "generate", "sli_error_expr",
    "sli_event_exprs", "history_needed", "ErrorCause", "ERROR_CAUSES", "REQUESTS_GROUP", "ERROR_SHARE_BY_TYPE",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class RuleSet:
    spec: SLOSpec
    groups: tuple[Group, ...]

    def rules(self) -> Iterable[Rule]:
        for g in self.groups:
            yield from g.rules


# ------------------------------------------------------------------- PromQL helpers


RateOf = Callable[[str, Sequence[Matcher], int, Sequence[str]], str]
"""(metric, matchers, window, by) -> its events a second summed by ``by``."""


def _sum_rate(metric: str, matchers: Sequence[Matcher], window: int, by: Sequence[str]) -> str:
    return (
        f"sum by ({', '.join(by)}) (rate({selector(metric, matchers)}[{format_duration(window)}]))"
    )


def _source_rate(
    spec: SLOSpec,
    metric: str,
    matchers: Sequence[Matcher],
    window: int,
    by: Sequence[str],
    numbers: Numbers,
) -> str:
    """The events a second: the aggregates group's record of ``metric`` where one answers
    (sidecar/tools/slo/aggregates.py) over the same window, else the raw series. The record
    is the same rate, read from the raw series once an evaluation for every group and panel
    instead of once per reader; it comes from another group, so it is at most one evaluation
    old."""
    raw = _sum_rate(metric, matchers, window, by)
    recorded = aggregates.recorded_rate(spec, metric, matchers, by)
    return raw if recorded is None else numbers.base_rate(window, recorded, raw)


def _le(bound: float) -> str:
    """The ``le`` label value prometheus_client writes for a bucket bound ("2.0", "0.1")."""
    le: str = floatToGoString(bound)  # type: ignore[no-untyped-call]  # unannotated upstream
    return le


def _scope_matchers(scope: Scope) -> list[Matcher]:
    selected: list[Matcher] = [(label, "=", value) for label, value in scope.selector]
    if scope.model is not None:
        return [*selected, (c.LABEL_MODEL, "=", scope.model)]
    return [*selected, *((c.LABEL_MODEL, "!=", m) for m in scope.excluded)]


def _record_matchers(scope: Scope) -> list[Matcher]:
    return [(c.LABEL_SLO, "=", scope.objective.name), *_scope_matchers(scope)]


def _static_labels(scope: Scope) -> dict[str, str]:
    labels = {c.LABEL_SLO: scope.objective.name}
    if scope.model is not None:
        # Also what the expression yields; it keeps each override's rules distinct for
        # promtool's duplicate-rule lint.
        labels[c.LABEL_MODEL] = scope.model
    return labels


class Numbers:
    """How a scope's target and threshold are written into the rules: as the spec's numbers.

    :class:`sidecar.tools.slo.helm.HelmNumbers` writes placeholders for values lookups instead, so
    the chart's rules take their targets and thresholds from Helm values.
    """

    def target(self, scope: Scope) -> str:
        return format_number(scope.target)

    def budget(self, scope: Scope) -> str:
        return format_number(scope.error_budget)

    def threshold(self, scope: Scope) -> str:
        return format_number(scope.threshold or 0)

    def le(self, scope: Scope) -> str:
        """The ``le`` label value prometheus_client writes for the bucket bound ("2.0", "0.1")."""
        assert scope.threshold is not None  # validated by the spec
        return _le(scope.threshold)

    def factor(self, window: AlertWindow, period: int) -> str:
        """The burn rate above which an alert arm fires."""
        return format_number(burn_rate_factor(window, period))

    def spent(self, window: AlertWindow) -> str:
        """Percent of the period's budget spent within the arm's long window when it fires."""
        return format_number(window.budget_consumed * 100)

    def base_rate(self, window: int, recorded: str, raw: str) -> str:
        """An SLO's events a second over its base ``window``: the aggregates group's record
        where that is its window, else the raw series."""
        return recorded if window == aggregates.WINDOW else raw

    def window_error(self, window: int, period: int, recorded: str, raw: str) -> str:
        """The error ratio over ``window``: from the recorded base-window rates, as the rules
        build every window above the base one."""
        return recorded


LITERAL = Numbers()


# ---------------------------------------------------------------------- the SLIs


def sli_event_exprs(
    scope: Scope,
    window: int,
    by: Sequence[str] = DEFAULT_GROUPING,
    numbers: Numbers = LITERAL,
    recorded: bool = False,
) -> tuple[str, str]:
    """(bad events/s, all events/s) over ``window`` for one scope, summed by the grouping.
    ``recorded``: an availability scope reads its group's :data:`REQUESTS_BY_OUTCOME` record
    (written first in the same evaluation) instead of the raw counter."""
    sm = _scope_matchers(scope)
    sli = scope.objective.sli
    if sli == "availability":
        # Bad: failed by the server (5xx, upstream failure, broken stream). Client
        # cancellations are neither good nor bad; 4xx answers are the client's doing (ok).
        if recorded:
            own = [(c.LABEL_SLO, "=", scope.objective.name), *sm]
            group = ", ".join(by)
            rec = REQUESTS_BY_OUTCOME
            bad = f"sum by ({group}) ({selector(rec, [*own, ('outcome', '=', 'error')])})"
            total = f"sum by ({group}) ({selector(rec, [*own, ('outcome', '!=', 'cancelled')])})"
            return f"{bad} or 0 * {total}", total
        bad = _sum_rate(c.REQUESTS_TOTAL, [("outcome", "=", "error"), *sm], window, by)
        total = _sum_rate(c.REQUESTS_TOTAL, [("outcome", "!=", "cancelled"), *sm], window, by)
        # The error series appears only after a first error: "or 0 * total" keeps a ratio
        # (of 0) for groups that never failed.
        return f"{bad} or 0 * {total}", total
    total, good = _latency_events(scope, window, by, numbers)
    return f"{total} - {good}", total


def _latency_events(
    scope: Scope, window: int, by: Sequence[str], numbers: Numbers, rate: RateOf = _sum_rate
) -> tuple[str, str]:
    """(all events/s, good events/s) of a latency scope: its histogram's count, and its
    bucket at the threshold, each read by ``rate`` (the raw series by default)."""
    latency = c.latency_sli(
        scope.objective.sli, scope.objective.cache_class
    )  # cache_class: the TTFT-by-cache histogram
    assert scope.threshold is not None  # validated by the spec
    base = [(k, "=", v) for k, v in latency.matchers]
    if scope.objective.prompt_class is not None:
        base.append((c.LABEL_PROMPT_CLASS, "=", scope.objective.prompt_class))
    base += _scope_matchers(scope)
    good = [*base, ("le", "=", numbers.le(scope))]
    total = rate(f"{latency.histogram}_count", base, window, by)
    return total, rate(f"{latency.histogram}_bucket", good, window, by)


def sli_error_expr(
    scope: Scope, window: int, by: Sequence[str] = DEFAULT_GROUPING, numbers: Numbers = LITERAL
) -> str:
    """Share of bad events over ``window`` for one scope, straight from the raw series."""
    bad, total = sli_event_exprs(scope, window, by, numbers)
    return f"({bad}) / {total}"


def objective_text(scope: Scope, numbers: Numbers = LITERAL) -> str:
    """One sentence a person on call can read: what must be true, how often."""
    target = numbers.target(scope)
    sli = scope.objective.sli
    if sli == "availability":
        return f"{target}% of requests succeed (client cancellations not counted)"
    latency = c.latency_sli(sli, scope.objective.cache_class)
    measure = latency.measure
    if scope.objective.prompt_class is not None:
        measure += f" (prompt class {scope.objective.prompt_class})"
    return f"{measure} <= {numbers.threshold(scope)}s for {target}% of {latency.events}"


# ------------------------------------------------------------------- generation

LongWindows = Literal["recorded", "raw"]


def _scope_rules(
    spec: SLOSpec, scope: Scope, long_windows: LongWindows, numbers: Numbers
) -> list[Rule]:
    """A scope's records, then its alerts.

    The cheap form: the base window's bad and total event *rates* are recorded once, and
    every longer window (and the period) is the ratio of their ``sum_over_time``: a sum of
    rates sampled at the rule interval, so numerator and denominator are the same multiple of
    the event counts and the ratio is the count ratio, as ``rate`` over the long window would
    give (each sample covers the base window before it, so a window W weighs events of
    [t - W - base, t], the oldest base window less and less: an alert resets up to one base
    window later than a raw ``rate`` over W would). It reads one recorded series per group
    instead of every bucket series of every pod, route and class over the window at every
    evaluation.
    """
    by = spec.grouping
    labels = _static_labels(scope)
    rm = _record_matchers(scope)
    budget = numbers.budget(scope)
    windows = record_windows(spec.alert_windows)
    base = windows[0]
    if scope.objective.sli == "availability":
        bad, total = sli_event_exprs(scope, base, by, numbers, recorded=True)
        rules: list[Rule] = [
            Rule(bad, record=c.sli_bad_events_record(base), labels=labels),
            Rule(total, record=c.sli_events_record(base), labels=labels),
        ]
    else:
        # The events first, then the bad ones as those less the good: the count is read once
        # an evaluation, not twice (an evaluation costs per series read), and the record is
        # written just before in the same evaluation, so the difference has no delay.
        def source(metric: str, ms: Sequence[Matcher], w: int, b: Sequence[str]) -> str:
            return _source_rate(spec, metric, ms, w, b, numbers)

        total, good = _latency_events(scope, base, by, numbers, source)
        own = ", ".join(label for label in labels if label not in by)
        events = selector(c.sli_events_record(base), rm)
        rules = [
            Rule(total, record=c.sli_events_record(base), labels=labels),
            Rule(
                f"{events} - ignoring ({own}) {good}",
                record=c.sli_bad_events_record(base),
                labels=labels,
            ),
        ]
    for w in [*windows, spec.period]:
        if w == base:
            expr = f"{selector(c.sli_bad_events_record(base), rm)} / {selector(c.sli_events_record(base), rm)}"
        else:
            span = format_duration(w)
            recorded = (
                f"sum_over_time({selector(c.sli_bad_events_record(base), rm)}[{span}])"
                f" / sum_over_time({selector(c.sli_events_record(base), rm)}[{span}])"
            )
            expr = sli_error_expr(scope, w, by, numbers) if long_windows == "raw" else recorded
        rules.append(Rule(expr, record=c.sli_error_record(w), labels=labels))
    for w in windows:
        rules.append(
            Rule(
                f"{selector(c.sli_error_record(w), rm)} / {budget}",
                record=c.burn_rate_record(w),
                labels=labels,
            )
        )
    rules.append(
        Rule(
            f"1 - {selector(c.sli_error_record(spec.period), rm)} / {budget}",
            record=c.ERROR_BUDGET_REMAINING,
            labels=labels,
        )
    )
    for window in spec.alert_windows:
        rules.append(_burn_alert(spec, scope, window, numbers))
    return rules


REQUESTS_BY_OUTCOME = "llm:requests_by_outcome:rate5m"
"""An availability group's one read of the requests (the aggregates' record, else the raw
counter): per grouping label, ``model`` and the spec's selector labels (what its scopes
match on) and ``outcome``, over the base window. Every scope's bad and total events are sums
of it, so the requests are read once an evaluation, not twice per scope; numerator and
denominator still come from one read."""


def _requests_by_outcome(spec: SLOSpec, name: str, numbers: Numbers) -> Rule:
    by = list(spec.grouping)
    for label in (c.LABEL_MODEL, *sorted(spec.selector), "outcome"):
        if label not in by:
            by.append(label)
    base = record_windows(spec.alert_windows)[0]
    expr = _source_rate(spec, c.REQUESTS_TOTAL, spec_matchers(spec), base, by, numbers)
    return Rule(expr, record=REQUESTS_BY_OUTCOME, labels={c.LABEL_SLO: name})


def _who(by: Sequence[str]) -> str:
    """Prometheus template naming the deployment: ``prod/llama`` (grouping labels, model last)."""
    parts = [
        f"{{{{ with $labels.{label} }}}}{{{{ . }}}}/{{{{ end }}}}"
        for label in by
        if label != c.LABEL_MODEL
    ]
    return "".join(parts) + "{{ $labels.model }}"


def _burn_alert(spec: SLOSpec, scope: Scope, window: AlertWindow, numbers: Numbers) -> Rule:
    name = scope.objective.name
    alert = c.alert_name(name)
    factor = numbers.factor(window, spec.period)
    rm = _record_matchers(scope)
    expr = (
        f"{selector(c.burn_rate_record(window.long), rm)} > {factor}"
        f" and {selector(c.burn_rate_record(window.short), rm)} > {factor}"
    )
    period = spec.period_name
    spent = numbers.spent(window)
    who = _who(spec.grouping)
    # The remaining budget of the same group: a label the alert lacks reads as "", which
    # matches the series that lack it too. `index` gives "" for a missing key in every Go
    # template engine; `$labels.x` does so only in Prometheus (missingkey=zero), while vmalert
    # passes nil, printf renders `%!q(<nil>)`, the query fails and the alert is dropped.
    group_fmt = ",".join(f"{label}=%q" for label in spec.grouping)
    group_args = " ".join(f'(index $labels "{label}")' for label in spec.grouping)
    # Prometheus templates have no arithmetic; `query` evaluates a little PromQL instead.
    budget_text = (
        'At this rate a whole budget lasts {{ with query (printf "<PERIOD_S> / %g" $value) }}'
        "{{ . | first | value | humanizeDuration }}{{ end }}. "
        '{{ with query (printf "<REMAINING>{slo=%q,<GROUP_FMT>}" "<SLO>" <GROUP_ARGS>) }}'
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
        ("<GROUP_FMT>", group_fmt),
        ("<GROUP_ARGS>", group_args),
    ):
        budget_text = budget_text.replace(marker, value)
    description = (
        f"Objective: {objective_text(scope, numbers)}, over {period}. "
        f"Over the last {window.long_name}, and still over the last {window.short_name}, model "
        f'{who} spent its error budget {{{{ printf "%.1f" $value }}}}x as fast as the '
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
                f"{who}: {name} error budget burning at "
                '{{ printf "%.1f" $value }}x the sustainable rate'
                f" over {window.long_name}"
            ),
            "description": description,
            "runbook_url": f"{spec.alerts.runbook_url}#{c.runbook_anchor(c.alert_name(scope.objective.sli))}",
        },
    )


# ------------------------------------------------------------------- error causes

REQUESTS_GROUP = "llm-sidecar-requests"
"""The requests' outcomes: one read of the requests (the aggregates' record), then each error
type's share, the error cause alerts and goodput, all from that read."""
ERROR_SHARE_BY_TYPE = "llm:request_errors_by_type:ratio_rate5m"
"""Each ``error_type``'s share of the requests that were not cancelled, per grouping, over 5m."""
REQUESTS_BY_ERROR_TYPE = "llm:requests_by_error_type:rate5m"
"""The requests that were not cancelled, a second, per grouping, ``outcome`` and
``error_type``, over 5m: the requests group's one read of the requests."""
CAUSE_SHARE = 0.05
"""An error cause alert fires when its error types *together* failed more than this share of
requests (one engine crash shows as several types, by where each stream was)..."""
CAUSE_FOR = 10 * 60
"""...for this long (a cause worth a person's look, not a blip; the burn-rate alerts page)."""


@dataclass(frozen=True, slots=True)
class ErrorCause:
    """Error types with one owner and one first step: an alert that names them, so
    Alertmanager can route on ``alertname`` or ``error_type`` (the server's owners for an
    unreachable server, the model-serving team for an engine that fails mid-answer)."""

    alert: str
    error_types: tuple[str, ...]
    summary: str
    description: str


ERROR_CAUSES: tuple[ErrorCause, ...] = (
    ErrorCause(
        UPSTREAM_UNREACHABLE_ALERT,
        ("upstream_unreachable", "upstream_timeout"),
        "the inference server does not answer ({{ $labels.error_type }})",
        "got no response from the inference server: it is down, restarting, still loading "
        "the model, not listening on the sidecar's --upstream port, or too slow to send its "
        "response headers (upstream_timeout). Clients get 502 or 504 from the sidecar. Check "
        "the pod's restarts and the engine's log, and /readyz on the sidecar's admin port.",
    ),
    ErrorCause(
        STREAMS_BROKEN_ALERT,
        (
            "upstream_disconnected",
            "upstream_read_timeout",
            STREAM_TRUNCATED,
            STREAM_ERROR,
            "upstream_invalid_response",
        ),
        "the inference server fails mid-answer ({{ $labels.error_type }})",
        "were answered, then failed: the server closed the connection (upstream_disconnected), "
        "stalled past the read timeout (upstream_read_timeout), ended a stream before its end "
        "marker (upstream_stream_truncated), sent an error inside a 200 answer (stream_error) "
        "or broke HTTP (upstream_invalid_response). Clients got a cut-off answer with status "
        "200. Engine crashes (out of memory, device errors), aborted requests and a proxy that "
        "cuts long streams look like this: read the engine's log at those times.",
    ),
)
assert all(t in ERROR_TYPES for cause in ERROR_CAUSES for t in cause.error_types)


def _requests_rules(spec: SLOSpec) -> list[Rule]:
    """One read of the requests that were not cancelled, by outcome and error type; then
    each error type's share of them, goodput, and one alert per error cause.

    A cause is judged on the sum of its types' shares (3% disconnected and 3% truncated is a
    6% broken engine, though neither type is over 5%); its alerts keep ``error_type`` (one
    alert per type seen in the window, each with the cause's share as its value), so a route
    can send each cause to the team that owns it. The availability burn-rate alerts page on
    the sum. Goodput divides the requests within the sidecar's latency objectives by the ok
    ones of that same read."""
    five_min = 5 * 60
    sel = spec_matchers(spec)
    by = spec.grouping
    group = ", ".join(by)
    # One read of the requests, then every share from that record (written just before
    # them in the same evaluation): numerators and denominators from one read, not one each.
    judged = _source_rate(
        spec, c.REQUESTS_TOTAL, [("outcome", "!=", "cancelled"), *sel], five_min,
        (*by, "outcome", "error_type"), LITERAL,
    )  # fmt: skip
    errors = f"sum by ({group}, error_type) ({selector(REQUESTS_BY_ERROR_TYPE, [('outcome', '=', 'error'), *sel])})"
    total = f"sum by ({group}) ({selector(REQUESTS_BY_ERROR_TYPE, sel)})"
    ok = f"sum by ({group}) ({selector(REQUESTS_BY_ERROR_TYPE, [('outcome', '=', 'ok'), *sel])})"
    good = _source_rate(spec, c.REQUESTS_WITHIN_SLO_TOTAL, sel, five_min, by, LITERAL)
    rules = [
        Rule(judged, record=REQUESTS_BY_ERROR_TYPE),
        Rule(f"{errors} / ignoring (error_type) group_left () {total}", record=ERROR_SHARE_BY_TYPE),
        Rule(f"{good} or 0 * {ok}", record=c.GOODPUT_RATE),
        Rule(f"{selector(c.GOODPUT_RATE, sel)} / {ok}", record=c.GOODPUT_RATIO),
    ]
    who = _who(by)
    share = format_number(CAUSE_SHARE)
    for cause in ERROR_CAUSES:
        types = "|".join(cause.error_types)
        shares = selector(ERROR_SHARE_BY_TYPE, [("error_type", "=~", types), *sel])
        group = ", ".join(by)
        # The cause's share, over the line, onto each of its types seen (value 1 each): the
        # alert has the type's labels and the cause's value.
        rules.append(
            Rule(
                f"(sum by ({group}) ({shares}) > {share}) * on ({group}) group_right () (({shares} > 0) * 0 + 1)",
                alert=cause.alert,
                for_=CAUSE_FOR,
                labels={c.LABEL_SEVERITY: "ticket"},
                annotations={
                    "summary": f"{who}: {cause.summary}",
                    "description": (
                        f"{{{{ $value | humanizePercentage }}}} of {who}'s requests over the last 5m "
                        f"(above {CAUSE_SHARE:.0%} for {format_duration(CAUSE_FOR)}) {cause.description} "
                        f"The alert carries error_type ({', '.join(cause.error_types)}) for routing."
                    ),
                    "runbook_url": f"{spec.alerts.runbook_url}#{c.runbook_anchor(cause.alert)}",
                },
            )
        )
    return rules


def history_needed(spec: SLOSpec) -> int:
    """Seconds of history the rules read: the period plus its first slice (see below)."""
    return spec.period + spec.period // 30


def _history_rule(spec: SLOSpec) -> Rule:
    """Fires for each group whose recorded SLO series reach less than the period back.

    The long windows (and so the error budget) read the recorded base-window rates. If none
    were recorded in the oldest 1/30 of the period (the day from 30d to 29d ago), the period
    window holds less than the period: the retention is shorter, or the deployment or the
    rules are younger. ``unless on (grouping)`` keeps each group's own labels for routing.
    Both sides look over a whole slice, not at an instant: this rule's group runs apart from
    the groups that record the series (Prometheus evaluates groups independently), so an
    instant read could fall between two of their evaluations.
    """
    by = ", ".join(spec.grouping)
    alert = spec.alerts.history_short
    base = record_windows(spec.alert_windows)[0]
    events = selector(c.sli_events_record(base), spec_matchers(spec))
    slice_ = spec.period // 30
    period = spec.period_name
    who = _who(spec.grouping)
    return Rule(
        f"group by ({by}) (last_over_time({events}[{format_duration(slice_)}])) unless on ({by}) "
        f"group by ({by}) (last_over_time({events}[{format_duration(slice_)}] offset {format_duration(spec.period - slice_)}))",
        alert=c.ALERT_HISTORY_SHORT,
        labels={c.LABEL_SEVERITY: alert.severity},
        annotations={
            "summary": f"{who}: the {period} SLO windows hold less than {period} of history",
            "description": (
                f"Prometheus has no recorded SLO series ({events}) for {who} from {period} ago, so "
                f"the error budget and the slow burn-rate alerts cover less than the {period} "
                "period. Either the deployment or these rules are younger than that (this clears "
                f"by itself), or Prometheus keeps less than the {format_duration(history_needed(spec))} "
                "the rules need (Prometheus keeps 15d by default, kube-prometheus-stack 10d): raise "
                "--storage.tsdb.retention.time, or evaluate the rules in a Thanos or Mimir ruler."
            ),
            "runbook_url": f"{spec.alerts.runbook_url}#{c.runbook_anchor(c.ALERT_HISTORY_SHORT)}",
        },
    )


def _sum_by_selector(spec: SLOSpec) -> str:
    labels = sorted(spec.selector)
    return f"sum by ({', '.join(labels)}) " if labels else "sum"


REQUESTS_RATE = aggregates.find(c.REQUESTS_TOTAL).record
"""The aggregates group's record of ``llm_requests_total`` (sidecar/tools/slo/aggregates.py)."""


def _health_rules(spec: SLOSpec) -> list[Rule]:
    down = spec.alerts.target_down
    no_traffic = spec.alerts.no_traffic
    up = selector("up", [("job", "=", down.job), *spec_matchers(spec)])
    recorded = selector(REQUESTS_RATE, spec_matchers(spec))
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
            # Per deployment where the spec selects one (absent() keeps the selector's labels).
            # The dashboards group's record of the requests' 2m rate (four scrapes at 30 s),
            # which exists exactly while the counter does: held for the alert's ``for``, zero
            # over every 2m is no request in all that time. Read from that record, not twice
            # from every pod's counter (absent() and the rate): the record is another group's,
            # so it is at most one evaluation old, nothing against a 30m ``for``.
            f"absent({recorded}) or {_sum_by_selector(spec)}({recorded}) == 0",
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


def generate(
    spec: SLOSpec, long_windows: LongWindows = "recorded", numbers: Numbers = LITERAL
) -> RuleSet:
    """All groups for ``spec``. Never empty: a spec has at least one objective.

    ``long_windows="raw"`` reads the long windows straight from the raw series (today's
    expensive form), only so tests can show both forms reach the same verdicts.
    """
    # The aggregates first: every later group reads its records (in promtool's evaluation
    # order, of the same step; in Prometheus, which runs groups apart, of its last one).
    groups = [aggregates.aggregates_group(spec)]
    for objective in spec.objectives:
        rules: list[Rule] = []
        if objective.sli == "availability":
            rules.append(_requests_by_outcome(spec, objective.name, numbers))
        for scope in spec.scopes(objective):
            rules.extend(_scope_rules(spec, scope, long_windows, numbers))
        groups.append(Group(c.group_name(objective.name), tuple(rules)))
    groups.append(Group(REQUESTS_GROUP, tuple(_requests_rules(spec))))
    health = _health_rules(spec)
    if spec.alerts.history_short.enabled:
        health.append(_history_rule(spec))
    groups.append(Group(c.HEALTH_GROUP, tuple(health)))
    if not any(g.rules for g in groups[1:-2]):  # pragma: no cover - the spec guarantees it
        raise ValueError("the spec produced no SLO rules")
    return RuleSet(spec, tuple(groups))
