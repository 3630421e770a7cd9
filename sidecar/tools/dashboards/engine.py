"""The inference engine's own view (vLLM): its queue, its batch, its KV cache, preemptions.

The sidecar measures what users get; these explain why. vLLM exports them on its own
``/metrics``, which the chart scrapes through the sidecar's admin port (``/metrics/engine``,
job ``llm-engine``), so they carry the same ``namespace`` and ``pod`` target labels as the
sidecar's series and the dashboard's filters apply (vLLM labels its series ``model_name``,
not ``model``, so the model and route filters do not). A team's own scrape of its server
(monitoring-only) gives them no ``llm_release``: the release filter keeps its pods instead
(``on_release_pods``), so the row reads the engine wherever it was scraped.

Names are vLLM's V1 engine's (``vllm/v1/metrics/loggers.py``): ``vllm:num_requests_waiting``
and ``vllm:num_requests_running`` (gauges), ``vllm:kv_cache_usage_perc`` (gauge, 1 = full)
and ``vllm:num_preemptions`` (a counter, exposed as ``vllm:num_preemptions_total``). The row
is open, high on the overview: vLLM is the chart's default engine; on another engine (SGLang,
TGI, llama.cpp) its panels are empty and the row can be folded away. These are the engine's
raw series, one per pod: each panel draws the top pods only (``top_pods``).
"""

from __future__ import annotations

from .panels import Board, Query, timeseries_panel
from .queries import ENGINE_LABELS, RATE_INTERVAL, on_release_pods, selector, top_pods

__all__ = ["ROW_TITLE", "WAITING", "RUNNING", "KV_CACHE", "PREEMPTIONS", "add_engine_row"]

ROW_TITLE = "Inference engine (vLLM): queue, batch, KV cache, preemptions"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"

_BY_POD = "namespace, pod"
_LEGEND = "{{namespace}}/{{pod}}"


def _gauge(metric: str, how: str = "sum") -> str:
    return top_pods(
        on_release_pods(f"{how} by ({_BY_POD}) ({selector(metric, labels=ENGINE_LABELS)})")
    )


def add_engine_row(board: Board) -> None:
    """Append the engine row (open) to ``board``."""
    board.row(ROW_TITLE)
    board.add(
        timeseries_panel(
            "Engine queue: waiting and running requests",
            "vLLM's scheduler per pod: requests waiting for a slot in the batch "
            f"({WAITING}) and requests in the batch ({RUNNING}), at each scrape. A waiting "
            "queue that grows while running stays flat is a server at capacity: TTFT grows by "
            "the queue time, not by a slower model.",
            [
                Query(_gauge(WAITING), f"{_LEGEND} waiting"),
                Query(_gauge(RUNNING), f"{_LEGEND} running"),
            ],
            "short",
            w=8,
        ),
        timeseries_panel(
            "KV-cache usage",
            f"Share of vLLM's KV-cache blocks in use per pod ({KV_CACHE}, 1 = full). Near "
            "full, vLLM preempts running requests to make room, and their tokens stall.",
            [Query(_gauge(KV_CACHE, "max"), _LEGEND)],
            "percentunit",
            w=8,
        ),
        timeseries_panel(
            "Preemptions per second",
            "Requests vLLM evicted from the batch to free KV cache, per second per pod (the rate "
            f"of {PREEMPTIONS} over each {RATE_INTERVAL} window). Each one recomputes or "
            "swaps the request's cache: a burst of inter-token latency for that stream.",
            [
                Query(
                    top_pods(
                        on_release_pods(
                            f"sum by ({_BY_POD}) (rate({selector(PREEMPTIONS, labels=ENGINE_LABELS)}[{RATE_INTERVAL}]))"
                        )
                    ),
                    _LEGEND,
                )
            ],
            "ops",
            w=8,
        ),
    )
