"""Real vLLM (CPU; default flags and --enable-force-include-usage), real llama.cpp and real
Hugging Face ``transformers serve`` (whose streams end with a finish_reason + usage chunk and
never send ``[DONE]``: every request must still be ``ok``) behind the sidecar: the client's
bytes through the sidecar equal a direct request's, and what the sidecar measured agrees
with what the server reported.

For each route a server serves, streamed and not, with and without
``stream_options.include_usage``, one test makes two identical direct requests and one
through the sidecar (temperature 0 and a seed: the same tokens each time) and checks:

- the mask is sufficient: the two direct bodies are byte-equal once the values of the
  server's VOLATILE keys are masked, and every key whose value differed between them is
  one of those (ids, timestamps, timing figures, prompt-cache counts);
- the mask is minimal: over the whole run, every VOLATILE key did differ between two
  identical direct requests (``test_mask_is_minimal``, after the cases);
- the relay changes nothing: the body through the sidecar equals the direct one under the
  same mask, byte for byte, and so do status and end-to-end headers;
- the measurements: one TTFT per streamed request, ITL count = content chunks - 1 (more
  where vLLM's per-chunk usage shows a chunk carried several tokens), output
  and input tokens = the server's usage when it reported one, else llama.cpp's own counts
  (its ``timings``), else the stream's content chunks, flagged as estimated.

Marked ``real``: deselected from the default run; ``make test-real`` installs the servers
(cached under .tools/) and runs this.
"""

from __future__ import annotations

import time
from collections import defaultdict

import aiohttp
import pytest

from sidecar.measure.timeline import TokenCountSource
from tests.conftest import wait_for
from tests.real.conftest import LIVE_KINDS
from tests.real.servers import Case, ServerKind, cases
from tests.real.wire import (
    content_events,
    differing_keys,
    engine_counts,
    json_events,
    mask,
    reported_usage,
    token_arrivals,
)

pytestmark = pytest.mark.real

_LLAMACPP_TIMINGS = {
    "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
    "predicted_ms", "predicted_per_token_ms", "predicted_per_second",
}  # fmt: skip
VOLATILE = {
    # A random 16-hex id per request and the creation second.
    "vllm": {"id", "created"},
    # Also the engine's timings, and the prompt cache's share of the prompt (the first of
    # two identical requests computes the prompt, the second finds it cached).
    "llama.cpp": {"id", "created", "cache_n", "prompt_n", "cached_tokens"} | _LLAMACPP_TIMINGS,
    # A random UUID per request (also in the x-request-id header) and the creation second.
    "transformers": {"id", "created"},
}
VOLATILE_HEADERS = {"transformers": {"x-request-id"}}
"""Headers whose value is new for every request: compared by name, not value."""

# Hop-by-hop headers belong to each connection; Date is the second the answer left;
# Content-Length follows the body's volatile values (checked against each body instead).
_PER_CONNECTION = {"connection", "keep-alive", "transfer-encoding", "date", "content-length"}

_observed: dict[str, set[str]] = defaultdict(set)  # kind -> keys that differed, over the run
_cases_run: dict[str, int] = defaultdict(int)

PARAMS = [pytest.param(kind, case, id=f"{kind.name}-{case.name}") for kind in LIVE_KINDS for case in cases(kind)]


async def fetch(session: aiohttp.ClientSession, base: str, case: Case, kind: ServerKind) -> tuple[int, dict[str, str], bytes]:
    async with session.post(base + case.route, json=case.body(kind.model)) as resp:
        body = b"".join([chunk async for chunk in resp.content.iter_any()])
        if "Content-Length" in resp.headers:
            assert int(resp.headers["Content-Length"]) == len(body)
        volatile = VOLATILE_HEADERS.get(kind.engine, set())
        headers = {
            k.lower(): ("<volatile>" if k.lower() in volatile else v)
            for k, v in resp.headers.items()
            if k.lower() not in _PER_CONNECTION
        }
        return resp.status, headers, body


RECHUNK_ATTEMPTS = 5


def same_events(a: bytes, b: bytes, c: bytes, streamed: bool) -> bool:
    """Whether three streams carry the same number of events.

    vLLM's API process merges the engine's outputs for a request when it falls behind (the
    tiny model decodes in about a millisecond per token), so two identical requests can
    come back split into different events: " here"," here" once, " here here" the next
    time. That is the server's timing, not a difference the sidecar made, and no value mask
    can hide it. The test asks again until all three answers are split alike; a sidecar that
    adds or drops an event never gets there, and then fails the byte comparison."""
    if not streamed:
        return True
    counts = {len(json_events(body, True)) for body in (a, b, c)}
    return len(counts) == 1


