"""Every name the SLO rules use or produce, in one place.

Recording rules follow Prometheus' ``level:metric:operations`` convention with the ``llm``
level, and carry the label ``slo`` (the objective's name) and the spec's grouping labels
(by default ``cluster``, ``namespace`` and ``model``; a label the series lack stays absent)::

    llm:sli_bad_events:rate5m          bad events/s over the base window (the shortest)
    llm:sli_events:rate5m              all events/s over the base window
    llm:sli_error:ratio_rate<W>        share of bad events over window W (5m ... 3d, and the period)
    llm:burn_rate:ratio_rate<W>        that share divided by the error budget (1 - target)
    llm:error_budget_remaining:ratio   1 - error ratio over the period / error budget
    llm:goodput:rate5m                 requests/s that met every latency objective (goodput)
    llm:goodput:ratio_rate5m           goodput / ok requests

Alerts are ``LLM<Objective>BurnRate`` (one name per objective; labels ``severity`` = page or
ticket, ``long_window``, ``short_window``, ``slo``, ``model``), ``LLMSidecarDown`` and
``LLMNoTrafficData``. Each links to ``docs/runbooks.md#runbook-<alert name in lower case>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...base.buckets import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, TTFT_BY_CACHE_BUCKETS
from .windows import format_duration

__all__ = [
    "LEVEL",
    "LABEL_SLO",
    "LABEL_MODEL",
    "LABEL_SEVERITY",
    "LABEL_LONG_WINDOW",
    "LABEL_SHORT_WINDOW",
    "LABEL_PROMPT_CLASS",
    "TARGET_LABELS",
    "LABEL_RELEASE",
    "REQUESTS_TOTAL",
    "REQUESTS_WITHIN_SLO_TOTAL",
    "ERROR_BUDGET_REMAINING",
    "GOODPUT_RATE",
    "GOODPUT_RATIO",
    "ALERT_TARGET_DOWN",
    "ALERT_NO_TRAFFIC",
    "ALERT_HISTORY_SHORT",
    "sli_bad_events_record",
    "sli_events_record",
    "LatencySLI",
    "LATENCY_SLIS",
    "LABEL_CACHE",
    "TTFT_BY_CACHE_HISTOGRAM",
    "CACHE_CLASSES_JUDGED",
    "latency_sli",
    "SLI_KINDS",
    "sli_error_record",
    "burn_rate_record",
    "alert_name",
    "runbook_anchor",
    "group_name",
    "HEALTH_GROUP",
]

LEVEL = "llm"

# Labels.
LABEL_SLO = "slo"
LABEL_MODEL = "model"
LABEL_SEVERITY = "severity"
LABEL_LONG_WINDOW = "long_window"
LABEL_SHORT_WINDOW = "short_window"
LABEL_PROMPT_CLASS = "prompt_class"
"""On ``llm_time_to_first_token_seconds`` only: the request's prompt-length class."""

LABEL_TENANT = "tenant"
"""The opt-in tenant label (``--tenant-header``, sidecar/base/tenant.py)."""
TENANT_SLIS = frozenset({"availability", "ttft"})
"""SLIs whose series carry ``tenant`` when it is on (``llm_requests_total``, the TTFT histogram;
goodput's ``llm_requests_within_slo_total`` too). The per-token histograms and e2e do not, to
keep their series count bounded, so they cannot be grouped by tenant."""

TARGET_LABELS: tuple[str, ...] = (
    "cluster", "namespace", "pod", "service", "job", "instance", "llm_release",
)  # fmt: skip
"""Labels a series gets from where it was scraped, not from the sidecar: Prometheus' ``job`` and
``instance``; the Prometheus Operator's PodMonitor/ServiceMonitor add ``namespace``, ``pod``
(and ``service``), the chart's monitors ``llm_release`` (:data:`LABEL_RELEASE`); ``cluster``
comes from an external label or a Thanos/Mimir ruler."""

LABEL_RELEASE = "llm_release"
"""Which install of the chart (or of deploy/kubernetes/) judges a series: ``<namespace of its
PodMonitor>/<PodMonitor name>`` (the release's namespace and full name), attached by the
chart's monitors at scrape time. Every rule of a release selects it and groups by it, so a
release judges exactly the pods its monitor scrapes, in whichever namespace they run, and two
releases of one name in two namespaces stay apart. Not ``deployment``: kube-state-metrics'
``deployment`` is a Deployment's name, which this is not in monitoring-only mode."""

# What the sidecar exports (sidecar/export/metrics.py; a test compares these with a live /metrics).
REQUESTS_TOTAL = "llm_requests_total"
REQUESTS_WITHIN_SLO_TOTAL = "llm_requests_within_slo_total"


@dataclass(frozen=True, slots=True)
class LatencySLI:
    """A latency SLI: the share of observations at or under a threshold of one histogram."""

    histogram: str
    buckets: tuple[float, ...]
    matchers: tuple[tuple[str, str], ...]
    """Extra equality matchers on the histogram's series."""
    events: str
    """What one observation is, for alert text."""
    measure: str
    """What is compared with the threshold, for alert text."""


