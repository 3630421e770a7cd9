"""How many workers ``--workers auto`` means: the cores this container may use.

``os.cpu_count()`` is the node's cores, not the container's: a pod limited to 2 CPUs on a
64-core node would start 64 workers that the kernel then throttles (CFS quota) in turn,
which is worse than 2. So the limit comes first: cgroup v2's ``cpu.max`` (``quota period``,
or ``max``), else cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, rounded up; then
the CPUs the process may run on (``sched_getaffinity``: a cpuset, ``taskset``); the smaller
of the two, at least 1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..config import MAX_WORKERS

__all__ = ["cpu_limit", "usable_cpus", "worker_count"]

CGROUP = Path("/sys/fs/cgroup")


def cpu_limit(root: Path = CGROUP) -> float | None:
    """The container's CPU limit in cores (``2.5`` for a quota of 250 ms a 100 ms period),
    or None when it has none (or no cgroup file says)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_count(setting: int | str, root: Path = CGROUP) -> int:
    """The workers to start for ``--workers`` (a number, or ``auto``: the module doc)."""
    if setting != "auto":
        return int(setting)
    cores = usable_cpus()
    limit = cpu_limit(root)
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, min(cores, MAX_WORKERS))
