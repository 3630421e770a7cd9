"""The latency overview: how fast users get tokens, per model, route and pod.

Every figure is computed from the sidecar's own metrics (``sidecar/export/metrics.py``) as the
rules of :mod:`sidecar.tools.slo.aggregates` record them (5m rates per deployment, model and
route), or, for the "Per pod" row (each panel bounded to the top pods) and the detail views,
as the raw series read when drawn; filtered by the namespace, release, model and route
variables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grafana_foundation_sdk.builders import heatmap, timeseries
from grafana_foundation_sdk.models import dashboard as dash_m

from ..slo.aggregates import BASE_LABELS
from .agents import add_agents_row
from .engine import add_engine_row
from .own_health import add_own_health_row
from .panels import Board, Query, heatmap_panel, timeseries_panel
from .queries import (
    TARGET_LABELS,
    Matcher,
    mean,
    quantile,
    ratio_or_zero,
    sum_gauge,
    sum_rate,
    top_pods,
    zero_if_absent,
)
from .stalls import add_stalls_row
from .where_time_goes import add_where_time_goes_row

__all__ = ["UID", "TITLE", "build"]

UID = "llm-sidecar-overview"
TITLE = "LLM sidecar / Latency overview"

REQUESTS = "llm_requests_total"
IN_FLIGHT = "llm_requests_in_flight"
WITHIN_SLO = "llm_requests_within_slo_total"
TOKENS = "llm_tokens_total"
REQUEST_TOKENS = "llm_request_tokens"
TPS = "llm_output_tokens_per_second"
PARSE_ERRORS = "llm_stream_parse_errors_total"
TOKEN_COUNT_SOURCE = "llm_token_count_source_total"
LABEL_OVERFLOW = "llm_label_overflow_total"
SERIES_REFUSED = "llm_series_refused_total"
FINISH_REASONS = "llm_finish_reasons_total"
NON_API = "llm_non_api_requests_total"

OK: tuple[Matcher, ...] = (("outcome", "=", "ok"),)
ERROR: tuple[Matcher, ...] = (("outcome", "=", "error"),)
CANCELLED: tuple[Matcher, ...] = (("outcome", "=", "cancelled"),)
NOT_CANCELLED: tuple[Matcher, ...] = (("outcome", "!=", "cancelled"),)

_MEASURED = (
    "Times start when the sidecar has the request headers; token times are taken when the "
    "sidecar reads the chunk from the inference server, before relaying it, so a slow client "
    "does not inflate them."
)
_QUANTILES = (
    "p50/p90/p99 are histogram_quantile over the rates of the histogram's buckets (the "
    "recorded 5m rates; a detail view's raw buckets over the rate window), summed over the "
    "selected releases, models and routes (all pods): estimates "
    "interpolated inside the bucket that holds the quantile."
)
_HEATMAP = (
    "Each column is the bucket rates at that step (recorded over 5m; a detail view's raw "
    "buckets over the rate window); each cell is a histogram bucket (its upper "
    "bound on the y axis) coloured by observations per second that fell in it."
)


@dataclass(frozen=True, slots=True)
class Latency:
    """A latency histogram and the words that explain it."""

    metric: str
    title: str
    meaning: str
    extra: tuple[Matcher, ...] = ()
    exemplars: bool = True


LATENCIES: tuple[Latency, ...] = (
    Latency(
        "llm_time_to_first_token_seconds",
        "Time to first token (TTFT)",
        "Streamed requests: seconds from the request to the first generated token of any kind "
        "(answer, reasoning or tool call); a role-only first chunk is not a token. Queueing "
        "plus prefill plus network, as the client sees it.",
    ),
    Latency(
        "llm_time_to_first_answer_token_seconds",
        "Time to first answer token",
        "Streamed requests whose first token was reasoning or a tool call: seconds from the "
        "request to the first visible answer token. What a user of a reasoning model waits for "
        "before text appears. Requests that answered straight away are not in it (see TTFT).",
    ),
    Latency(
        "llm_inter_token_latency_seconds",
        "Inter-token latency (ITL)",
        "Every gap between consecutive token-bearing stream events (0 for tokens that arrived "
        "in the same read; a chunk worth k tokens is k equal gaps). Stalls show here first.",
        exemplars=False,
    ),
    Latency(
        "llm_time_per_output_token_seconds",
        "Time per output token (TPOT)",
        "Streamed requests with at least 2 output tokens: (last token - first token) / "
        "(output tokens - 1), one value per request: the average decode step a request saw.",
    ),
    Latency(
        "llm_request_duration_seconds",
        "End-to-end duration of successful requests",
        "Requests with outcome ok: seconds from the request to the last response byte relayed. "
        "Failures and cancellations are left out (their durations say little about speed; see "
        "'Duration by outcome').",
        extra=OK,
    ),
)


def _latency_panels(lat: Latency) -> tuple[timeseries.Panel, heatmap.Panel]:
    queries = [
        Query(
            quantile(q, lat.metric, extra=lat.extra),
            f"p{round(q * 100)}",
            exemplar=lat.exemplars and q == 0.99,
        )
        for q in (0.5, 0.9, 0.99)
    ]
    lines = timeseries_panel(
        f"{lat.title}: p50 / p90 / p99",
        f"{lat.meaning} {_QUANTILES} {_MEASURED}"
        + (" Dots are exemplars (trace ids) when Prometheus stores them." if lat.exemplars else ""),
        queries,
        "s",
    )
    heat = heatmap_panel(
        f"{lat.title}: distribution",
        f"{lat.meaning} {_HEATMAP}",
        Query(sum_rate(f"{lat.metric}_bucket", ("le",), lat.extra)),
        "s",
    )
    return lines, heat


def _traffic(board: Board) -> None:
    board.row("Traffic, errors and goodput")
    board.add(
        timeseries_panel(
            "Requests by outcome and code",
            "Requests finished per second, by outcome and the HTTP status the client got. Outcome "
            "error: the inference server answered 5xx, failed, timed out, died mid-stream or sent "
            "an error inside the stream. Cancelled: the client went away (code 499 when no "
            "response had started). Ok includes 4xx answers (see the code). One count per "
            "request, when it ends.",
            [Query(sum_rate(REQUESTS, ("outcome", "code")), "{{outcome}} {{code}}")],
            "reqps",
            stack=True,
        ),
        timeseries_panel(
            "Error and cancellation ratios",
            "error: share of requests that were not cancelled and failed on the server side (the "
            "availability SLI's bad events; 4xx answers are not errors). cancelled: share of all "
            "requests whose client went away before the end. Both over the recorded 5m "
            "rates; 0 while there are requests and none failed.",
            [
                Query(
                    ratio_or_zero(
                        sum_rate(REQUESTS, extra=ERROR), sum_rate(REQUESTS, extra=NOT_CANCELLED)
                    ),
                    "error",
                ),
                Query(
                    ratio_or_zero(sum_rate(REQUESTS, extra=CANCELLED), sum_rate(REQUESTS)),
                    "cancelled",
                ),
            ],
            "percentunit",
        ),
        _errors_by_type_panel(),
        _finish_reasons_panel(),
        _non_api_panel(),
        timeseries_panel(
            "In-flight requests",
            "Requests being relayed right now (streams and whole answers), by model: the gauge "
            "rises when the request arrives and falls when its last byte is relayed. Compare with "
            "the server's concurrency limit: a growing queue shows up here before TTFT rises.",
            [Query(sum_gauge(IN_FLIGHT, ("model",)), "{{model}}")],
            "short",
            w=6,
            stack=True,
        ),
        timeseries_panel(
            "Goodput",
            "Requests per second that met every latency objective at once (the sidecar's "
            "--slo-ttft-seconds, --slo-tpot-seconds and --slo-e2e-seconds; a 2xx with outcome "
            "ok), against all requests with outcome ok. The gap between the lines is service "
            "that was delivered too slowly.",
            [
                Query(
                    f"{sum_rate(WITHIN_SLO)} or 0 * {sum_rate(REQUESTS, extra=OK)}",
                    "met every objective",
                ),
                Query(sum_rate(REQUESTS, extra=OK), "ok requests"),
            ],
            "reqps",
            w=6,
        ),
        timeseries_panel(
            "Goodput share",
            "Share of ok requests that met every latency objective at once (goodput / ok "
            "requests), over the recorded 5m rates. The SLO dashboard shows the same "
            "ratio from the llm:goodput:ratio_rate5m rule.",
            [
                Query(
                    ratio_or_zero(sum_rate(WITHIN_SLO), sum_rate(REQUESTS, extra=OK)),
                    "goodput share",
                )
            ],
            "percentunit",
            w=6,
        ),
        timeseries_panel(
            "Stream parse errors",
            "Stream events the sidecar's dialect parser could not understand, per second, by "
            "route (the bytes were still relayed unchanged). Non-zero means token figures for "
            "that route may be missing or low: an engine changed its wire format. 0 when the "
            "counter has never moved.",
            [
                Query(
                    zero_if_absent(
                        sum_rate(PARSE_ERRORS, ("route",), labels=(*TARGET_LABELS, "route")),
                        "route",
                    ),
                    "{{route}}",
                )
            ],
            "short",
            w=6,
        ),
    )


def _errors_by_type_panel() -> timeseries.Panel:
    return timeseries_panel(
        "Errors by type (/s)",
        "Failed requests per second by why they failed (the error_type label, a fixed set): "
        "upstream_unreachable (no connection: the server is down or not listening), "
        "upstream_timeout (no answer in time), upstream_status (it answered 5xx: see the code), "
        "upstream_disconnected (it closed the connection, often mid-stream), "
        "upstream_read_timeout (the stream stalled), upstream_stream_truncated (a stream ended "
        "cleanly before it was complete), stream_error (an error event inside a 200 answer), "
        "upstream_invalid_response (broken HTTP), internal (the sidecar's own failure). The "
        "first two are the server or the pod; the rest are the engine failing mid-answer.",
        [Query(sum_rate(REQUESTS, ("error_type",), ERROR), "{{error_type}}")],
        "reqps",
        w=8,
        stack=True,
    )


def _finish_reasons_panel() -> timeseries.Panel:
    by_reason = sum_rate(FINISH_REASONS, ("finish_reason",))
    return timeseries_panel(
        "Finish reasons (share of answers)",
        "Why generation ended, as the server said, in each dialect's words folded into one set: "
        "stop (the model finished, or a stop sequence), length (cut at max_tokens or the context "
        "window), tool_calls (waiting for a tool's result), content_filter (refused or filtered), "
        "other (aborted, unloaded, ...). A rise in length means answers are being cut short; in "
        "content_filter, refused. One per answer (choice), over the rate window (read when drawn).",
        [
            Query(
                f"{by_reason} / on () group_left () {sum_rate(FINISH_REASONS)}", "{{finish_reason}}"
            )
        ],
        "percentunit",
        w=8,
        stack=True,
    )


def _non_api_panel() -> timeseries.Panel:
    return timeseries_panel(
        "Non-API requests through the proxy port (/s)",
        "Requests to paths outside the API route table (the server's /health, /metrics, GET "
        "/v1/models, ...), by method and code: relayed as sent, and counted here only, never in "
        "the request, latency or SLO figures above. A steady rate is usually a probe or a "
        "scraper pointed at the proxy port instead of the admin port.",
        [Query(sum_rate(NON_API, ("method", "code"), labels=TARGET_LABELS), "{{method}} {{code}}")],
        "reqps",
        w=8,
        stack=True,
    )


def _latency(board: Board) -> None:
    board.row("Latency: what users wait for")
    for lat in LATENCIES:
        board.add(*_latency_panels(lat))
    board.add(
        timeseries_panel(
            "Time to first byte (TTFB): p50 / p90 / p99",
            "Seconds from the request to the inference server's response headers. Many servers "
            "send headers at once and the first token later, so a low TTFB with a high TTFT is "
            f"queueing or prefill. {_QUANTILES}",
            [
                Query(
                    quantile(q, "llm_time_to_first_byte_seconds"),
                    f"p{round(q * 100)}",
                    exemplar=q == 0.99,
                )
                for q in (0.5, 0.9, 0.99)
            ],
            "s",
        ),
        timeseries_panel(
            "Duration by outcome: p90",
            "p90 of end-to-end seconds per outcome. Errors that are fast are refusals or "
            "crashes; errors that are slow are timeouts or streams that died late. Cancelled "
            "requests have no duration here (when a client leaves is its choice); "
            f"'Requests by outcome and code' counts them. {_QUANTILES}",
            [Query(quantile(0.9, "llm_request_duration_seconds", ("outcome",)), "{{outcome}}")],
            "s",
        ),
    )


def _tokens(board: Board) -> None:
    board.row("Throughput and tokens")
    board.add(
        timeseries_panel(
            "Decode speed per request",
            "Streamed requests with at least 2 output tokens: (output tokens - 1) / (last token - "
            "first token), one value per request: the tokens per second a user watched arrive. "
            "p10 is the slow tail (10% of requests decoded slower), so it is the line to watch; "
            f"mean is the average over requests. {_QUANTILES}",
            [
                Query(quantile(0.5, TPS), "p50"),
                Query(quantile(0.1, TPS), "p10 (slowest 10%)"),
                Query(mean(TPS), "mean"),
            ],
            "count:tok/s",
        ),
        timeseries_panel(
            "Token throughput by type",
            "Tokens per second through the sidecar, by type: input (prompt) and output from the "
            "response's usage when it reports one, otherwise output counted from the stream (one "
            "per content-bearing event); reasoning is the part of the output spent thinking (most "
            "APIs count it in output too); cached_input is the part of the input served from the "
            "prefix cache.",
            [Query(sum_rate(TOKENS, ("type",)), "{{type}}")],
            "count:tok/s",
        ),
        heatmap_panel(
            "Prompt length distribution",
            "Input tokens per ok request (usage.prompt_tokens or the API's equivalent), as a "
            f'heatmap of the llm_request_tokens{{type="input"}} buckets (powers of 4). {_HEATMAP}',
            Query(sum_rate(f"{REQUEST_TOKENS}_bucket", ("le",), (("type", "=", "input"),))),
            "count:tok",
        ),
        heatmap_panel(
            "Output length distribution",
            "Output tokens per ok request (from usage, else counted from the stream), as a heatmap "
            f'of the llm_request_tokens{{type="output"}} buckets (powers of 4). {_HEATMAP}',
            Query(sum_rate(f"{REQUEST_TOKENS}_bucket", ("le",), (("type", "=", "output"),))),
            "count:tok",
        ),
        timeseries_panel(
            "Mean tokens per request",
            "Average input and output tokens per ok request over the rate window (read when drawn) "
            "(sum / count of llm_request_tokens). Longer prompts raise TTFT; longer outputs raise "
            "end-to-end duration.",
            [Query(mean(REQUEST_TOKENS, ("type",)), "{{type}}")],
            "count:tok",
            w=24,
            h=7,
        ),
    )


def _token_count_sources(board: Board) -> None:
    """How far the token panels can be trusted: the share of counted requests whose output
    count the server reported (usage or the engine's own), by route; and how far the labels
    can: requests filed under 'other', updates the series budget refused. Its own last row,
    so adding it moved no other panel; one line of three, so the rows below stay put."""
    board.row("Token count sources")
    board.add(_exact_counts_panel())
    board.add(_label_overflow_panel())
    board.add(_series_refused_panel())


def _label_overflow_panel() -> timeseries.Panel:
    return timeseries_panel(
        "Requests filed under model/tenant 'other' (/s)",
        "Requests that named a model or tenant but were counted under 'other', by label and "
        "reason: not_listed (the allowlist or the server's own model list does not have the "
        "name), max_values (--max-models / --max-tenants reached) or series_budget (--max-series "
        "reached). A model the server serves never lands here; a steady rate means clients send "
        "names the server does not serve.",
        [
            Query(
                # A reason's series is made at its first overflow: 0 until then.
                zero_if_absent(
                    sum_rate(LABEL_OVERFLOW, ("label", "reason"), labels=TARGET_LABELS), "label"
                ),
                "{{label}} {{reason}}",
            )
        ],
        "reqps",
        w=8,
        h=7,
    )


def _series_refused_panel() -> timeseries.Panel:
    return timeseries_panel(
        "Updates refused by the series budget (/s)",
        "Metric updates whose own series did not fit in --max-series (counted before a series is "
        "made, every family alike), by fate: other (recorded with model and tenant 'other') or "
        "dropped (not recorded: even that row did not fit, so some figures are missing from the "
        "page). Any rate here means the page is full: raise --max-series, or lower --max-models "
        "/ --max-tenants.",
        [Query(sum_rate(SERIES_REFUSED, ("fate",), labels=TARGET_LABELS), "{{fate}}")],
        "ops",
        w=8,
        h=7,
    )


def _exact_counts_panel() -> timeseries.Panel:
    exact = sum_rate(TOKEN_COUNT_SOURCE, ("route",), (("source", "=~", "usage|engine"),))
    counted = sum_rate(TOKEN_COUNT_SOURCE, ("route",), (("source", "!=", "none"),))
    return timeseries_panel(
        "Requests with exact token counts (%)",
        "Of the requests with an output token count, the share whose count the response carried, "
        "by route: usage (asked by the client or sent by the server anyway) or the engine's own "
        "counts (llama.cpp timings, TGI details, Ollama). The rest were estimated from the stream, "
        "one token per content-bearing event, with input tokens unknown. The sidecar never asks "
        "for usage: enable it on the server (vLLM --enable-force-include-usage) to raise this.",
        [Query(ratio_or_zero(exact, counted), "{{route}}")],
        "percentunit",
        w=8,
        h=7,
    )


def _lines(by: tuple[str, ...]) -> Callable[[str], str]:
    """Per pod: the top pods only (a fleet has hundreds); per model: every model."""
    return top_pods if "pod" in by else lambda expr: expr


def _breakdowns(board: Board, by: tuple[str, ...], legend: str, title: str, what: str) -> None:
    lines = _lines(by)
    board.row(title)
    board.add(
        timeseries_panel(
            f"Request rate by {what}",
            f"Requests finished per second, all outcomes, by {what}: the rate of llm_requests_total "
            "over the recorded 5m rates, per pod the raw series over the rate window (one count per "
            "request, when it ends).",
            [Query(lines(sum_rate(REQUESTS, by)), legend)],
            "reqps",
            w=8,
        ),
        timeseries_panel(
            f"Error ratio by {what}",
            f"Share of non-cancelled requests that failed on the server side, by {what}: outcome "
            "error / outcome ok or error, over the recorded 5m rates, per pod the raw series over the "
            "rate window (0 while there is "
            "traffic and no error). 4xx answers are not errors.",
            [
                Query(
                    lines(
                        ratio_or_zero(
                            sum_rate(REQUESTS, by, ERROR), sum_rate(REQUESTS, by, NOT_CANCELLED)
                        )
                    ),
                    legend,
                )
            ],
            "percentunit",
            w=8,
        ),
        timeseries_panel(
            f"In-flight requests by {what}",
            f"Requests being relayed right now, by {what} (the llm_requests_in_flight gauge at each "
            "scrape). Uneven load between pods points at the load balancer.",
            [Query(lines(sum_gauge(IN_FLIGHT, by)), legend)],
            "short",
            w=8,
        ),
        _ttft_by(by, legend, what),
        timeseries_panel(
            f"TPOT p90 by {what}",
            f"90th percentile of time per output token, by {what}: (last token - first token) / "
            f"(output tokens - 1), one value per streamed request. {_QUANTILES}",
            [Query(lines(quantile(0.9, "llm_time_per_output_token_seconds", by)), legend)],
            "s",
            w=8,
        ),
        timeseries_panel(
            f"Output tokens per second by {what}",
            f"Output tokens produced per second by {what}: throughput (the rate of "
            'llm_tokens_total{type="output"}), not the speed one request sees (that is "Decode '
            'speed per request").',
            [Query(lines(sum_rate(TOKENS, by, (("type", "=", "output"),))), legend)],
            "count:tok/s",
            w=8,
        ),
    )


def _ttft_by(by: tuple[str, ...], legend: str, what: str) -> timeseries.Panel:
    """TTFT quantiles per ``what``: p50/p95/p99 per model (where objectives are set), p90 per pod."""
    qs = (0.5, 0.95, 0.99) if what == "model" else (0.9,)
    names = " / ".join(f"p{round(q * 100)}" for q in qs)
    return timeseries_panel(
        f"TTFT {names} by {what}",
        f"{names} of time to first token (streamed requests, first token of any kind), by {what}. {_QUANTILES}",
        [
            Query(
                _lines(by)(quantile(q, "llm_time_to_first_token_seconds", by)),
                legend if len(qs) == 1 else f"{legend} p{round(q * 100)}",
            )
            for q in qs
        ],
        "s",
        w=8,
    )


ENGINE_PHASES = (
    ("llm_upstream_load_seconds", "load"),
    ("llm_upstream_prefill_seconds", "prefill"),
    ("llm_upstream_decode_seconds", "decode"),
)


def _engine(board: Board) -> None:
    """Ollama's and llama.cpp's own timings: collapsed, empty on vLLM (the chart's default)."""
    ttft = "llm_time_to_first_token_seconds"
    prefill = "llm_upstream_prefill_seconds"
    # Mean TTFT over the same deployments and models as report engine timings (histograms
    # are per model, not per route).
    per_model = tuple(label for label in BASE_LABELS if label != "route")
    same = f"and on ({', '.join(per_model)}) {sum_rate(prefill + '_count', per_model)}"
    ttft_mean = (
        f"sum({sum_rate(ttft + '_sum', per_model)} {same}) / "
        f"sum({sum_rate(ttft + '_count', per_model)} {same})"
    )
    load_mean = f"({mean('llm_upstream_load_seconds')} or on () vector(0))"
    board.collapsed_row(
        "Engine timings (Ollama, llama.cpp)",
        timeseries_panel(
            "Engine-reported phases: p50 / p90",
            "The inference engine's own account of each request, read from its stream (Ollama's "
            "load_duration, prompt_eval_duration and eval_duration; llama.cpp's timings): model "
            "load, prompt processing (prefill) and generation (decode), in seconds. Only routes "
            f"whose engine reports them. {_QUANTILES}",
            [
                Query(quantile(q, metric), f"{phase} p{round(q * 100)}")
                for metric, phase in ENGINE_PHASES
                for q in (0.5, 0.9)
            ],
            "s",
        ),
        timeseries_panel(
            "Where TTFT goes: engine vs overhead (mean)",
            "Mean time to first token of requests whose engine reports its timings, split into "
            "the engine's model load and prefill (its own account) and the rest: queueing before "
            "the engine, HTTP and network between it and the sidecar. A growing overhead with a "
            "flat prefill is a queue, not a slow model.",
            [
                Query(load_mean, "load"),
                Query(mean(prefill), "prefill"),
                Query(f"{ttft_mean} - {load_mean} - {mean(prefill)}", "queueing and network"),
            ],
            "s",
            stack=True,
        ),
    )


def build() -> dash_m.Dashboard:
    """The dashboard model (grafana-foundation-sdk), ready to serialise."""
    board = Board(
        UID,
        TITLE,
        "How fast users get tokens, measured on the wire by llm-sidecar: TTFT, ITL, TPOT, "
        "end-to-end latency, token throughput and goodput, per model, route and pod. "
        "Generated by `python -m sidecar.tools.dashboards`; DO NOT EDIT (changes are lost on the next "
        "generation).",
        ["llm-sidecar", "llm", "latency"],
    )
    _traffic(board)
    _latency(board)
    add_agents_row(board)  # cache-class TTFT, tool calls, requests' own objectives
    _tokens(board)
    _breakdowns(board, ("model",), "{{model}}", "Per model", "model")
    _breakdowns(board, ("namespace", "pod"), "{{namespace}}/{{pod}}", "Per pod", "pod")
    add_engine_row(
        board
    )  # the engine's own metrics (vLLM), open: sidecar/tools/dashboards/engine.py
    add_where_time_goes_row(board)
    add_own_health_row(board)  # the sidecar's own CPU, memory, fds and build
    _token_count_sources(board)
    add_stalls_row(board)  # phases and stalled streams, read live (stalls.py)
    _engine(board)  # Ollama's and llama.cpp's timings, collapsed
    return board.build()
