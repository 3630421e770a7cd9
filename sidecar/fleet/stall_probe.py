"""``/stallz`` for a pod of ``--workers N``: one verdict on the one engine from every
worker's own.

The workers share the model server, so the engine is hung only when the whole pod says so:
requests in flight somewhere, every worker holding some stalled past the threshold with
none moving, and no worker having answered a request whole meanwhile. One worker's stream
that moves, or one worker's request answered within the threshold, shows the engine works,
whatever the others hold; a worker with nothing in flight says nothing about the engine
beyond when it last completed a request. That is the single process's rule
(:func:`sidecar.export.in_flight.stall_probe`) over the union of the workers' requests.

A worker that does not answer (starting, going, busy past the supervisor's timeout) may hold
a stream that moves, so the pod is then judged healthy: a liveness probe that restarts an
engine on what it could not see is worse than one that waits for the next period (the
LLMStreamsStalled alert reads the merged ``/metrics`` and pages anyway).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["pod_stall_probe", "worker_stall_doc"]


def worker_stall_doc(body: bytes) -> dict[str, Any] | None:
    """A worker's ``/stallz`` document, or None when its body is not one."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    keys = ("in_flight", "stalled", "stalled_engine", "seconds_since_completed")
    return doc if isinstance(doc, dict) and all(k in doc for k in keys) else None


def pod_stall_probe(
    docs: Sequence[dict[str, Any] | None], probe_seconds: float
) -> tuple[bool, dict[str, Any]]:
    """(healthy, what the pod saw) from each worker's ``/stallz`` document, in worker order
    (None: that worker did not answer)."""
    answered = [d for d in docs if d is not None]
    silent = [i for i, d in enumerate(docs) if d is None]
    busy = [d for d in answered if d["in_flight"] > 0]
    since = [d["seconds_since_completed"] for d in answered]
    completed = [s for s in since if s is not None]
    hung = (
        not silent
        and bool(busy)
        and all(d["stalled_engine"] for d in busy)
        and all(s >= probe_seconds for s in completed)
    )
    doc: dict[str, Any] = {
        "in_flight": sum(d["in_flight"] for d in answered),
        "stalled": sum(d["stalled"] for d in answered),
        "stall_seconds": probe_seconds,
        "longest_silence_seconds": max(
            (d.get("longest_silence_seconds", 0.0) for d in answered), default=0.0
        ),
        "seconds_since_completed": min(completed, default=None),
        "stalled_engine": hung,
        "workers": [
            {"worker": i, "answered": False}
            if d is None
            else {
                "worker": i,
                "in_flight": d["in_flight"],
                "stalled": d["stalled"],
                "stalled_engine": d["stalled_engine"],
            }
            for i, d in enumerate(docs)
        ],
    }
    if silent:
        doc["reason"] = f"worker {silent[0]} did not answer: judged healthy"
    return not hung, doc
