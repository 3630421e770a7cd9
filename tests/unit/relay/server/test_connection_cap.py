"""The proxy port's default connection cap fits the container: the open-files limit and the
memory limit (cgroup v2 or v1) each bound it, the memory shared by the pod's workers."""

from __future__ import annotations

import resource

import pytest

from sidecar.relay.server.client_guard import (
    MEMORY_PER_CONNECTION,
    MEMORY_RESERVE,
    connection_cap,
    memory_limit,
)

MIB = 1 << 20


def test_the_charts_512mi_holds_what_its_streams_cost(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))  # 1 M files
    assert connection_cap(0) == connection_cap(0, memory=None)
    cap = connection_cap(0, memory=512 * MIB)
    assert cap == (512 * MIB - MEMORY_RESERVE) // MEMORY_PER_CONNECTION == 24_576
    assert cap * MEMORY_PER_CONNECTION + MEMORY_RESERVE <= 512 * MIB
    assert connection_cap(0, memory=512 * MIB, workers=2) == 12_288  # the pod's memory, shared
    assert connection_cap(0, memory=1 << 40) == ((1 << 20) - 128) // 2  # the files bind first
    assert connection_cap(0, memory=64 * MIB) == 16  # never below 16
    assert connection_cap(300, memory=64 * MIB) == 300  # a configured cap is the user's


@pytest.mark.parametrize(
    "files, limit",
    [
        ({"memory.max": "536870912\n"}, 512 * MIB),
        ({"memory.max": "max\n"}, None),
        ({"memory/memory.limit_in_bytes": "268435456\n"}, 256 * MIB),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),
        ({}, None),
    ],
    ids=["v2", "v2-none", "v1", "v1-none", "no-cgroup"],
)
def test_the_memory_limit_is_read_from_cgroup_v2_then_v1(tmp_path, files, limit):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert memory_limit(tmp_path) == limit
