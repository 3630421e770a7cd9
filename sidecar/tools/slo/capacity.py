"""SLO capacity from live traffic: recorded rules and a ticket alert, generated
from the same spec as the SLO rules and summed by its ``grouping``.

Which objective: the spec's first ``itl`` objective, else its first ``tpot`` one (no such
objective, no capacity rules). Its target is the quantile (95 -> p95) and its default
threshold the bound. Capacity is read from **ITL**, not TPOT, because a gap ends at one
moment and so at one concurrency band, while a request's TPOT averages over every band it
decoded through and has no band of its own. A p95 ITL within the TPOT threshold is the
stricter test: a request's TPOT is the mean of its gaps.

Records, each per grouping (and ``concurrency`` band where it says so):

- first, the band rates every later record reads, once, from the raw series over 2m (four
  scrapes at a 30 s interval): the gaps a second
  (``llm:inter_token_latency_by_concurrency_seconds_count:rate2m``), the gaps within the
  threshold a second (``llm:inter_token_latency_by_concurrency_seconds_bucket:rate2m``, only
  the bucket whose ``le`` is the threshold) and ``llm:decode_seconds_by_concurrency:rate2m``.
  The hour is the mean of those (``avg_over_time`` over 1h: the hour's rate, its oldest 2m
  weighed less and less), so no rule reads an hour of raw band series, and a short window
  costs the raw read least (the hour's mean is the same rate whatever window tiles it); they
  are written earlier in the same evaluation, so the chain adds no evaluation of delay, only
  a change's half-window lag;
- ``llm:inter_token_latency_by_concurrency:first_seen_time{concurrency}``: when the band's
  record was first seen (Unix seconds), carried forward from its own last value while the
  band is recorded, so the hour's floor knows how much of the hour a young band covers
  without reading an hour of its record at every evaluation;
- the hour's means more than one later record reads, once each:
  ``llm:inter_token_latency_by_concurrency_seconds_count:rate1h`` (gaps a second, which are
  the decode tokens a second: one gap per output token after a stream's first) and
  ``llm:decode_seconds_by_concurrency:rate1h``;
- ``llm:itl_by_concurrency_within_threshold:ratio_1h{concurrency}``: the share of the hour's
  gaps within the threshold, only for bands that saw at least MIN_GAPS gaps in that hour (too
  few samples give no verdict): the hour's mean rate times the part of the hour the band's
  record covers, never extrapolated to the hour. A band meets the objective when the share
  is at least the target (95 %): that is exactly when the p95 is within the threshold, since
  the threshold is a bucket bound (the spec and the chart's schema admit no other), and
  ``histogram_quantile`` puts the p95 at or under a bound exactly when that bucket holds 95 %
  of the count. Two series a band are read, not the histogram's every bucket (most of what
  the group cost);
- ``llm:decode_throughput_by_concurrency:rate1h{concurrency}``: decode tokens/s at the band;
- ``llm:slo_capacity:band{concurrency}``: for each finite band that meets the objective, the
  band's number; ``llm:slo_capacity:concurrency`` the largest of them;
- ``llm:slo_capacity:tokens_per_second``: the throughput at the capacity band;
- ``llm:decode_concurrency:p95_1h``: where the load is: the smallest band below which 95 %
  of the hour's decode time was spent; ``llm:slo_capacity:load_ratio`` = that / capacity.

Alert ``LLMNearCapacity`` (ticket): the load's p95 band at or above the capacity band.
"""

from __future__ import annotations

from ...measure.concurrency import BANDS
from . import conventions as c
from .promql import Group, Rule, selector, spec_matchers
from .rules import LITERAL, LongWindows, Numbers, RuleSet, _who, generate as generate_slo
from .spec import Objective, SLOSpec
from .stall import stall_group
from .windows import format_number, parse_duration

__all__ = [
    "generate",
    "CAPACITY_GROUP",
    "ALERT_NEAR_CAPACITY",
    "MIN_GAPS",
    "WINDOW",
    "capacity_objective",
    "WITHIN_HOUR",
    "capacity_group",
    "CAPACITY",
    "CAPACITY_BAND",
    "CAPACITY_TPS",
    "LOAD_P95",
    "LOAD_RATIO",
    "THROUGHPUT",
]

