"""The pod's one page from its workers' families (sidecar/fleet/merge.py), on real
prometheus_client registries: sums, gauges by meaning, exemplars, gone workers' totals kept."""

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
    page = PodPage().merged([list(a[0].collect()), list(b[0].collect())])
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
    page = PodPage().merged([list(a[0].collect()), list(b[0].collect())])
    text = openmetrics(_Page(page)).decode()  # type: ignore[arg-type]
    assert 'llm_requests_total{model="only-a",outcome="ok"} 1.0' in text
    assert 'llm_requests_total{model="only-b",outcome="error"} 2.0' in text
    assert text.count("# TYPE llm_requests counter") == 1


def test_the_newest_exemplar_of_a_bucket_is_kept():
    a, b = _registry(), _registry()
    a[2].labels("m").observe(0.5, {"trace_id": "old"})
    b[2].labels("m").observe(0.5, {"trace_id": "new"})  # observed later: a newer timestamp
    page = PodPage().merged([list(a[0].collect()), list(b[0].collect())])
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
            page.retire(list(workers[i][0].collect()))
            workers[i] = _registry()
        else:
            n = rng.randrange(1, 4)
            workers[i][1].labels("m", "ok").inc(n)
            workers[i][2].labels("m").observe(rng.random())
            expected += n
        got = _samples(page.merged([list(w[0].collect()) for w in workers]))
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
    page.retire(list(a[0].collect()))
    got = _samples(page.merged([list(b[0].collect())]))
    assert got[("llm_requests_in_flight", (("model", "m"),))] == 1  # not 5


def test_requests_lost_with_a_worker_are_counted_once_as_errors():
    live = _registry()
    page = PodPage()
    labels = lost_request_labels("m", "/v1/chat/completions", "", tenants=False)
    page.retire([], [(labels, 3.0)])
    merged = page.merged([list(live[0].collect())])
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
    page.retire([], [(labels, 2.0)])  # another worker's: added, once each
    assert _samples(page.merged([]))[key] == 5


def test_process_figures_are_the_pods():
    a, b = CollectorRegistry(), CollectorRegistry()
    ProcessCollector(registry=a)
    ProcessCollector(registry=b)
    one = _samples(list(a.collect()))
    got = _samples(PodPage().merged([list(a.collect()), list(b.collect())]))
    rss = ("process_resident_memory_bytes", ())
    assert got[rss] >= 1.9 * one[rss]  # summed (the same process twice here)
    assert got[("process_max_fds", ())] == one[("process_max_fds", ())]  # a limit: not summed
