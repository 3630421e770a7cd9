"""The pod's bound on label values (sidecar/fleet/pod_labels.py) and the worker's side of it,
``BoundedLabel.give_back`` (sidecar/base/labels.py): a value's fate is decided once and kept
while it is on the page; a value the pod folds gives its worker slot back."""

from __future__ import annotations

from sidecar.base.labels import OTHER, BoundedLabel
from sidecar.config import Settings
from sidecar.fleet.pod_labels import PodLabels
from sidecar.fleet.supervisor import pod_bounds


def test_values_are_the_pods_while_there_is_room_then_other_and_keep_their_fate():
    labels = PodLabels({"tenant": 2})
    got = [labels.map({"tenant": t, "model": "m"}, 0.0)["tenant"] for t in ("a", "b", "c", "a")]
    assert got == ["a", "b", OTHER, "a"]
    assert labels.map({"tenant": "unknown"}, 0.0)["tenant"] == "unknown"  # never counted
    same = {"tenant": "a"}
    assert labels.map(same, 0.0) is same  # nothing folded: no copy
    # "a" leaves the page (no worker, nothing carried): its slot is free, but "c", still
    # exported, stays folded.
    labels.expire({"tenant": {"b", "c"}}, {"tenant": set()}, 1.0)
    assert labels.map({"tenant": "c"}, 1.0)["tenant"] == OTHER
    assert labels.map({"tenant": "d"}, 1.0)["tenant"] == "d"


def test_an_own_value_only_the_carried_totals_hold_goes_once_idle():
    labels = PodLabels({"tenant": 1}, idle_seconds=10.0)
    labels.map({"tenant": "a"}, 0.0)
    labels.note_totals({"tenant": {"a": 3.0}}, 0.0)
    assert labels.expire({"tenant": set()}, {"tenant": {"a"}}, 5.0) == {}
    labels.note_totals({"tenant": {"a": 3.0}}, 5.0)  # not moved: still idle since 0
    assert labels.expire({"tenant": set()}, {"tenant": {"a"}}, 10.0) == {"tenant": {"a"}}
    assert labels.map({"tenant": "b"}, 10.0)["tenant"] == "b"


def test_the_pods_bounds_are_those_no_allowlist_sets():
    base = {"upstream": "http://127.0.0.1:8000", "max_models": 7, "max_tenants": 4}
    assert pod_bounds(Settings(**base)) == {"model": 7}
    assert pod_bounds(Settings(**base, tenant_header="X-Tenant")) == {"model": 7, "tenant": 4}
    fixed = Settings(
        **base, tenant_header="X-Tenant", tenant_allowlist=["a"], model_allowlist=["m"]
    )
    assert pod_bounds(fixed) == {}


def test_a_value_given_back_frees_its_slot_but_never_one_held_or_listed():
    forgotten: list[str] = []
    label = BoundedLabel(max_values=2, on_forget=forgotten.append)
    assert label.settle("a", 200) == "a"
    assert label.settle("b", 200) == "b"
    assert label.settle("c", 200) == OTHER  # full
    label.hold("b")
    assert label.returnable(["a", "b", "zzz", "a"]) == ["a"]  # what give_back would take
    assert forgotten == []
    assert label.give_back(["a", "b", "zzz"]) == ["a"]
    assert forgotten == ["a"]
    assert label.settle("c", 200) == "c"  # a's slot
    listed = BoundedLabel(max_values=2)
    listed.vouch(["m"])
    assert listed.give_back(["m"]) == []
    assert "m" in listed.values
