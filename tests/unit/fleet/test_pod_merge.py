"""The pod's one page from its workers' families (sidecar/fleet/merge.py), on real
prometheus_client registries: sums, gauges by meaning, exemplars, gone workers' totals kept
as the same series, and the pod's bound on label values held by folding into ``other``."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.process_collector import ProcessCollector

from sidecar.fleet.merge import PodPage, lost_request_labels


class _Page:
    def __init__(self, families):
        self._families = families

    def collect(self):
        return self._families


def _registry():
    registry = CollectorRegistry()
    requests = Counter("llm_requests", "r", ["model", "outcome"], registry=registry)
    ttft = Histogram("llm_ttft_seconds", "t", ["model"], buckets=(0.1, 1.0), registry=registry)
    in_flight = Gauge("llm_requests_in_flight", "f", ["model"], registry=registry)
    start = Gauge("process_start_time_seconds", "s", registry=registry)
    build = Gauge("llm_sidecar_build_info", "b", ["version"], registry=registry)
    return registry, requests, ttft, in_flight, start, build


def _samples(families) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in families for s in m.samples}


def test_counters_and_histograms_are_summed_gauges_by_their_meaning():
    a, b = _registry(), _registry()
    for (_reg, requests, ttft, in_flight, start, build), n, t0 in ((a, 3, 100.0), (b, 5, 50.0)):
        requests.labels("m", "ok").inc(n)
        for _ in range(n):
            ttft.labels("m").observe(0.5)
        in_flight.labels("m").set(n)
        start.set(t0)
        build.labels("1.0").set(1)
    page = PodPage().merged({0: list(a[0].collect()), 1: list(b[0].collect())})
    got = _samples(page)
    assert got[("llm_requests_total", (("model", "m"), ("outcome", "ok")))] == 8
    assert got[("llm_ttft_seconds_bucket", (("le", "1.0"), ("model", "m")))] == 8
    assert got[("llm_ttft_seconds_bucket", (("le", "0.1"), ("model", "m")))] == 0
    assert got[("llm_ttft_seconds_count", (("model", "m"),))] == 8
    assert got[("llm_ttft_seconds_sum", (("model", "m"),))] == 4.0
    assert got[("llm_requests_in_flight", (("model", "m"),))] == 8  # summed
    assert got[("process_start_time_seconds", ())] == 50.0  # the oldest
    assert got[("llm_sidecar_build_info", (("version", "1.0"),))] == 1  # not 2
    assert not any(name.endswith("_created") for name, _ in got)  # as the single page


def test_series_only_one_worker_has_are_kept_and_the_page_renders():
    a, b = _registry(), _registry()
    a[1].labels("only-a", "ok").inc()
    b[1].labels("only-b", "error").inc(2)
    page = PodPage().merged({0: list(a[0].collect()), 1: list(b[0].collect())})
    text = openmetrics(_Page(page)).decode()  # type: ignore[arg-type]
    assert 'llm_requests_total{model="only-a",outcome="ok"} 1.0' in text
    assert 'llm_requests_total{model="only-b",outcome="error"} 2.0' in text
    assert text.count("# TYPE llm_requests counter") == 1


def test_the_newest_exemplar_of_a_bucket_is_kept():
    a, b = _registry(), _registry()
    a[2].labels("m").observe(0.5, {"trace_id": "old"})
    b[2].labels("m").observe(0.5, {"trace_id": "new"})  # observed later: a newer timestamp
    page = PodPage().merged({0: list(a[0].collect()), 1: list(b[0].collect())})
    bucket = next(
        s for m in page for s in m.samples if s.name.endswith("_bucket") and s.labels["le"] == "1.0"
    )
    assert bucket.exemplar is not None and bucket.exemplar.labels == {"trace_id": "new"}
    assert '# {trace_id="new"}' in openmetrics(_Page(page)).decode()  # type: ignore[arg-type]


def test_a_gone_workers_counts_stay_and_its_replacement_adds_to_them():
    """No merged counter or bucket ever decreases: across workers that count, die and are
    replaced at random, every scrape's figures are at least the last scrape's."""
    rng = random.Random(7)
    page = PodPage()
    workers = [_registry() for _ in range(3)]
    expected = 0
    last: dict = {}
    for _step in range(300):
        i = rng.randrange(3)
        if rng.random() < 0.1:  # worker i dies: its last families retire, a new one starts
            page.retire(i, list(workers[i][0].collect()))
            workers[i] = _registry()
        else:
            n = rng.randrange(1, 4)
            workers[i][1].labels("m", "ok").inc(n)
            workers[i][2].labels("m").observe(rng.random())
            expected += n
        got = _samples(page.merged({i: list(w[0].collect()) for i, w in enumerate(workers)}))
        for key, value in last.items():
            if key[0].endswith(("_total", "_bucket", "_count", "_sum")):
                assert got.get(key, 0.0) >= value, key
        last = got
    assert last[("llm_requests_total", (("model", "m"), ("outcome", "ok")))] == expected


def test_a_gone_workers_gauges_go_with_it():
    a, b = _registry(), _registry()
    a[3].labels("m").set(4)
    b[3].labels("m").set(1)
    page = PodPage()
    page.retire(0, list(a[0].collect()))
    got = _samples(page.merged({1: list(b[0].collect())}))
    assert got[("llm_requests_in_flight", (("model", "m"),))] == 1  # not 5


def test_requests_lost_with_a_worker_are_counted_once_as_errors():
    live = _registry()
    page = PodPage()
    labels = lost_request_labels("m", "/v1/chat/completions", "", tenants=False)
    page.retire(0, [], [(labels, 3.0)])
    merged = page.merged({1: list(live[0].collect())})
    got = _samples(merged)
    key = (
        "llm_requests_total",
        tuple(sorted({**labels}.items())),
    )
    assert got[key] == 3
    assert labels == {
        "model": "m",
        "route": "/v1/chat/completions",
        "code": "500",
        "outcome": "error",
        "error_type": "internal",
    }
    assert lost_request_labels("m", "/r", "acme", tenants=True)["tenant"] == "acme"
    page.retire(2, [], [(labels, 2.0)])  # another worker's: added, once each
    assert _samples(page.merged({}))[key] == 5


def test_process_figures_are_the_pods():
    a, b = CollectorRegistry(), CollectorRegistry()
    ProcessCollector(registry=a)
    ProcessCollector(registry=b)
    one = _samples(list(a.collect()))
    got = _samples(PodPage().merged({0: list(a.collect()), 1: list(b.collect())}))
    rss = ("process_resident_memory_bytes", ())
    assert got[rss] >= 1.9 * one[rss]  # summed (the same process twice here)
    assert got[("process_max_fds", ())] == one[("process_max_fds", ())]  # a limit: not summed


class _Tenanted:
    """A worker's registry with the tenant label: requests, goodput and a TTFT histogram."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model", "tenant"]
        self.requests = Counter("llm_requests", "r", labels, registry=self.registry)
        self.good = Counter("llm_requests_within_slo", "g", labels, registry=self.registry)
        self.ttft = Histogram(
            "llm_ttft_seconds", "t", labels, buckets=(0.1, 1.0), registry=self.registry
        )
        self.in_flight = Gauge("llm_requests_in_flight", "f", ["model"], registry=self.registry)

    def serve(self, tenant: str, n: int = 1, *, good: bool = True, ttft: float = 0.5) -> None:
        for _ in range(n):
            self.requests.labels("m", tenant).inc()
            if good:
                self.good.labels("m", tenant).inc()
            self.ttft.labels("m", tenant).observe(ttft)

    def forget(self, tenant: str) -> None:
        """As the worker's labeler does when it forgets a value: its series go."""
        for family in (self.requests, self.good, self.ttft):
            family.remove("m", tenant)

    def families(self):
        return list(self.registry.collect())