CAPACITY_GROUP = "llm-sidecar-capacity"
ALERT_NEAR_CAPACITY = "LLMNearCapacity"
ITL_BY_CONCURRENCY = "llm_inter_token_latency_by_concurrency_seconds"
SECONDS = "llm_decode_seconds_by_concurrency_total"
WINDOW = "1h"
BAND_WINDOW = "2m"
ITL_BUCKET_RATE = "llm:inter_token_latency_by_concurrency_seconds_bucket:rate2m"
ITL_COUNT_RATE = "llm:inter_token_latency_by_concurrency_seconds_count:rate2m"
SECONDS_RATE = "llm:decode_seconds_by_concurrency:rate2m"
FIRST_SEEN = "llm:inter_token_latency_by_concurrency:first_seen_time"
ITL_COUNT_HOUR = "llm:inter_token_latency_by_concurrency_seconds_count:rate1h"
SECONDS_HOUR = "llm:decode_seconds_by_concurrency:rate1h"
WITHIN_HOUR = "llm:itl_by_concurrency_within_threshold:ratio_1h"
MIN_GAPS = 100
FOR = "15m"
THROUGHPUT = "llm:decode_throughput_by_concurrency:rate1h"
CAPACITY_BAND = "llm:slo_capacity:band"
CAPACITY = "llm:slo_capacity:concurrency"
CAPACITY_TPS = "llm:slo_capacity:tokens_per_second"
LOAD_P95 = "llm:decode_concurrency:p95_1h"
LOAD_RATIO = "llm:slo_capacity:load_ratio"
FINITE_BANDS = tuple(b for b in BANDS if b != "+Inf")


def capacity_objective(spec: SLOSpec) -> Objective | None:
    for sli in ("itl", "tpot"):
        for o in spec.objectives:
            if o.sli == sli:
                return o
    return None


