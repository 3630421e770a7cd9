"""Where the time goes: client-seen TTFT and e2e split into engine queue, engine prefill,
engine decode and the rest, per pod; and what the sidecar itself adds.

Two sources, two rows' worth of panels:

- **Per request, passively** (any engine that says): the sidecar's
  ``llm_upstream_queue_seconds`` / ``_prefill_seconds`` / ``_decode_seconds``, read from
  vLLM's per-request ``metrics``, llama.cpp's ``timings``, Ollama's durations, TGI's
  ``x-queue-time``, SGLang's ``meta_info``.
- **Per pod, from the engine's aggregates** (vLLM 0.32's own histograms, scraped beside the
  sidecar's series with the same ``namespace`` / ``pod`` target labels):
  ``vllm:request_queue_time_seconds`` (WAITING), ``vllm:request_prefill_time_seconds``
  (PREFILL), ``vllm:request_decode_time_seconds`` (DECODE), as a real vLLM 0.32 exposes
  them (``tests/fixtures/real/vllm-0.32.0/metrics.txt``). vLLM labels its series
  ``model_name``, not ``model``, so only the target-label filters apply to them.

The rest = the sidecar's mean TTFT (or e2e) − engine queue − engine prefill (− decode):
tokenisation and detokenisation, the HTTP server in front of the engine, the network, and
the sidecar. ``llm_sidecar_overhead_seconds`` then says how much of that is the sidecar.
Means, not quantiles: a difference of means is a mean of differences; a difference of
p99s is no one's p99. Both sides read their raw per-pod rates when drawn (no rule records a
pod's series); every per-pod panel draws the top pods only (``top_pods``).
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import timeseries

from .panels import Board, Query, timeseries_panel
from .queries import (
    ENGINE_LABELS,
    TARGET_LABELS,
    Matcher,
    mean,
    on_release_pods,
    quantile,
    selector,
    top_pods,
)

__all__ = [
    "ROW_TITLE",
    "VLLM_QUEUE",
    "VLLM_PREFILL",
    "VLLM_DECODE",
    "add_where_time_goes_row",
    "ttft_split",
    "e2e_split",
]

ROW_TITLE = "Where the time goes: engine queue, prefill, decode and the rest"

VLLM_QUEUE = "vllm:request_queue_time_seconds"
VLLM_PREFILL = "vllm:request_prefill_time_seconds"
VLLM_DECODE = "vllm:request_decode_time_seconds"

TTFT = "llm_time_to_first_token_seconds"
E2E = "llm_request_duration_seconds"
OVERHEAD = "llm_sidecar_overhead_seconds"

_BY_POD = ("namespace", "pod")
_POD = "{{namespace}}/{{pod}}"


def _pod_mean(histogram: str, extra: Sequence[Matcher] = ()) -> str:
    """Mean per pod over the rate window from the raw series: the sidecar's with the filters
    its series have (not the route: a per-model histogram); vLLM's (no ``model`` or ``route`` label,
    and no ``llm_release`` from a team's own scrape: only the other target labels, kept for
    the selected releases' pods). Both sum to one series per pod, so their difference joins
    one to one on (namespace, pod)."""
    if not histogram.startswith("vllm:"):
        return mean(histogram, _BY_POD, extra)
    by = ", ".join(_BY_POD)
    sel_sum = selector(histogram + "_sum", extra, labels=ENGINE_LABELS)
    sel_count = selector(histogram + "_count", extra, labels=ENGINE_LABELS)
    return on_release_pods(
        f"sum by ({by}) (rate({sel_sum}[$__rate_interval])) / "
        f"sum by ({by}) (rate({sel_count}[$__rate_interval]))"
    )


def _of_top_pods(parts: dict[str, str], total: str) -> dict[str, str]:
    """Every part kept to the pods with the highest client-seen total (the same pods in every
    query of the panel, so the stack adds up), never one line per pod of a fleet."""
    top = top_pods(parts[total])
    by = ", ".join(_BY_POD)
    return {name: f"({expr}) and on ({by}) {top}" for name, expr in parts.items()}


def ttft_split() -> dict[str, str]:
    """Per pod (the top ones by TTFT): client-seen TTFT and its parts (queries named by
    part, for tests)."""
    ttft, queue, prefill = _pod_mean(TTFT), _pod_mean(VLLM_QUEUE), _pod_mean(VLLM_PREFILL)
    parts = {
        "engine queue": queue,
        "engine prefill": prefill,
        "rest": f"({ttft}) - ({queue}) - ({prefill})",
        "client TTFT": ttft,
    }
    return _of_top_pods(parts, "client TTFT")


def e2e_split() -> dict[str, str]:
    """Per pod (the top ones by e2e): client-seen e2e (ok requests) and its parts."""
    e2e = _pod_mean(E2E, (("outcome", "=", "ok"),))
    queue, prefill, decode = _pod_mean(VLLM_QUEUE), _pod_mean(VLLM_PREFILL), _pod_mean(VLLM_DECODE)
    parts = {
        "engine queue": queue,
        "engine prefill": prefill,
        "engine decode": decode,
        "rest": f"({e2e}) - ({queue}) - ({prefill}) - ({decode})",
        "client e2e": e2e,
    }
    return _of_top_pods(parts, "client e2e")


def _split_panel(
    title: str, description: str, parts: dict[str, str], total: str
) -> timeseries.Panel:
    """The parts stacked per pod, the client-seen total as a line over them."""
    queries = [Query(expr, f"{_POD} {name}") for name, expr in parts.items() if name != total]
    queries.append(Query(parts[total], f"{_POD} {total}"))
    return timeseries_panel(title, description, queries, "s")


def add_where_time_goes_row(board: Board) -> None:
    """Append the row. (Its per-pod split needs vLLM's series scraped too; without them
    those two panels are empty and the other two still read the sidecar's own series.)"""
    board.row(ROW_TITLE)
    board.add(
        _split_panel(
            "TTFT per pod: engine queue + engine prefill + the rest (mean)",
            "Client-seen time to first token as the sidecar measured it, split per pod with "
            f"vLLM's own histograms: time waiting for the scheduler ({VLLM_QUEUE}), prefill "
            f"({VLLM_PREFILL}) and the rest (tokenisation, the engine's HTTP server, network, "
            "the sidecar). A growing queue is a pod at capacity; a growing rest with a flat "
            "engine is something between client and engine. Means over the rate window; vLLM's "
            "figures cover every request, the sidecar's TTFT streamed ones.",
            ttft_split(),
            "client TTFT",
        ),
        _split_panel(
            "E2E per pod: engine queue + prefill + decode + the rest (mean)",
            "Client-seen end-to-end latency of ok requests, split per pod with vLLM's own "
            f"histograms: queue ({VLLM_QUEUE}), prefill ({VLLM_PREFILL}), decode "
            f"({VLLM_DECODE}) and the rest: what no engine phase explains (detokenising and "
            "relaying the stream, the network, the sidecar).",
            e2e_split(),
            "client e2e",
        ),
        timeseries_panel(
            "Engine-reported per request: queue, prefill, decode (mean)",
            "The engine's own account of each request, read passively from its responses: "
            "vLLM's per-request metrics (--enable-per-request-metrics), llama.cpp's timings, "
            "Ollama's durations, TGI's x-queue-time header, SGLang's meta_info (--enable-metrics). "
            "Works for any engine that reports it, without scraping the engine.",
            [
                Query(top_pods(_pod_mean("llm_upstream_queue_seconds")), f"{_POD} queue"),
                Query(top_pods(_pod_mean("llm_upstream_prefill_seconds")), f"{_POD} prefill"),
                Query(top_pods(_pod_mean("llm_upstream_decode_seconds")), f"{_POD} decode"),
            ],
            "s",
        ),
        timeseries_panel(
            "What the sidecar adds: p50 / p99 per direction",
            f"{OVERHEAD}: request = the request body in -> written to the engine (includes "
            "connecting when no pooled connection was idle); response = the engine's response "
            "head in -> written to the client. Later bytes are written in the same call that "
            "reads them. Proof that the sidecar is not the problem, or that it is.",
            [
                Query(
                    quantile(q, OVERHEAD, ("direction",), labels=TARGET_LABELS),
                    f"{{{{direction}}}} p{round(q * 100)}",
                )
                for q in (0.5, 0.99)
            ]
            + [Query(mean(OVERHEAD, ("direction",), labels=TARGET_LABELS), "{{direction}} mean")],
            "s",
        ),
    )
