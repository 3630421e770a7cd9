"""What one pod's /metrics page costs a fleet, under a realistic mix: ``llm-sidecar serve``
with the chart's defaults in front of three simulated models (chat and completions, 80 %
streamed, 500s, dropped and cancelled streams, 404s for unknown models; 6 requests a second),
counted as Prometheus would store it (tests/support/series_census.py).

The budget is 600 series a pod (vLLM's own page for one model is about 440). A new label, a
bucket bound or a family made ahead at zero shows up here as series every pod of a fleet pays
for, before it ships.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.support.series_census import CensusRun, PageCensus, census_of, census_run

SERIES_BUDGET = 600
MIX_SECONDS = 30.0

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


@pytest.fixture(scope="module")
def run() -> CensusRun:
    return asyncio.run(census_run(MIX_SECONDS, rate=6.0, seed=50))


@pytest.fixture(scope="module")
def page(run: CensusRun) -> str:
    """The page once every request has ended."""
    return run.page


@pytest.fixture(scope="module")
def census(page: str) -> PageCensus:
    return census_of(page)


def samples(page: str) -> list[tuple[str, str, float]]:
    out = []
    for line in page.splitlines():
        if line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, line
            out.append((match[1], match[2] or "", float(match[3])))
    return out


def test_the_page_is_the_mixes(page: str) -> None:
    """The mix really ran: three models on both routes, 404s filed under other, server
    errors, dropped and cancelled streams (else a small page would prove nothing)."""
    requests = [(labels, v) for name, labels, v in samples(page) if name == "llm_requests_total"]
    text = "\n".join(labels for labels, _ in requests)
    for model in ("llama-3.1-8b", "qwen2.5-7b", "mistral-7b"):
        assert f'model="{model}"' in text, model
    for expected in (
        'route="/v1/chat/completions"',
        'route="/v1/completions"',
        'code="404",error_type="none",model="other"',
        'code="500",error_type="upstream_status"',
        'outcome="cancelled"',
    ):
        assert expected in text, expected
    assert sum(v for _, v in requests) >= 4 * MIX_SECONDS  # about 6 a second were served


def test_a_pods_page_under_the_mix_fits_the_series_budget(
    run: CensusRun, census: PageCensus
) -> None:
    assert census.total <= SERIES_BUDGET, census.report()
    # Scraped while requests were in flight too (the in-flight families exist only then).
    assert run.busiest_total <= SERIES_BUDGET, census_of(run.busiest).report()
    # Most of the page is the distributions, and most of their buckets hold something.
    assert census.buckets < census.total * 0.7, census.report()
    assert census.zero < census.total * 0.15, census.report()


def test_no_series_that_cannot_move(page: str) -> None:
    """Nothing for a label none of whose requests decodes (the 404s under other have no
    capacity bands), no cache class of a server that did not report one, no duration of a
    cancelled request; what is at zero is what a rule needs at zero (docs/metrics.md)."""
    rows = samples(page)
    capacity = ("llm_inter_token_latency_by_concurrency", "llm_decode_")
    assert not [r for r in rows if r[0].startswith(capacity) and 'model="other"' in r[1]]
    assert not [r for r in rows if 'cache="unknown"' in r[1]]
    assert not [r for r in rows if r[0].startswith("llm_request_duration") and "cancelled" in r[1]]
    # Counters and counts at zero: only capacity bands made ahead of the load, and the
    # refusal counter (counting a refusal must not need a series of its own).
    allowed = (
        "llm_decode_seconds_by_concurrency_total",
        "llm_inter_token_latency_by_concurrency_seconds_count",
        "llm_series_refused_total",
        "llm_requests_in_flight",  # a gauge back at zero once the requests ended
    )
    zero = [
        (name, labels)
        for name, labels, v in rows
        if v == 0 and name.startswith("llm_") and not name.endswith(("_bucket", "_sum"))
    ]
    assert [z for z in zero if z[0] not in allowed] == []
    # A band at zero is one above a band the model's load reached: made ahead, never stray.
    reached: dict[str, set[str]] = {}
    for name, labels, v in rows:
        if name == "llm_decode_seconds_by_concurrency_total" and v > 0:
            model = re.search(r'model="([^"]*)"', labels)[1]  # type: ignore[index]
            reached.setdefault(model, set()).add(re.search(r'concurrency="([^"]*)"', labels)[1])  # type: ignore[index]
    for name, labels in zero:
        if name == "llm_decode_seconds_by_concurrency_total":
            model = re.search(r'model="([^"]*)"', labels)[1]  # type: ignore[index]
            band = re.search(r'concurrency="([^"]*)"', labels)[1]  # type: ignore[index]
            below = {"2": "1", "4": "2", "8": "4", "16": "8", "32": "16", "64": "32"}.get(band)
            assert band in ("2", "4") or below in reached.get(model, set()), (model, band)
