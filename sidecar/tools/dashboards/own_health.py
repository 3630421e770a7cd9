"""The sidecar's own health: its CPU, memory and file descriptors per pod, and what runs
(version, whether the C speedups are loaded).

The ``process_*`` series are prometheus_client's ProcessCollector, the conventional names,
which the inference server in the same pod exports too (vLLM's /metrics has them, and the
chart scrapes that page through the sidecar's admin port as job ``llm-engine``, with the
same ``namespace``, ``pod`` and ``instance``). Only the sidecar's page has
``llm_sidecar_build_info``, so ``and on (job, instance)`` with it keeps the sidecar's own
series and drops the engine's, whatever the jobs are called. None of these series has
``model`` or ``route``: only the target-label filters apply. Nothing records the process
series: each per-pod panel draws the top pods only; the builds panel reads the recorded count
of sidecars per version.
"""

from __future__ import annotations

from .panels import Board, Query, timeseries_panel
from .queries import RATE_INTERVAL, TARGET_LABELS, selector, sum_gauge, top_pods

__all__ = ["ROW_TITLE", "BUILD_INFO", "add_own_health_row", "own"]

ROW_TITLE = "The sidecar's own health: CPU, memory, file descriptors"
BUILD_INFO = "llm_sidecar_build_info"

_BY_POD = "namespace, pod"
_POD = "{{namespace}}/{{pod}}"


def own(expr: str) -> str:
    """``expr`` kept to the sidecar's own scrape targets (the module docstring)."""
    return f"{expr} and on (job, instance) {selector(BUILD_INFO, labels=TARGET_LABELS)}"


def _per_pod(expr: str) -> str:
    return f"sum by ({_BY_POD}) ({own(expr)})"


def _top(expr: str) -> str:
    """Raw per-pod series (nothing records them): the top pods only."""
    return top_pods(expr)


def add_own_health_row(board: Board) -> None:
    cpu = f"rate({selector('process_cpu_seconds_total', labels=TARGET_LABELS)}[{RATE_INTERVAL}])"
    board.row(ROW_TITLE)
    board.add(
        timeseries_panel(
            "Sidecar CPU (cores)",
            "CPU seconds per second the sidecar process used (user + system, process_cpu_seconds_total), "
            "per pod: 1 is one whole core. The relay is one event loop, so a pod near 1 is "
            "saturated and adds latency to every stream it relays. A pod whose build runs "
            "without the C speedups (see 'Sidecar builds') uses about twice the CPU per token.",
            [Query(_top(_per_pod(cpu)), _POD)],
            "short",
            w=6,
        ),
        timeseries_panel(
            "Sidecar memory (resident)",
            "Resident memory of the sidecar process per pod (process_resident_memory_bytes). "
            "Request bodies held for inspection and the /metrics page are the large users; a "
            "steady climb under steady traffic is a leak.",
            [
                Query(
                    _top(_per_pod(selector("process_resident_memory_bytes", labels=TARGET_LABELS))),
                    _POD,
                )
            ],
            "bytes",
            w=6,
        ),
        timeseries_panel(
            "Sidecar open file descriptors (share of limit)",
            "Open file descriptors of the sidecar process / its limit (process_open_fds / "
            "process_max_fds), per pod. Each client and upstream connection holds one; near 1 "
            "new connections are refused (EMFILE).",
            [
                Query(
                    _top(
                        f"{_per_pod(selector('process_open_fds', labels=TARGET_LABELS))} / "
                        f"{_per_pod(selector('process_max_fds', labels=TARGET_LABELS))}"
                    ),
                    _POD,
                )
            ],
            "percentunit",
            w=6,
        ),
        timeseries_panel(
            "Sidecar builds",
            "Pods per sidecar version and C speedups state (llm_sidecar_build_info). speedups "
            "off: the package was installed without a C compiler, and the relay costs about "
            "twice the CPU per token (the start line and --version warn too); the image always "
            "has them. Two versions at once is a rollout.",
            [
                Query(
                    sum_gauge(BUILD_INFO, ("version", "speedups"), labels=TARGET_LABELS),
                    "{{version}} speedups {{speedups}}",
                )
            ],
            "short",
            w=6,
        ),
    )
