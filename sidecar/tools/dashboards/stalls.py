"""Streams in flight, live: the phase each request is in, the oldest one's age, and the streams
stalled past the sidecar's ``--stall-seconds`` (sidecar/export/in_flight.py), per pod.

These gauges are read from the open streams at every scrape, so unlike every latency panel
they move while a request runs: an engine that hangs shows here at once, where the
histograms wait for the read timeout to end its streams. The series exist only while a
request is in flight, so an empty panel is an idle pod, shown as 0. The panels read the raw
gauges when drawn (no rule reads them, and a gauge's instant read costs a panel about what a
record's would: sidecar/tools/slo/aggregates.py), summed or at their largest over the selected
pods; the stalled streams per pod for the top pods only.
"""

from __future__ import annotations

from .panels import Board, Query, timeseries_panel
from .queries import max_gauge, sum_gauge, top_pods, zero_if_absent

__all__ = ["ROW_TITLE", "IN_PHASE", "OLDEST", "STALLED", "add_stalls_row"]

ROW_TITLE = "In flight, live: phases and stalled streams"
IN_PHASE = "llm_requests_in_phase"
OLDEST = "llm_requests_in_phase_oldest_seconds"
STALLED = "llm_streams_stalled"


def add_stalls_row(board: Board) -> None:
    board.row(ROW_TITLE)
    board.add(
        timeseries_panel(
            "Streams stalled",
            "Streams the model server has sent no byte for at least the sidecar's "
            "--stall-seconds (30 s by default), per pod and phase: decode (tokens stopped), "
            "first_token (no first token yet), head (no response head). Above 0 on a pod whose "
            "requests also stopped completing is a hung engine (alert LLMStreamsStalled, "
            "docs/runbooks.md); above 0 while requests complete is a busy engine's queue. "
            "Read at each scrape, not when requests end.",
            [
                Query(
                    f"{top_pods(sum_gauge(STALLED, ('namespace', 'pod', 'phase')))} or on () vector(0)",
                    "{{namespace}}/{{pod}} {{phase}}",
                )
            ],
            "short",
            w=8,
        ),
        timeseries_panel(
            "Requests in flight by phase",
            "Requests being relayed right now, by phase: head (waiting for the response head), "
            "first_token (streamed, no token yet), decode (tokens coming). A queue in the engine "
            "grows head and first_token; a hang freezes every phase.",
            [Query(zero_if_absent(sum_gauge(IN_PHASE, ("phase",)), "phase"), "{{phase}}")],
            "short",
            w=8,
            stack=True,
        ),
        timeseries_panel(
            "Oldest request in each phase",
            "Age of the oldest request in flight in each phase (seconds since its head came in), "
            "the largest over the selected pods: a first_token line climbing past the TTFT "
            "objective is a request still waiting, seen before it ends.",
            [Query(zero_if_absent(max_gauge(OLDEST, ("phase",)), "phase"), "{{phase}}")],
            "s",
            w=8,
        ),
    )
