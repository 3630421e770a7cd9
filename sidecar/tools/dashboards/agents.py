"""The overview's row for agents and caches: TTFT by prefix-cache class, time to first tool
call, tool-call assembly, tool calls per response, and the requests' own objectives.

Why apart from the TTFT panels: a request whose prompt was mostly in the prefix cache starts
in milliseconds and one that missed pays the whole prefill, so one TTFT line hides both a
cache regression and a prefill regression; and an agent waits for the first tool call and
then for its arguments to finish, which TTFT (any first token) does not say.
"""

from __future__ import annotations

from .panels import Board, Query, timeseries_panel
from .queries import TARGET_LABELS, quantile, ratio_or_zero, sum_rate

__all__ = ["ROW_TITLE", "add_agents_row"]

INVALID = "llm_request_objective_invalid_total"
ROW_TITLE = "Agents and caches: cache-class TTFT, tool calls, requests' own objectives"

_QUANTILES = (
    "histogram_quantile over the rate of the buckets in each window; no line while no request of "
    "that kind came."
)


def _quantiles(metric: str, qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> list[Query]:
    return [Query(quantile(q, metric), f"p{round(q * 100)}", exemplar=q == qs[-1]) for q in qs]


def add_agents_row(board: Board) -> None:
    cache = "llm_time_to_first_token_by_cache_seconds"
    objectives = "llm_request_objectives_total"
    board.row(ROW_TITLE)
    board.add(
        timeseries_panel(
            "TTFT by prefix-cache class: p50 / p90",
            "Streamed requests' TTFT split by how much of the prompt the server's prefix cache "
            "held (usage's cached tokens over prompt tokens): none (a full prefill: judge prefill "
            "speed here), partial (under half), most (half or more: a multi-turn agent's history). "
            "Requests whose server did not report cached tokens (vLLM needs "
            "--enable-prompt-tokens-details) are in the TTFT panels only, not split here. "
            f"{_QUANTILES}",
            [
                Query(quantile(q, cache, ("cache",)), f"{{{{cache}}}} p{round(q * 100)}")
                for q in (0.5, 0.9)
            ],
            "s",
        ),
        timeseries_panel(
            "Requests by prefix-cache class",
            "Streamed requests per second by cache class. More 'none' at the same traffic is a "
            "cache that stopped hitting (eviction, a prompt that changed at its start, a router "
            "that no longer keeps a conversation on one replica). unknown: the server did not "
            "report cached tokens (all streamed requests less those with a class).",
            [
                Query(sum_rate(f"{cache}_count", ("cache",)), "{{cache}}"),
                Query(
                    f"{sum_rate('llm_time_to_first_token_seconds_count')} - "
                    f"({sum_rate(f'{cache}_count')} or on () vector(0))",
                    "unknown",
                ),
            ],
            "reqps",
            stack=True,
        ),
        timeseries_panel(
            "Time to first tool call: p50 / p90 / p99",
            "Streamed responses with a tool call: seconds from the request to the first piece of "
            "the first call (its id and name), what an agent waits for before it knows what to "
            f"do. Reasoning before the call counts in it. {_QUANTILES}",
            _quantiles("llm_time_to_first_tool_call_seconds"),
            "s",
        ),
        timeseries_panel(
            "Tool-call assembly: p50 / p90 / p99",
            "Every tool call: seconds from its first piece to its last argument piece, what an "
            "agent waits for once the call began before it can run it; parallel calls are one "
            f"observation each, a call sent whole (Ollama) is 0. {_QUANTILES}",
            _quantiles("llm_tool_call_assembly_seconds"),
            "s",
        ),
        timeseries_panel(
            "Tool calls per response",
            "Responses with a tool call: the mean number of calls per response (parallel tool "
            "calls), and tool-calling responses per second.",
            [
                Query(
                    f"{sum_rate('llm_tool_calls_per_response_sum')} / {sum_rate('llm_tool_calls_per_response_count')}",
                    "calls per response",
                ),
                Query(sum_rate("llm_tool_calls_per_response_count"), "responses/s"),
            ],
            "short",
        ),
        timeseries_panel(
            "Requests' own objectives met",
            "Share of streamed requests that met the objective they asked for (x-slo-ttft-ms, "
            "x-slo-tpot-ms; else the model's defaults), per objective: all is goodput against "
            "each client's own objectives. Bad header values are ignored and counted in "
            "llm_request_objective_invalid_total.",
            [
                Query(
                    ratio_or_zero(
                        sum_rate(objectives, ("objective",), (("result", "=", "met"),)),
                        sum_rate(objectives, ("objective",)),
                    ),
                    "{{objective}}",
                )
            ],
            "percentunit",
        ),
        timeseries_panel(
            "Objective headers ignored",
            "Objective headers per second that were not a positive number of milliseconds up to a "
            "day (x-slo-ttft-ms, x-slo-tpot-ms: 0, negative, a unit, not a number): ignored, the "
            "model's default judged the request instead, and the client got its answer as ever. "
            "Lasting traffic here is a client sending seconds or a typo.",
            # No model label on this family (a bad header is the client's, whatever model).
            [
                Query(
                    sum_rate(INVALID, ("objective",), labels=(*TARGET_LABELS, "route")),
                    "{{objective}}",
                )
            ],
            "reqps",
        ),
    )