def capacity_group(spec: SLOSpec, numbers: Numbers = LITERAL) -> Group | None:
    """The capacity group, or None when the spec has no ITL or TPOT objective.

    The bound is the objective's threshold as ``numbers`` writes it, so in the chart it is
    the same values lookup the objective's own rules use: ``--set
    prometheus.rules.objectives.<name>.thresholdSeconds`` moves the capacity with the SLO.
    The share a band must reach stays the spec's target."""
    objective = capacity_objective(spec)
    if objective is None:
        return None
    sel = spec_matchers(spec)
    by = ", ".join(spec.grouping)
    byc = f"{by}, concurrency"
    q = objective.target / 100
    default = spec.scopes(objective)[0]
    threshold = numbers.threshold(default)
    le = numbers.le(default)  # the threshold as the bucket's le label writes it

    # Recorded series are read through the spec's selector too: in a fleet, each release's
    # rules must read (and so write) only its own deployment's series.
    def rec(name: str, *extra: tuple[str, str, str]) -> str:
        return selector(name, [*sel, *extra])

    def band_rate(metric: str, by_: str, *extra: tuple[str, str, str]) -> str:
        return f"sum by ({by_}) (rate({selector(metric, [*sel, *extra])}[{BAND_WINDOW}]))"

    def hour(name: str, *extra: tuple[str, str, str]) -> str:
        """The hour's mean of a recorded band rate (its rate over the hour, as the 2m windows
        tile it)."""
        return f"avg_over_time({rec(name, *extra)}[{WINDOW}])"

    seconds = parse_duration(WINDOW)
    band = parse_duration(BAND_WINDOW)
    # The gaps the hour saw: its mean rate times the time it covers, which is less than the
    # hour while the band's record is younger (a new pod, a band first reached): from its
    # first evaluation, plus the 2m its first rate looked back. Times the whole hour, a
    # minute of traffic would pass the floor as if it had lasted an hour. When the band was
    # first seen is itself a record that carries its own last value forward while the band
    # is recorded, and starts at the evaluation's time when it is not: one instant read of
    # one series a band, where the earliest timestamp over the hour (a subquery) read the
    # band's record at every evaluation of the hour, most of the group's cost.
    present = rec(ITL_COUNT_RATE)
    first_seen = (
        f"(min by ({byc}) ({rec(FIRST_SEEN)}) and on ({byc}) {present})"
        f" or on ({byc}) timestamp({present})"
    )
    covered = f"clamp_max(time() - min by ({byc}) ({rec(FIRST_SEEN)}) + {band}, {seconds})"
    gaps = f"sum by ({byc}) ({rec(ITL_COUNT_HOUR)}) * on ({byc}) {covered}"
    within = (
        f"sum by ({byc}) ({hour(ITL_BUCKET_RATE)}) / sum by ({byc}) ({rec(ITL_COUNT_HOUR)}) "
        f"and on ({byc}) {gaps} >= {MIN_GAPS}"
    )
    throughput = (
        f"sum by ({byc}) ({rec(ITL_COUNT_HOUR)}) / (sum by ({byc}) ({rec(SECONDS_HOUR)}) > 0)"
    )
    bands = " or ".join(
        f"({rec(WITHIN_HOUR, ('concurrency', '=', b))} >= {format_number(q)}) * 0 + {b}"
        for b in FINITE_BANDS
    )
    at_capacity = f"{rec(CAPACITY_BAND)} == on ({by}) group_left () {rec(CAPACITY)}"
    total = f"sum by ({by}) ({rec(SECONDS_HOUR)})"
    cumulative = []
    for i, b in enumerate(BANDS):
        upto = "|".join(x.replace("+", "\\+") for x in BANDS[: i + 1])
        share = f"sum by ({by}) ({rec(SECONDS_HOUR, ('concurrency', '=~', upto))}) / ({total} > 0)"
        value = "256" if b == "+Inf" else b  # above every finite band
        cumulative.append(
            f'label_replace({share} >= 0.95, "concurrency", "{b}", "", "") * 0 + {value}'
        )
    load = f"min by ({by}) ({' or '.join(cumulative)})"
    who = _who(spec.grouping)
    rules = (
        # Two raw series a band: the count and the bucket at the threshold, not every
        # bucket (the share within it decides the band; see the module's docstring).
        Rule(band_rate(ITL_BY_CONCURRENCY + "_count", byc), record=ITL_COUNT_RATE),
        Rule(
            band_rate(ITL_BY_CONCURRENCY + "_bucket", f"{byc}, le", ("le", "=", le)),
            record=ITL_BUCKET_RATE,
        ),
        Rule(first_seen, record=FIRST_SEEN),
        Rule(band_rate(SECONDS, byc), record=SECONDS_RATE),
        Rule(f"sum by ({byc}) ({hour(ITL_COUNT_RATE)})", record=ITL_COUNT_HOUR),
        Rule(f"sum by ({byc}) ({hour(SECONDS_RATE)})", record=SECONDS_HOUR),
        Rule(within, record=WITHIN_HOUR),
        Rule(throughput, record=THROUGHPUT),
        Rule(bands, record=CAPACITY_BAND),
        Rule(f"max by ({by}) ({rec(CAPACITY_BAND)})", record=CAPACITY),
        Rule(
            f"max by ({by}) ({rec(THROUGHPUT)} and on ({byc}) ({at_capacity}))", record=CAPACITY_TPS
        ),
        Rule(load, record=LOAD_P95),
        Rule(f"{rec(LOAD_P95)} / on ({by}) {rec(CAPACITY)}", record=LOAD_RATIO),
        Rule(
            f"{rec(LOAD_P95)} >= on ({by}) {rec(CAPACITY)}",
            alert=ALERT_NEAR_CAPACITY,
            for_=15 * 60,
            labels={c.LABEL_SEVERITY: "ticket"},
            annotations={
                "summary": f"{who}: running near its SLO capacity",
                "description": (
                    f"Over the last {WINDOW}, 95% of decode time ran with up to "
                    "{{ $value }} streams decoding at once, at or above the capacity band: the "
                    f"largest concurrency band whose p{format_number(objective.target)} inter-token "
                    f"latency is within the {objective.name} objective's {threshold}s. More load "
                    "will breach the objective: add replicas or lower max concurrency."
                ),
                "runbook_url": f"{spec.alerts.runbook_url}#{c.runbook_anchor(ALERT_NEAR_CAPACITY)}",
            },
        ),
    )
    return Group(CAPACITY_GROUP, rules)


def generate(
    spec: SLOSpec, long_windows: LongWindows = "recorded", numbers: Numbers = LITERAL
) -> RuleSet:
    """The SLO rules of :func:`.rules.generate`, then the capacity group when the spec has
    an ITL or TPOT objective: what ``llm-sidecar slo render`` and the chart render."""
    ruleset = generate_slo(spec, long_windows, numbers)
    group = capacity_group(spec, numbers)
    capacity = () if group is None else (group,)
    stalls = stall_group(spec)  # a hung engine (stall.py)
    stalled = () if stalls is None else (stalls,)
    return RuleSet(ruleset.spec, (*ruleset.groups, *capacity, *stalled))