def _tenants(got) -> set[str]:
    return {dict(labels)["tenant"] for _n, labels in got if "tenant" in dict(labels)}


def _value(got, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in got.items() if n == name and labels.items() <= dict(ls).items())


def _assert_buckets_consistent(got) -> None:
    """Every TTFT child's buckets are cumulative and its count is its +Inf bucket."""
    children = {
        tuple(x for x in ls if x[0] != "le") for n, ls in got if n == "llm_ttft_seconds_count"
    }
    for child in children:
        labels = dict(child)
        b = [
            _value(got, "llm_ttft_seconds_bucket", **labels, le=le) for le in ("0.1", "1.0", "+Inf")
        ]
        assert b == sorted(b), (labels, b)
        assert b[-1] == _value(got, "llm_ttft_seconds_count", **labels), labels


def test_values_past_the_pods_bound_fold_into_other_and_every_sum_stays_right():
    """Two workers each admitted three tenants; the pod's bound is three: the page shows the
    first three, and the other worker's three are ``other`` in every family at once, their
    counts summed there (buckets too), and counted as overflow."""
    a, b = _Tenanted(), _Tenanted()
    for t in ("t0", "t1", "t2"):
        a.serve(t, 2)
    for t in ("t3", "t4", "t5"):
        b.serve(t, 3, good=t != "t5", ttft=0.05)
    b.serve("t0", 1)  # a value the pod has: its own, whichever worker served it
    page = PodPage({"tenant": 3})
    got = _samples(page.merged({0: a.families(), 1: b.families()}))
    assert _tenants(got) == {"t0", "t1", "t2", "other"}
    assert _value(got, "llm_requests_total") == 6 + 9 + 1
    assert _value(got, "llm_requests_total", tenant="t0") == 3
    assert _value(got, "llm_requests_total", tenant="other") == 9
    assert _value(got, "llm_requests_within_slo_total", tenant="other") == 6  # t5 missed
    assert _value(got, "llm_ttft_seconds_bucket", tenant="other", le="0.1") == 9
    assert _value(got, "llm_ttft_seconds_count", tenant="other") == 9
    _assert_buckets_consistent(got)
    overflow = ("llm_label_overflow_total", (("label", "tenant"), ("reason", "max_values")))
    assert got[overflow] == 9  # the requests the page put under other
    assert page.labels.books["tenant"].folded == {"t3", "t4", "t5"}


