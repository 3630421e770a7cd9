"""A worker's requests in flight, read back after the worker was killed with SIGKILL
(sidecar/fleet/ledger.py), and how many workers ``--workers auto`` means
(sidecar/fleet/cpus.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from sidecar.fleet.cpus import cpu_limit, worker_count
from sidecar.fleet.ledger import SLOTS, InFlightLedger, create_ledger, read_lost


def test_what_a_killed_worker_had_in_flight_is_read_back(tmp_path):
    """A real process opens requests, closes some, and is killed with SIGKILL (no exit code
    of its own runs); what was still open is read from the file, by label set."""
    path = str(tmp_path / "w0.inflight")
    create_ledger(path)
    script = textwrap.dedent(
        f"""
        import os, signal
        from sidecar.fleet.ledger import InFlightLedger
        ledger = InFlightLedger({path!r})
        for _ in range(3):
            ledger.opened("m", "/v1/chat/completions", "")
        ledger.closed("m", "/v1/chat/completions", "")
        ledger.opened("other-model", "/v1/completions", "acme")
        ledger.opened("done", "/v1/completions", "")
        ledger.closed("done", "/v1/completions", "")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -signal.SIGKILL
    assert dict(read_lost(path)) == {
        ("m", "/v1/chat/completions", ""): 2,
        ("other-model", "/v1/completions", "acme"): 1,
    }


def test_a_clean_ledger_and_a_missing_one_hold_nothing(tmp_path):
    path = str(tmp_path / "w.inflight")
    create_ledger(path)
    assert list(read_lost(path)) == []
    assert list(read_lost(str(tmp_path / "absent"))) == []


def test_label_sets_past_the_slots_or_too_long_are_kept_under_other(tmp_path):
    path = str(tmp_path / "w.inflight")
    create_ledger(path)
    ledger = InFlightLedger(path)
    try:
        ledger.opened("x" * 400, "/v1/completions", "")  # its key does not fit a slot
        for i in range(SLOTS + 5):  # more label sets than slots
            ledger.opened(f"m{i}", "/r", "")
        lost = dict(read_lost(path))
    finally:
        ledger.close()
    assert lost[("other", "other", "")] == 1 + 6  # the long one and those past the last slot
    assert sum(lost.values()) == SLOTS + 6  # none lost, none counted twice


@pytest.mark.parametrize(
    ("files", "cores"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_the_containers_cpu_limit_from_its_cgroup(tmp_path, files, cores):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_limit(tmp_path) == cores


def test_auto_is_the_limit_rounded_up_within_the_usable_cpus(tmp_path):
    usable = len(os.sched_getaffinity(0))
    assert worker_count(3) == 3 and worker_count("2") == 2
    assert worker_count("auto", tmp_path) == usable  # no limit: the cpus it may run on
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core
    assert worker_count("auto", tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{(usable + 8) * 100000} 100000\n")
    assert worker_count("auto", tmp_path) == usable  # a limit above the cpus it has


def test_each_worker_exports_under_the_pods_resource_with_its_own_instance_id():
    from sidecar.export.otel_env import resource_attributes
    from sidecar.fleet.worker import worker_resource

    env = {
        "K8S_POD_NAME": "llm-0",
        "K8S_NAMESPACE_NAME": "team-a",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,team=a%2Cb",
    }
    attrs = [
        resource_attributes({**env, "OTEL_RESOURCE_ATTRIBUTES": worker_resource(env, i)})
        for i in range(2)
    ]
    single = resource_attributes(env)
    for i, a in enumerate(attrs):
        assert {k: v for k, v in a.items() if k != "service.instance.id"} == single
        assert a["service.instance.id"] == f"llm-0-worker-{i}"
    given = {**env, "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=abc"}
    got = resource_attributes({**given, "OTEL_RESOURCE_ATTRIBUTES": worker_resource(given, 3)})
    assert got["service.instance.id"] == "abc-worker-3"


def test_a_worker_adopts_what_the_pod_admitted_within_its_bounds():
    from sidecar.base.labels import BoundedLabel

    clock = [0.0]
    label = BoundedLabel(max_values=3, idle_seconds=10.0, clock=lambda: clock[0], name="model")
    assert label.settle("a", 200) == "a"  # earned here
    assert label.adopt(["a", "b", "other", "unknown", "", "c", "d"]) == ["b", "c"]  # room for 3
    assert label("b") == "b" and label.settle("c", 404) == "c"  # labels, not 'other'
    assert label.settle("d", 200) == "other"  # the pod's room is used up
    clock[0] = 11.0
    assert label("a") == "a"  # seen again here: it stays
    assert sorted(label.expire()) == ["b", "c"]  # adopted, never seen here: aged out
    listed = BoundedLabel(max_values=5, name="model")
    listed.vouch(["served"])
    assert listed.adopt(["served", "not-listed"]) == []  # the server's list is the authority
    allow = BoundedLabel(["x"], name="tenant")
    assert allow.adopt(["y"]) == [] and allow("y") == "other"


def test_the_pods_folder_falls_back_where_tmp_is_read_only(tmp_path):
    """Under readOnlyRootFilesystem /tmp is not writable, /dev/shm is: the next base is used,
    and with none a one-line error names --workers and what to do."""
    from sidecar.fleet.supervisor import RunDirectoryError, run_directory

    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    writable = tmp_path / "shm"
    writable.mkdir()
    if os.access(read_only, os.W_OK):  # root ignores the mode bits: use a path that cannot be
        read_only = tmp_path / "missing" / "dir"
    got = run_directory((str(read_only), str(writable)))
    assert got.parent == writable and got.is_dir() and (got.stat().st_mode & 0o777) == 0o700
    with pytest.raises(RunDirectoryError, match="--workers needs a writable folder") as err:
        run_directory((str(read_only),))
    assert err.value.flag == "--workers"