def next_second() -> None:
    """Sleep past the next whole second, so ``created`` can differ between two requests."""
    time.sleep(1.01 - (time.time() % 1.0))


def metric(registry, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


@pytest.mark.parametrize(("kind", "case"), PARAMS)
async def test_relay_is_byte_exact_and_measures_what_the_server_reported(
    live_servers, sidecar_factory, kind: ServerKind, case: Case
):
    server = live_servers.get(kind)

    timeout = aiohttp.ClientTimeout(total=120)
    # A fresh connection per request, as a new client would open (llama.cpp closes a
    # kept-alive connection after a stream; a reused one would race that close).
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False, timeout=timeout) as session:
        attempts = []
        for _attempt in range(RECHUNK_ATTEMPTS):
            running = await sidecar_factory(server.url)  # fresh metrics for each attempt
            timelines: list = []
            # The proxy's recorders are fixed at build time; add a capture beside the metrics.
            proxy = running.sidecar.proxy
            proxy._recorders = (*proxy._recorders, lambda t, label, into=timelines: into.append(t))
            first = await fetch(session, server.url, case, kind)
            next_second()
            second = await fetch(session, server.url, case, kind)
            through = await fetch(session, running.url, case, kind)
            await wait_for(lambda: len(timelines) == 1, timeout=10)
            attempts.append((first, second, through, running, timelines))
            if same_events(first[2], second[2], through[2], case.stream):
                break
        # Split differently every time: judge the last attempt whose two direct answers agree,
        # so the assertions below blame the sidecar only when the server was consistent.
        agreeing = [a for a in attempts if same_events(a[0][2], a[1][2], a[0][2], case.stream)]
        (status1, headers1, direct1), (status2, headers2, direct2), (status, headers, via), running, timelines = (
            agreeing or attempts
        )[-1]

    volatile = VOLATILE[kind.engine]
    differing = differing_keys(direct1, direct2)
    _observed[kind.name] |= differing
    _cases_run[kind.name] += 1
    assert differing <= volatile, f"two identical direct requests differ in {differing - volatile}"
    assert mask(direct1, volatile) == mask(direct2, volatile)
    assert (status1, headers1.keys()) == (status2, headers2.keys())

    # The relay: status, headers and body as the server sent them.
    assert status == status1
    assert headers == headers1, "the sidecar changed the response headers"
    assert mask(via, volatile) == mask(direct1, volatile), "the sidecar changed the response body"

    timeline = timelines[0]
    registry = running.registry
    route = {"route": case.route}
    assert metric(registry, "llm_requests_total", outcome="ok", code=str(status), **route) == 1
    assert timeline.parse_errors == 0
    if status != 200:
        assert case.include_usage and not case.stream  # stream_options without stream: a 400
        return

    events = json_events(via, case.stream)
    chunks = content_events(events)
    usage = reported_usage(events)
    outputs = metric(registry, "llm_tokens_total", type="output", **route)
    inputs = metric(registry, "llm_tokens_total", type="input", **route)
    if case.stream:
        assert chunks >= 2, "the tiny model should stream several content chunks"
        assert metric(registry, "llm_time_to_first_token_seconds_count", **route) == 1
        # One gap between consecutive arrivals: content chunks - 1 (more when per-chunk usage
        # says a chunk carried several tokens).
        assert metric(registry, "llm_inter_token_latency_seconds_count", **route) == token_arrivals(events) - 1
    else:
        assert metric(registry, "llm_time_to_first_token_seconds_count", **route) == 0
    engine = engine_counts(events)
    if usage is not None:
        assert timeline.token_count_source is TokenCountSource.USAGE
        assert (outputs, inputs) == (usage["output"], usage["input"])
    elif engine is not None:  # llama.cpp without usage: its timings still count
        assert timeline.token_count_source is TokenCountSource.ENGINE
        assert (outputs, inputs) == (engine["output"], engine["input"])
    else:
        assert case.stream, "a non-streamed answer always carries its counts"
        assert timeline.token_count_source is TokenCountSource.ESTIMATED, "an estimate must be flagged"
        assert outputs == token_arrivals(events) and inputs == 0


@pytest.mark.parametrize("kind", [pytest.param(k, id=k.name) for k in LIVE_KINDS])
def test_mask_is_minimal(kind: ServerKind):
    """Runs after the cases: every masked key really differed between identical requests."""
    if _cases_run[kind.name] < len(cases(kind)):
        pytest.skip(f"only {_cases_run[kind.name]} of {len(cases(kind))} {kind.name} cases ran in this session")
    unobserved = VOLATILE[kind.engine] - _observed[kind.name]
    assert not unobserved, f"masked but never seen to differ between identical requests: {unobserved}"