def test_a_folded_value_keeps_its_fate_while_it_is_on_the_page():
    """A slot of the pod frees (an own value's counts are carried, then idle); a value folded
    before stays ``other`` while a worker still exports it: ``other`` never drops, and its
    goodput ratio moves only with new requests, never by a value's whole history."""
    now = [0.0]
    a, b = _Tenanted(), _Tenanted()
    a.serve("t0", 4)
    b.serve("t1", 10, good=False)
    page = PodPage({"tenant": 1}, idle_seconds=60.0, clock=lambda: now[0])
    first = _samples(page.merged({0: a.families(), 1: b.families()}))
    assert _tenants(first) == {"t0", "other"}
    a.forget("t0")  # a idle: its series go; the page carries them
    now[0] = 61.0
    b.serve("t1", 2)  # two good ones
    got = _samples(page.merged({0: a.families(), 1: b.families()}))
    assert _value(got, "llm_requests_total", tenant="other") == 12
    assert _value(got, "llm_requests_within_slo_total", tenant="other") == 2  # 2 of 12
    assert "t1" not in _tenants(got)  # still folded: its history stays in other
    got = _samples(page.merged({0: a.families(), 1: b.families()}))
    assert "t0" not in _tenants(got)  # idle and no worker exports it: gone, slot free
    assert _value(got, "llm_requests_total", tenant="other") == 12  # other kept
    c = _Tenanted()
    c.serve("t2")
    got = _samples(page.merged({0: a.families(), 1: b.families(), 2: c.families()}))
    assert "t2" in _tenants(got)  # the freed slot


def test_a_replaced_workers_series_are_one_set_with_its_predecessors():
    """A worker killed and replaced three times, the same load each time: the page has the
    same series after every restart (not one more worker's set each time), and its counters
    go on from the carried totals."""
    page = PodPage({"tenant": 10})
    other = _Tenanted()
    other.serve("t0")
    sizes, totals = [], []
    worker = _Tenanted()
    for _restart in range(4):
        worker.serve("t0", 2)
        worker.serve("t1", 1)
        worker.in_flight.labels("m").set(1)
        got = _samples(page.merged({0: worker.families(), 1: other.families()}))
        sizes.append(len(got))
        totals.append(_value(got, "llm_requests_total"))
        page.retire(0, worker.families())
        worker = _Tenanted()
    assert sizes == [sizes[0]] * 4, sizes
    assert totals == [4, 7, 10, 13]


