"""The pod's /stallz verdict from its workers' (sidecar/fleet/stall_probe.py): the single
process's rule over the union of the workers' requests, and healthy when it cannot see
every worker."""

from __future__ import annotations

import json

import pytest

from sidecar.fleet.stall_probe import pod_stall_probe, worker_stall_doc

PROBE = 300.0


def doc(in_flight=0, stalled=0, hung=False, since=None, silence=0.0) -> dict:
    return {
        "in_flight": in_flight,
        "stalled": stalled,
        "stall_seconds": PROBE,
        "longest_silence_seconds": silence,
        "seconds_since_completed": since,
        "stalled_engine": hung,
    }


HUNG = doc(2, 2, True, since=None, silence=400.0)


def test_every_worker_hung_is_a_hung_engine_with_the_pods_figures():
    other = doc(1, 1, True, since=350.0, silence=320.0)
    healthy, pod = pod_stall_probe([HUNG, other], PROBE)
    assert not healthy and pod["stalled_engine"] is True
    assert (pod["in_flight"], pod["stalled"]) == (3, 3)
    assert pod["longest_silence_seconds"] == 400.0 and pod["seconds_since_completed"] == 350.0
    assert [w["stalled_engine"] for w in pod["workers"]] == [True, True]


def test_an_idle_worker_that_completed_nothing_lately_does_not_hide_the_hang():
    assert not pod_stall_probe([HUNG, doc(since=PROBE + 1)], PROBE)[0]
    assert not pod_stall_probe([HUNG, doc()], PROBE)[0]  # never completed anything


@pytest.mark.parametrize(
    "other",
    [
        doc(1, 0, False, silence=0.5),  # a stream another worker holds is moving
        doc(since=PROBE - 1),  # another worker answered a request whole meanwhile
        None,  # another worker did not answer: it may hold a moving stream
    ],
    ids=["moving-elsewhere", "completed-elsewhere", "a-worker-silent"],
)
def test_one_workers_hang_is_not_the_engines_when_another_worker_sees_it_work(other):
    healthy, pod = pod_stall_probe([HUNG, other], PROBE)
    assert healthy and pod["stalled_engine"] is False
    assert pod_stall_probe([HUNG], PROBE)[0] is False  # alone, the same worker says hung


def test_nothing_in_flight_anywhere_is_healthy():
    healthy, pod = pod_stall_probe([doc(), doc(since=PROBE * 10)], PROBE)
    assert healthy and pod["in_flight"] == 0 and pod["seconds_since_completed"] == PROBE * 10


def test_a_silent_worker_is_named():
    healthy, pod = pod_stall_probe([HUNG, None], PROBE)
    assert healthy and pod["reason"] == "worker 1 did not answer: judged healthy"
    assert pod["workers"][1] == {"worker": 1, "answered": False}


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"status": "alive"}', b""])
def test_a_body_that_is_not_a_workers_verdict_counts_as_no_answer(body):
    assert worker_stall_doc(body) is None
    assert worker_stall_doc(json.dumps(HUNG).encode()) == HUNG
