"""The SLO dashboard's "Capacity" row: the throughput-latency curve per
deployment, read from the capacity records of sidecar/tools/slo/capacity.py (same spec)."""

from __future__ import annotations

from ..slo import capacity as cap
from ..slo.spec import SLOSpec
from ..slo.windows import format_number
from .panels import Board, Query, dashed_threshold_lines, stat_panel, timeseries_panel
from .queries import FILTER_LABELS, Matcher, recorded, selector

__all__ = ["capacity_row"]


def capacity_row(board: Board, spec: SLOSpec) -> None:
    """Adds the row, or nothing when the spec has no ITL or TPOT objective."""
    objective = cap.capacity_objective(spec)
    if objective is None:
        return
    # The raw series are split and filtered by release too, as the records are (recorded()):
    # two releases of one model in one namespace (the chart's per-release SLO dashboard
    # included) never sum into one curve. Plain installs have no llm_release: it matches All.
    split = [*spec.grouping, *(() if "llm_release" in spec.grouping else ("llm_release",))]
    by = ", ".join(split)
    threshold = objective.threshold_seconds
    assert threshold is not None  # a latency objective has one (Objective's validator)
    q = format_number(objective.target)
    legend = " ".join(f"{{{{{label}}}}}" for label in split) + " band {{concurrency}}"

    def sel(record: str, *extra: Matcher) -> str:
        labels = [label for label in split if label in FILTER_LABELS]
        return selector(record, extra, labels=labels)

    # The capacity group's recorded 2m band rates (sidecar/tools/slo/capacity.py): the gaps,
    # and those within the threshold (its bucket record holds that one bound's ``le``, wherever
    # the chart's values put it, so the share is read without naming it).
    count = f"sum by ({by}, concurrency) ({sel(cap.ITL_COUNT_RATE)})"
    within = f"sum by ({by}, concurrency) ({sel(cap.ITL_BUCKET_RATE)})"
    # A band's series exist at zero before the load reaches it (the lowest three from a
    # model's first stream, then two ahead: sidecar/export/capacity.py): only bands with
    # gaps in the window are drawn, not their 0/0 NaN.
    board.row(
        f"Capacity: the throughput-latency curve (p{q} ITL within the {objective.name} objective's "
        f"{format_number(threshold)}s)"
    )
    share = timeseries_panel(
        f"Gaps within {format_number(threshold)}s by decode concurrency",
        f"Share of the gaps between tokens within the {objective.name} objective's threshold, per "
        "concurrency band (streams decoding when the gap ended), over 2m (the capacity rules' "
        f"recorded band rates). A band meets the objective while its share stays at or above "
        f"the dashed {q}% line: its p{q} ITL is then within the threshold. Where the share falls "
        "under the line is the knee. See docs/capacity.md.",
        [Query(f"{within} / ({count} > 0)", legend)],
        "percentunit",
    )
    board.add(
        dashed_threshold_lines(share, ((None, "red"), (objective.target / 100, "green"))),
        timeseries_panel(
            "Decode tokens/s by concurrency",
            "Output tokens per second of decode wall time at each band (decode tokens, one a "
            "gap, / decode seconds at the band): throughput rises with concurrency until the "
            "batch saturates.",
            [
                Query(
                    f"{count} / (sum by ({by}, concurrency) ({sel(cap.SECONDS_RATE)}) > 0)",
                    legend,
                )
            ],
            "short",
        ),
    )
    who = " ".join(f"{{{{{label}}}}}" for label in spec.grouping)
    board.add(
        stat_panel(
            "Capacity: streams",
            f"Largest concurrency band whose p{q} ITL meets the threshold (at least "
            f"{cap.MIN_GAPS} gaps in 1h).",
            [Query(recorded(cap.CAPACITY, (), spec.grouping), who)],
            "short",
            w=8,
        ),
        stat_panel(
            "Capacity: tokens/s",
            "Decode tokens per second of decode wall time at the capacity band, over 1h: the "
            "throughput the deployment gives while still meeting the objective.",
            [Query(recorded(cap.CAPACITY_TPS, (), spec.grouping), who)],
            "short",
            w=8,
        ),
        stat_panel(
            "Now at (p95 band)",
            "The band under which 95% of the last hour's decode time ran; red at or above capacity "
            "(the LLMNearCapacity ticket).",
            [Query(recorded(cap.LOAD_P95, (), spec.grouping), who)],
            "short",
            w=8,
        ),
    )
