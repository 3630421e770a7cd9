"""The sidecar's Prometheus families, as data: one row per family (its name under the ``llm_``
namespace, type, help, labels and buckets). :data:`FAMILIES`, the request figures, from which
:class:`~sidecar.export.metrics.SidecarMetrics` builds the registry, in this order (the page's
order); then the sidecar's own (:data:`OWN_FAMILIES`: its build, its OTLP exports' health, a
pod's workers) and the capacity view's (:data:`CAPACITY_FAMILIES`). :data:`EVERY_FAMILY` is all
of them. docs/metrics.md and docs/design.md are checked against the registry built from it
(tests/unit/export/test_metrics_docs.py), and every series the dashboards and the rules read against
it too (tests/unit/export/test_series_names.py).

The opt-in ``tenant`` label (sidecar/base/tenant.py) goes last on the families marked
``tenant``, the ones that answer "who": requests, tokens, TTFT, goodput and per-request
objectives. Off, their label sets are unchanged. Label values are bounded where they are
made: ``model`` and ``tenant`` by their labelers (sidecar/base/labels.py), ``route`` by the
route table, ``outcome``, ``error_type`` and ``code`` by the verdict
(sidecar/base/outcomes.py), the rest by fixed sets (docs/metrics.md, "Label bounds").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..base.buckets import (
    E2E_BUCKETS,
    ENGINE_PHASE_BUCKETS,
    ITL_BUCKETS,
    OVERHEAD_BUCKETS,
    TOKEN_COUNT_BUCKETS,
    TOOL_CALL_COUNT_BUCKETS,
    TOOL_CALL_SECONDS_BUCKETS,
    TPS_BUCKETS,
    TTFB_BUCKETS,
    TTFT_BUCKETS,
    TTFT_BY_CACHE_BUCKETS,
)
from ..measure.concurrency import BANDS

__all__ = [
    "CAPACITY_FAMILIES",
    "COUNTER",
    "EVERY_FAMILY",
    "FAMILIES",
    "GAUGE",
    "HISTOGRAM",
    "OWN_FAMILIES",
    "Family",
    "NAMESPACE",
    "family_row",
]

NAMESPACE = "llm"
COUNTER: Literal["counter"] = "counter"
GAUGE: Literal["gauge"] = "gauge"
HISTOGRAM: Literal["histogram"] = "histogram"
Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class Family:
    """One family: ``attr``, the SidecarMetrics attribute that holds it; ``name`` under the
    namespace; ``kind``; ``help``; ``labels`` (``tenant`` appended when ``tenant`` and the
    option is on); ``buckets`` of a histogram."""

    attr: str
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] | None = None
    tenant: bool = False

    def label_names(self, tenants: bool) -> tuple[str, ...]:
        return (*self.labels, "tenant") if self.tenant and tenants else self.labels

    def make(self, registry: CollectorRegistry, tenants: bool) -> Counter | Gauge | Histogram:
        labels = self.label_names(tenants)
        if self.kind == HISTOGRAM:
            assert self.buckets is not None, self.name
            return Histogram(
                self.name, self.help, labels, buckets=self.buckets,
                registry=registry, namespace=NAMESPACE,
            )  # fmt: skip
        made = Counter if self.kind == COUNTER else Gauge
        return made(self.name, self.help, labels, registry=registry, namespace=NAMESPACE)


FAMILIES: tuple[Family, ...] = (
    Family(
        "requests",
        "requests",
        COUNTER,
        "API requests (the route table's) by final outcome, HTTP status and error "
        "type: why an error or cancel happened (upstream_unreachable, "
        "upstream_stream_truncated, stream_error, ... a fixed set; 'none' when ok).",
        ("model", "route", "code", "outcome", "error_type"),
        tenant=True,
    ),
    Family(
        "finish_reasons",
        "finish_reasons",
        COUNTER,
        "Why generation ended, as the response said (one per choice): stop, length "
        "(cut at max_tokens), tool_calls, content_filter or other; each dialect's "
        "words folded into these.",
        ("model", "route", "finish_reason"),
    ),
    Family(
        "non_api",
        "non_api_requests",
        COUNTER,
        "Requests through the proxy port to a path outside the API route table (the "
        "server's /health, /metrics, GET /v1/models, ...): relayed, counted here "
        "only, never in llm_requests_total or the SLIs.",
        ("method", "code", "outcome"),
    ),
    Family(
        "in_flight",
        "requests_in_flight",
        GAUGE,
        "Requests being relayed now.",
        ("model", "route"),
    ),
    Family(
        "duration",
        "request_duration_seconds",
        HISTOGRAM,
        "End-to-end seconds from request headers received to the last response byte relayed.",
        ("model", "outcome"),
        E2E_BUCKETS,
    ),
    Family(
        "ttfb",
        "time_to_first_byte_seconds",
        HISTOGRAM,
        "Seconds from request headers received to upstream response headers.",
        ("model",),
        TTFB_BUCKETS,
    ),
    Family(
        "ttft",
        "time_to_first_token_seconds",
        HISTOGRAM,
        "Streamed requests: seconds to the first generated token of any kind "
        "(content, reasoning or tool call); a role-only chunk is not a token. "
        "prompt_class: the input-token class (--ttft-prompt-classes), 'unknown' when "
        "the response did not report the count, 'all' when no classes are configured.",
        ("model", "prompt_class"),
        TTFT_BUCKETS,
        tenant=True,
    ),
    Family(
        "ttfat",
        "time_to_first_answer_token_seconds",
        HISTOGRAM,
        "Streamed requests whose first token was reasoning or a tool call: seconds to "
        "the first answer (non-reasoning) token.",
        ("model",),
        TTFT_BUCKETS,
    ),
    Family(
        "itl",
        "inter_token_latency_seconds",
        HISTOGRAM,
        "Every gap between consecutive token-bearing stream events (0 for tokens that "
        "arrived together).",
        ("model",),
        ITL_BUCKETS,
    ),
    Family(
        "tpot",
        "time_per_output_token_seconds",
        HISTOGRAM,
        "Streamed requests: (last token - first token) / (output tokens - 1).",
        ("model",),
        ITL_BUCKETS,
    ),
    Family(
        "tps",
        "output_tokens_per_second",
        HISTOGRAM,
        "Streamed requests: decode speed, (output tokens - 1) / (last token - first token).",
        ("model",),
        TPS_BUCKETS,
    ),
    Family(
        "tokens",
        "tokens",
        COUNTER,
        "Tokens by type, from the response's usage, else the engine's own counts in "
        "its stream; otherwise output tokens are estimated from the stream, one per "
        "content-bearing event, and input is not counted "
        "(llm_token_count_source_total).",
        ("model", "route", "type"),
        tenant=True,
    ),
    Family(
        "request_tokens",
        "request_tokens",
        HISTOGRAM,
        "Tokens per request by type (input, output): prompt and output length "
        "distributions; usage or the engine's counts when reported, else output "
        "estimated from the stream.",
        ("model", "type"),
        TOKEN_COUNT_BUCKETS,
    ),
    Family(
        "within_slo",
        "requests_within_slo",
        COUNTER,
        "Goodput: 2xx ok requests that met every latency objective at once (TTFT, "
        "TPOT, e2e thresholds from the sidecar's config).",
        ("model",),
        tenant=True,
    ),
    Family(
        "request_objectives",
        "request_objectives",
        COUNTER,
        "Streamed API requests judged against their own latency objectives "
        "(x-slo-ttft-ms / x-slo-tpot-ms headers, else the model's defaults): "
        "objective ttft, tpot, or all (ok 2xx and every judged objective met: goodput "
        "against what the client asked for); result met or missed. Never sum over "
        "objective.",
        ("model", "objective", "result"),
        tenant=True,
    ),
    Family(
        "request_objective_invalid",
        "request_objective_invalid",
        COUNTER,
        "Objective headers (x-slo-ttft-ms, x-slo-tpot-ms) that were not a positive "
        "number of milliseconds up to a day: ignored (the default applied), never an "
        "error for the client.",
        ("route", "objective"),
    ),
    Family(
        "ttft_by_cache",
        "time_to_first_token_by_cache_seconds",
        HISTOGRAM,
        "Streamed requests: TTFT again, by how much of the prompt the server's prefix "
        "cache held (usage's cached tokens over prompt tokens): none, partial (< "
        "half), most (>= half), unknown (not reported; never counted as a miss).",
        ("model", "cache"),
        TTFT_BY_CACHE_BUCKETS,
    ),
    Family(
        "time_to_first_tool_call",
        "time_to_first_tool_call_seconds",
        HISTOGRAM,
        "Streamed requests with a tool call: seconds from request headers received to "
        "the first piece of the first tool call (its id and name).",
        ("model",),
        TOOL_CALL_SECONDS_BUCKETS,
    ),
    Family(
        "tool_call_assembly",
        "tool_call_assembly_seconds",
        HISTOGRAM,
        "Every tool call of a streamed response: seconds from its first piece to its "
        "last argument piece (0 for a call sent whole); parallel calls are one "
        "observation each.",
        ("model",),
        TOOL_CALL_SECONDS_BUCKETS,
    ),
    Family(
        "tool_calls_per_response",
        "tool_calls_per_response",
        HISTOGRAM,
        "Streamed responses with a tool call: how many calls (client tools) it made.",
        ("model",),
        TOOL_CALL_COUNT_BUCKETS,
    ),
    Family(
        "upstream_load",
        "upstream_load_seconds",
        HISTOGRAM,
        "Model load time reported by the engine in its stream.",
        ("model",),
        ENGINE_PHASE_BUCKETS,
    ),
    Family(
        "upstream_prefill",
        "upstream_prefill_seconds",
        HISTOGRAM,
        "Prompt processing time reported by the engine in its stream.",
        ("model",),
        ENGINE_PHASE_BUCKETS,
    ),
    Family(
        "upstream_decode",
        "upstream_decode_seconds",
        HISTOGRAM,
        "Generation time reported by the engine in its stream.",
        ("model",),
        ENGINE_PHASE_BUCKETS,
    ),
    Family(
        "upstream_queue",
        "upstream_queue_seconds",
        HISTOGRAM,
        "Time the request waited in the engine's queue before it ran, as the engine "
        "reported it (vLLM per-request metrics, TGI x-queue-time, SGLang meta_info).",
        ("model",),
        ENGINE_PHASE_BUCKETS,
    ),
    Family(
        "overhead",
        "sidecar_overhead_seconds",
        HISTOGRAM,
        "Time the sidecar itself added, per request and direction: request (body in "
        "-> written to the upstream) and response (upstream head in -> written to the "
        "client).",
        ("direction",),
        OVERHEAD_BUCKETS,
    ),
    Family(
        "parse_errors",
        "stream_parse_errors",
        COUNTER,
        "Stream events the dialect could not understand (the bytes were still relayed).",
        ("route",),
    ),
    Family(
        "token_count_source",
        "token_count_source",
        COUNTER,
        "API requests by where their output token count came from: usage (the "
        "response's usage object), engine (the engine's own counts in its stream), "
        "estimated (counted from the stream; input unknown) or none. One per request.",
        ("model", "route", "source"),
    ),
    Family(
        "label_overflow",
        "label_overflow",
        COUNTER,
        "Requests whose model or tenant label value became 'other' although they "
        "named one: reason not_listed (the allowlist or the upstream's model list "
        "does not have it), max_values (--max-models / --max-tenants reached) or "
        "series_budget (--max-series reached).",
        ("label", "reason"),
    ),
    Family(
        "series_refused",
        "series_refused",
        COUNTER,
        "Updates whose own series did not fit in --max-series (counted before a "
        "series is made, every family alike): fate 'other' (recorded with model and "
        "tenant 'other') or 'dropped' (not recorded: even that row did not fit).",
        ("fate",),
    ),
)

OWN_FAMILIES: tuple[Family, ...] = (
    Family(
        "build_info",
        "sidecar_build_info",
        GAUGE,
        "Always 1: the running sidecar's version, Python version, and speedups 'on' when its "
        "C byte checks are loaded ('off': a build without a C compiler, about 2x the CPU per "
        "token).",
        ("version", "python", "speedups"),
    ),
    Family(
        "otlp_export_failures",
        "sidecar_otlp_export_failures",
        COUNTER,
        "OTLP exports (batches of spans or metrics) that failed, by signal: the collector "
        "unreachable, refusing, or too slow. Telemetry lost, the relay unaffected.",
        ("signal",),
    ),
    Family(
        "restarts",
        "sidecar_worker_restarts",
        COUNTER,
        "Worker processes that exited unasked and were replaced (--workers).",
        (),
    ),
    Family(
        "running",
        "sidecar_workers",
        GAUGE,
        "Worker processes running (--workers).",
        (),
    ),
)
"""The sidecar's own health: its build (``SidecarMetrics``), its OTLP exports'
(sidecar/export/otlp_health.py, a collector that reads the exporters' counts) and a pod's
workers (sidecar/fleet/supervisor.py, on the supervisor's page)."""

CAPACITY_FAMILIES: tuple[Family, ...] = (
    Family(
        "itl",
        "inter_token_latency_by_concurrency_seconds",
        HISTOGRAM,
        "Every llm_inter_token_latency_seconds gap again, by the band (upper bound: "
        + ", ".join(BANDS)
        + ") of this sidecar's streams of the model decoding when the gap ended. One gap "
        "per output token after a stream's first: its count is the decode tokens at the band.",
        ("model", "concurrency"),
        ITL_BUCKETS,
    ),
    Family(
        "seconds",
        "decode_seconds_by_concurrency",
        COUNTER,
        "Wall seconds with at least one stream of the model decoding, by decode-concurrency band.",
        ("model", "concurrency"),
    ),
)
"""The capacity view's load-conditioned decode families (sidecar/export/capacity.py)."""

EVERY_FAMILY: tuple[Family, ...] = FAMILIES + OWN_FAMILIES + CAPACITY_FAMILIES
"""Every family the sidecar and a pod's supervisor put on a page (beside the ``process_*``
families of client_python's process collector and the live view's gauges,
sidecar/export/in_flight.py)."""


def family_row(table: tuple[Family, ...], attr: str) -> Family:
    """The row of ``table`` held under ``attr``."""
    for row in table:
        if row.attr == attr:
            return row
    raise KeyError(attr)