LATENCY_SLIS: dict[str, LatencySLI] = {
    "ttft": LatencySLI(
        "llm_time_to_first_token_seconds", TTFT_BUCKETS, (),
        "streamed requests", "time to first token",
    ),
    "tpot": LatencySLI(
        "llm_time_per_output_token_seconds", ITL_BUCKETS, (),
        "streamed requests", "time per output token",
    ),
    "itl": LatencySLI(
        "llm_inter_token_latency_seconds", ITL_BUCKETS, (),
        "gaps between tokens", "inter-token latency",
    ),
    # Only requests that succeeded: failures are the availability SLO's, and a cancelled
    # request's duration is the client's choice.
    "e2e": LatencySLI(
        "llm_request_duration_seconds", E2E_BUCKETS, (("outcome", "ok"),),
        "successful requests", "end-to-end duration",
    ),
}  # fmt: skip

SLI_KINDS: tuple[str, ...] = ("availability", *LATENCY_SLIS)

LABEL_CACHE = "cache"
"""On ``llm_time_to_first_token_by_cache_seconds`` only: the prefix-cache class."""
TTFT_BY_CACHE_HISTOGRAM = "llm_time_to_first_token_by_cache_seconds"
CACHE_CLASSES_JUDGED: tuple[str, ...] = ("none", "partial", "most")
"""The cache classes a TTFT objective may be judged on (``cache_class`` in the spec); not
``unknown``: a server that does not report cached tokens gives nothing to judge a class on."""
_CACHE_EVENTS = {
    "none": "streamed requests that missed the prefix cache",
    "partial": "streamed requests with under half the prompt cached",
    "most": "streamed requests with half or more of the prompt cached",
}


def latency_sli(sli: str, cache_class: str | None = None) -> LatencySLI:
    """The histogram an objective reads. With ``cache_class`` (TTFT only), the companion
    histogram by prefix-cache class (sidecar/export/metrics.py; its own bounds,
    ``TTFT_BY_CACHE_BUCKETS``, so a class's threshold is one of those), narrowed to that
    class: ``none`` judges prefill alone, as the cache neither helped nor hid it."""
    if cache_class is None:
        return LATENCY_SLIS[sli]
    if sli != "ttft" or cache_class not in _CACHE_EVENTS:
        raise ValueError(f"no latency SLI for {sli} in cache class {cache_class!r}")
    return LatencySLI(
        TTFT_BY_CACHE_HISTOGRAM, TTFT_BY_CACHE_BUCKETS, ((LABEL_CACHE, cache_class),),
        _CACHE_EVENTS[cache_class], "time to first token",
    )  # fmt: skip


# Recording rules.
ERROR_BUDGET_REMAINING = f"{LEVEL}:error_budget_remaining:ratio"
GOODPUT_RATE = f"{LEVEL}:goodput:rate5m"
GOODPUT_RATIO = f"{LEVEL}:goodput:ratio_rate5m"


def sli_error_record(window: int) -> str:
    """``llm:sli_error:ratio_rate5m`` for a window of 300 s."""
    return f"{LEVEL}:sli_error:ratio_rate{format_duration(window)}"


def sli_bad_events_record(window: int) -> str:
    """``llm:sli_bad_events:rate5m``: bad events/s over the base window."""
    return f"{LEVEL}:sli_bad_events:rate{format_duration(window)}"


def sli_events_record(window: int) -> str:
    """``llm:sli_events:rate5m``: all events/s (good and bad) over the base window."""
    return f"{LEVEL}:sli_events:rate{format_duration(window)}"


def burn_rate_record(window: int) -> str:
    """``llm:burn_rate:ratio_rate1h`` for a window of 3600 s."""
    return f"{LEVEL}:burn_rate:ratio_rate{format_duration(window)}"


# Alerts.
ALERT_TARGET_DOWN = "LLMSidecarDown"
ALERT_NO_TRAFFIC = "LLMNoTrafficData"
ALERT_HISTORY_SHORT = "LLMSLOHistoryShort"
_ACRONYMS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "slo": "SLO", "llm": "LLM"}


def alert_name(objective: str) -> str:
    """``ttft`` -> ``LLMTTFTBurnRate``; ``ttft-long-context`` -> ``LLMTTFTLongContextBurnRate``."""
    parts = [p for p in re.split(r"[-_]", objective) if p]
    return "LLM" + "".join(_ACRONYMS.get(p, p[:1].upper() + p[1:]) for p in parts) + "BurnRate"


def runbook_anchor(alert: str) -> str:
    """docs/runbooks.md's heading ``## Runbook: LLMTTFTBurnRate`` has the anchor ``runbook-llmttftburnrate``."""
    return "runbook-" + alert.lower()


# Rule groups: one per objective (its records before its alerts, so the alerts read the
# records of the same evaluation), one for the sidecar's own health.
HEALTH_GROUP = "llm-sidecar-health"


def group_name(objective: str) -> str:
    return f"llm-sidecar-slo-{objective}"