def test_a_series_a_live_worker_removes_or_restarts_is_carried():
    """A worker that forgets a value (its series go) and later counts it again from zero:
    the page's figures of that value go on from where they were."""
    a = _Tenanted()
    a.serve("t0", 5)
    page = PodPage({"tenant": 10})
    assert _value(_samples(page.merged({0: a.families()})), "llm_requests_total") == 5
    a.forget("t0")
    assert _value(_samples(page.merged({0: a.families()})), "llm_requests_total") == 5
    a.serve("t0", 2)
    got = _samples(page.merged({0: a.families()}))
    assert _value(got, "llm_requests_total", tenant="t0") == 7
    assert _value(got, "llm_ttft_seconds_count", tenant="t0") == 7
    _assert_buckets_consistent(got)


def test_the_pods_bound_holds_under_random_workers_values_and_kills():
    """Three workers, each admitting up to five of 30 tenants first come first served,
    killed and replaced at random, forgetting values at random: at every merge the page has
    at most five tenants, no counter or bucket ever decreases, the buckets stay consistent,
    the requests are all there, and every request under ``other`` is counted as overflow."""
    rng = random.Random(11)
    page = PodPage({"tenant": 5})
    workers = [_Tenanted() for _ in range(3)]
    admitted: list[list[str]] = [[] for _ in range(3)]
    sent = filed_other = 0
    last: dict = {}
    for _step in range(400):
        i = rng.randrange(3)
        roll = rng.random()
        if roll < 0.05:
            page.retire(i, workers[i].families())
            workers[i], admitted[i] = _Tenanted(), []
        elif roll < 0.1 and admitted[i]:
            workers[i].forget(admitted[i].pop(rng.randrange(len(admitted[i]))))
        else:
            tenant = f"t{rng.randrange(30)}"
            if tenant not in admitted[i]:
                tenant = tenant if len(admitted[i]) < 5 else "other"
                if tenant != "other":
                    admitted[i].append(tenant)
                else:
                    filed_other += 1  # the worker's own overflow (it counts that itself)
            workers[i].serve(tenant, good=rng.random() < 0.7, ttft=rng.random() * 2)
            sent += 1
        got = _samples(page.merged({k: w.families() for k, w in enumerate(workers)}))
        assert len(_tenants(got) - {"other"}) <= 5
        assert _value(got, "llm_requests_total") == sent
        _assert_buckets_consistent(got)
        overflow = ("llm_label_overflow_total", (("label", "tenant"), ("reason", "max_values")))
        assert got.get(overflow, 0) + filed_other == _value(
            got, "llm_requests_total", tenant="other"
        )
        for key, value in last.items():
            if key[0].endswith(("_total", "_bucket", "_count", "_sum")):
                assert got.get(key, 0.0) >= value, key
        last = got


def test_the_series_budget_holds_when_a_replacement_makes_series_its_predecessor_did_not():
    """``max_series`` 40: a worker carried away with its tenants' series, its replacement
    serving others (the page's bound lets them be their own values): the page stays within
    the budget by leaving off series it never showed, keeps every series it showed (rising),
    shows a histogram's child whole or not at all, and shows a left-off series once there
    is room."""
    page = PodPage({"tenant": 10}, max_series=40)
    a = _Tenanted()
    for t in ("t0", "t1", "t2"):
        a.serve(t)  # 3 tenants x (requests, goodput, 5 TTFT samples) = 21
    first = _samples(page.merged({0: a.families()}))
    assert len(first) == 21
    page.retire(0, a.families())
    b = _Tenanted()
    for t in ("t3", "t4", "t5", "t6"):
        b.serve(t)
    got = _samples(page.merged({0: b.families()}))
    assert len(got) <= 40 and page.left_off > 0
    assert all(got[key] >= value for key, value in first.items())  # all kept, none lower
    _assert_buckets_consistent(got)
    for t in _tenants(got):  # a histogram child whole or not at all
        child = [k for k in got if k[0].startswith("llm_ttft") and ("tenant", t) in k[1]]
        assert len(child) in (0, 5), child
    b.serve("t3")
    again = _samples(page.merged({0: b.families()}))
    assert all(again.get(key, -1) >= value for key, value in got.items())  # shown stays
    roomy = PodPage({"tenant": 10}, max_series=400)
    roomy.retire(0, a.families())
    assert len(_samples(roomy.merged({0: b.families()}))) == 21 + 28  # with room: all of it
