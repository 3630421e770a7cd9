"""``serve --workers N`` over real sockets and processes: the pod's one page is exact (what
the clients and the upstream counted), never decreases when a worker is killed, and the
drain takes every worker.

The upstream is an aiohttp server in the test that counts what it sent; the sidecar is the
real command (a supervisor and its worker processes). Its private folder goes under the
test's ``TMPDIR``, so the test can ask each worker's own admin socket what it counted and
kill the one that holds streams.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter as Tally
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import Settings
from sidecar.fleet.supervisor import Supervisor, run_directory
from sidecar.fleet.worker import reuse_port_socket
from tests.support.exposition import count_series
from tests.support.in_process import start_app
from tests.support.ports import retry_on_port_clash
from tests.support.raw import raw_exchange, status_and_json
from tests.support.serve import start_pod
from tests.support.sse import DONE, chat_chunk
from tests.support.tools import require_tool
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

ROUTE = "/v1/chat/completions"
MODELS = ("alpha", "beta")
MONOTONE = ("_total", "_bucket", "_count", "_sum")
SYNC_SECONDS = 1.0
"""``--worker-sync-seconds`` for the tests that wait for a sync (the default is 5 s)."""


class CountingUpstream:
    """Streams ``x-tokens`` content chunks ``x-gap`` seconds apart, then usage and
    ``[DONE]``; counts the requests and tokens it answered, by model."""

    def __init__(self, *, lists: bool = True) -> None:
        self.lists = lists  # answers /v1/models (else 404: names earn labels by answers)
        self.requests: Tally[str] = Tally()
        self.tokens: Tally[str] = Tally()
        self.streaming = 0
        self.listings = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(ROUTE, self.handler)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        self.listings += 1
        if not self.lists:
            return web.json_response({"error": "not found"}, status=404)
        return web.json_response({"object": "list", "data": [{"id": m} for m in MODELS]})

    @staticmethod
    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def handler(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = body["model"]
        tokens = int(request.headers.get("x-tokens", "5"))
        gap = float(request.headers.get("x-gap", "0"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.streaming += 1
        try:
            await resp.write(chat_chunk(role=True, model=model))
            for i in range(tokens):
                if gap:
                    await asyncio.sleep(gap)
                await resp.write(chat_chunk(f"t{i}", model=model))
            usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}
            await resp.write(chat_chunk(finish="stop", model=model))
            await resp.write(b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [], "usage": usage}).encode() + b"\n\n")  # fmt: skip
            await resp.write(DONE)
            await resp.write_eof()
        finally:
            self.streaming -= 1
        self.requests[model] += 1
        self.tokens[model] += tokens
        return resp


def parse(page: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == want for k, want in labels.items())
    )


async def scrape(url: str) -> dict[tuple[str, tuple], float]:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            assert r.status == 200
            return parse(await r.text())


async def worker_page(sock: Path) -> dict[tuple[str, tuple], float]:
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as s:
        async with s.get("http://worker/metrics") as r:
            return parse(await r.text())


def worker_sockets(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("llm-sidecar-pod-*/w*.sock"))


async def chat(session: aiohttp.ClientSession, url: str, model: str, tokens: int, gap=0.0) -> bytes:
    headers = {"x-tokens": str(tokens), "x-gap": str(gap)}
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with session.post(url + ROUTE, json=body, headers=headers) as r:
        assert r.status == 200
        return await r.read()


@pytest.mark.parametrize("workers", [1, 2])
async def test_the_pods_page_is_what_the_clients_and_the_upstream_counted(
    serve_process, tmp_path, workers
):
    upstream = CountingUpstream()
    runner, port = await start_app(upstream.app())
    try:
        pod = await start_pod(serve_process, f"http://127.0.0.1:{port}", tmp_path, workers)
        sent: Tally[str] = Tally()
        tokens: Tally[str] = Tally()

        async def client(n: int) -> None:
            # Its own connections: the kernel hands each new one to a worker.
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2)) as s:
                for i in range(12):
                    model = MODELS[(n + i) % 2]
                    k = 3 + (n * 7 + i) % 9
                    body = await chat(s, pod.url, model, k)
                    assert body.endswith(DONE)
                    sent[model] += 1
                    tokens[model] += k

        await asyncio.gather(*(client(n) for n in range(16)))
        page = await scrape(pod.admin_url)
        assert upstream.requests == sent  # every request reached the upstream once
        for model in MODELS:
            assert total(page, "llm_requests_total", model=model, outcome="ok") == sent[model]
            assert total(page, "llm_requests_total", model=model) == sent[model]
            assert total(page, "llm_tokens_total", model=model, type="output") == tokens[model]
            assert total(page, "llm_tokens_total", model=model, type="input") == 3 * sent[model]
            assert total(page, "llm_time_to_first_token_seconds_count", model=model) == sent[model]
            assert total(page, "llm_request_duration_seconds_count", model=model) == sent[model]
            # Every gap between two content tokens: k - 1 a stream.
            assert total(page, "llm_inter_token_latency_seconds_count", model=model) == (
                tokens[model] - sent[model]
            )
        assert total(page, "llm_requests_in_flight") == 0
        if workers > 1:
            pages = [await worker_page(sock) for sock in worker_sockets(tmp_path)]
            assert len(pages) == workers
            served = [total(p, "llm_requests_total") for p in pages]
            assert all(n > 0 for n in served), served  # the load reached every worker
            assert sum(served) == sum(sent.values())
            ttft_sum = sum(total(p, "llm_time_to_first_token_seconds_sum") for p in pages)
            assert total(page, "llm_time_to_first_token_seconds_sum") == pytest.approx(ttft_sum)
            assert total(page, "llm_sidecar_workers") == workers
            assert total(page, "llm_sidecar_worker_restarts_total") == 0
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=30) == 0
    finally:
        await runner.cleanup()


async def readiness_ok(admin_url: str) -> bool:
    async with aiohttp.ClientSession() as s:
        async with s.get(admin_url + "/readyz") as r:
            return r.status == 200


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(p) for p in text)
    return found


async def test_kill_9_of_a_worker_mid_stream_never_takes_a_count_back(serve_process, tmp_path):
    """Streams through two workers; one worker (the one holding streams) is killed with
    SIGKILL mid-stream while the page is scraped every 100 ms. No counter or bucket of the
    page ever decreases, the worker is replaced, and each stream it was relaying is counted
    once, as an error; the rest end ok."""
    upstream = CountingUpstream()
    runner, port = await start_app(upstream.app())
    scrapes: list[dict] = []
    stop_scraping = asyncio.Event()
    try:
        pod = await start_pod(serve_process, f"http://127.0.0.1:{port}", tmp_path, 2)

        async def scraper() -> None:
            while not stop_scraping.is_set():
                scrapes.append(await scrape(pod.admin_url))
                await asyncio.sleep(0.1)

        scraping = asyncio.create_task(scraper())
        # A first round that ends ok, so there are counts to keep.
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(chat(s, pod.url, MODELS[i % 2], 4) for i in range(20)))

        streams = 16
        outcomes: list[str] = []

        async def long_stream(i: int) -> None:
            async with aiohttp.ClientSession() as s:
                try:
                    body = await chat(s, pod.url, MODELS[i % 2], 60, gap=0.05)
                    outcomes.append("ok" if body.endswith(DONE) else "cut")
                except (aiohttp.ClientError, AssertionError):
                    outcomes.append("cut")

        tasks = [asyncio.create_task(long_stream(i)) for i in range(streams)]
        await wait_for(lambda: upstream.streaming == streams, timeout=30)
        socks = worker_sockets(tmp_path)
        in_flight = [total(await worker_page(s), "llm_requests_in_flight") for s in socks]
        victim_index = max(range(len(socks)), key=lambda i: in_flight[i])
        assert in_flight[victim_index] > 0
        started = [json.loads(line) for line in pod.out if '"worker_started"' in line]
        victim = int(socks[victim_index].stem[1:])  # w<index>.sock
        pid = next(e["pid"] for e in started if e["worker"] == victim)
        assert pid in _children(pod.proc.pid)
        await scrape(pod.admin_url)  # the first round's counts are in the supervisor's copy
        before_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        async def readiness() -> tuple[int, dict]:
            async with aiohttp.ClientSession() as s:
                async with s.get(pod.admin_url + "/readyz") as r:
                    return r.status, await r.json()

        # Not ready while a worker is missing (its replacement takes a restart delay and a
        # start), ready again once it runs.
        async def missing() -> bool:
            status, doc = await readiness()
            return status == 503 and doc["reason"] == "1 of 2 workers running"

        await wait_for(missing, timeout=5)
        await asyncio.gather(*tasks)
        cut = outcomes.count("cut")
        assert cut == in_flight[victim_index]  # the killed worker's streams, no others
        assert outcomes.count("ok") == streams - cut

        async def replaced() -> bool:
            page = await scrape(pod.admin_url)
            return (
                total(page, "llm_sidecar_worker_restarts_total") == 1
                and total(page, "llm_sidecar_workers") == 2
            )

        await wait_for(replaced, timeout=30)
        await wait_for(lambda: readiness_ok(pod.admin_url), timeout=30)
        await asyncio.sleep(0.3)
        stop_scraping.set()
        await scraping
        assert time.monotonic() - before_kill < 60
        final = scrapes[-1]
        assert total(final, "llm_requests_total", outcome="error", error_type="internal") == cut
        assert total(final, "llm_requests_total", outcome="error") == cut
        assert total(final, "llm_requests_total", outcome="ok") == 20 + streams - cut
        assert total(final, "llm_requests_in_flight") == 0
        for earlier, later in zip(scrapes, scrapes[1:], strict=False):
            for key, value in earlier.items():
                if key[0].endswith(MONOTONE):
                    assert later.get(key, 0.0) >= value, (key, value, later.get(key))
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=30) == 0
    finally:
        stop_scraping.set()
        await runner.cleanup()


async def test_the_pod_asks_for_the_model_listing_once_and_every_worker_uses_it(
    serve_process, tmp_path
):
    """The supervisor asks the upstream which models it serves once an interval for the pod,
    not once a worker, and every worker labels by it: a listed model is its own label, a name
    the server does not list is ``other``, on whichever worker served it."""
    upstream = CountingUpstream()
    runner, port = await start_app(upstream.app())
    try:
        pod = serve_process(
            f"http://127.0.0.1:{port}", "--workers", "2", "--model-refresh-seconds", "0.5",
            env={"TMPDIR": str(tmp_path)},
        )  # fmt: skip
        await pod.wait_started()
        await wait_for(lambda: upstream.listings >= 1, timeout=30)
        began, asked = time.monotonic(), upstream.listings
        await asyncio.sleep(3.0)
        rounds = (time.monotonic() - began) / 0.5
        assert upstream.listings - asked <= rounds + 1  # once a round, not once a worker
        await asyncio.sleep(0.5)  # the listing handed to both workers

        async def client(n: int) -> None:
            async with aiohttp.ClientSession() as s:
                for i in range(6):
                    await chat(s, pod.url, ("alpha", "unlisted-model")[(n + i) % 2], 3)

        await asyncio.gather(*(client(n) for n in range(8)))
        page = await scrape(pod.admin_url)
        assert total(page, "llm_requests_total", model="alpha") == 24
        assert total(page, "llm_requests_total", model="other") == 24
        assert total(page, "llm_requests_total", model="unlisted-model") == 0
        pages = [await worker_page(sock) for sock in worker_sockets(tmp_path)]
        assert all(total(p, "llm_requests_total", model="other") > 0 for p in pages), [
            total(p, "llm_requests_total") for p in pages
        ]
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=30) == 0
    finally:
        await runner.cleanup()


async def test_a_real_prometheus_sees_no_counter_reset_when_a_worker_is_killed(
    serve_process, tmp_path
):
    """A real Prometheus scrapes the pod every 250 ms while load runs and a worker is killed
    with SIGKILL and replaced: ``resets()`` of every counter, bucket, count and sum is 0 (a
    reset is what ``rate()`` turns into a false spike), and ``increase()`` over the run is
    what the clients sent."""
    binary = require_tool("prometheus")
    upstream = CountingUpstream()
    runner, port = await start_app(upstream.app())
    prom = None
    try:
        pod = await start_pod(serve_process, f"http://127.0.0.1:{port}", tmp_path, 2)
        config = {
            "global": {"scrape_interval": "250ms", "scrape_timeout": "200ms"},
            "scrape_configs": [
                {"job_name": "llm-sidecar", "static_configs": [{"targets": [f"127.0.0.1:{pod.admin_port}"]}]}
            ],
        }  # fmt: skip
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        prom, prom_port = retry_on_port_clash(
            lambda p: subprocess.Popen(
                [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{p}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        base = f"http://127.0.0.1:{prom_port}"

        async def query(expr: str) -> list[dict]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
                async with s.get(f"{base}/api/v1/query", params={"query": expr}) as r:
                    doc = await r.json()
            assert doc["status"] == "success", doc
            return doc["data"]["result"]

        async def scraping() -> bool:
            got = await query("count_over_time(llm_sidecar_workers[1m])")
            return bool(got) and float(got[0]["value"][1]) >= 4

        await wait_for(scraping, timeout=60)
        sent = 0
        stop = asyncio.Event()

        async def load() -> None:
            nonlocal sent
            async with aiohttp.ClientSession() as s:
                while not stop.is_set():
                    try:
                        await chat(s, pod.url, MODELS[sent % 2], 4, gap=0.01)
                    except (aiohttp.ClientError, AssertionError):
                        continue  # cut by the kill: counted as an error by the pod
                    sent += 1

        loads = [asyncio.create_task(load()) for _ in range(6)]
        await asyncio.sleep(3.0)
        for sock in worker_sockets(tmp_path)[:1]:
            started = [json.loads(line) for line in pod.out if '"worker_started"' in line]
            victim = int(sock.stem[1:])
            os.kill(next(e["pid"] for e in started if e["worker"] == victim), signal.SIGKILL)
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.gather(*loads)
        await asyncio.sleep(1.5)  # the last counts scraped
        page = await scrape(pod.admin_url)
        assert total(page, "llm_sidecar_worker_restarts_total") == 1
        scraped = await query("count_over_time(llm_sidecar_workers[1m])")
        assert float(scraped[0]["value"][1]) >= 24  # scraped all along the load (7.5 s)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/api/v1/label/__name__/values") as r:
                names = [n for n in (await r.json())["data"] if n.endswith(MONOTONE)]
        assert "llm_requests_total" in names and "llm_request_duration_seconds_bucket" in names
        for name in names:
            (reset,) = await query(f"sum(resets({name}[1m])) or vector(0)")
            assert float(reset["value"][1]) == 0, name
        # The most requests a second the page ever said, over 2 s windows: a reset would
        # read as the whole total at once.
        (peak,) = await query("max_over_time(sum(rate(llm_requests_total[2s]))[1m:250ms])")
        assert float(peak["value"][1]) < 0.6 * sent, (peak, sent)
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=10)
        await runner.cleanup()


async def test_sigterm_drains_every_worker(serve_process, tmp_path):
    """SIGTERM to the supervisor: readiness goes 503 at once, the streams in flight on every
    worker end whole, the page can still be scraped while they do, and the pod exits 0."""
    upstream = CountingUpstream()
    runner, port = await start_app(upstream.app())
    try:
        pod = await start_pod(serve_process, f"http://127.0.0.1:{port}", tmp_path, 2)
        bodies: list[bytes] = []

        async def long_stream(i: int) -> None:
            async with aiohttp.ClientSession() as s:
                bodies.append(await chat(s, pod.url, MODELS[i % 2], 30, gap=0.05))

        tasks = [asyncio.create_task(long_stream(i)) for i in range(12)]
        await wait_for(lambda: upstream.streaming == 12, timeout=30)
        in_flight = [
            total(await worker_page(s), "llm_requests_in_flight") for s in worker_sockets(tmp_path)
        ]
        assert all(n > 0 for n in in_flight), in_flight  # both workers hold streams
        pod.proc.send_signal(signal.SIGTERM)

        async def not_ready() -> bool:
            async with aiohttp.ClientSession() as s:
                async with s.get(pod.admin_url + "/readyz") as r:
                    return r.status == 503 and (await r.json())["reason"] == "draining"

        await wait_for(not_ready, timeout=5)
        page = await scrape(pod.admin_url)  # the admin port is up while they drain
        assert total(page, "llm_requests_in_flight") > 0
        await asyncio.gather(*tasks)
        assert len(bodies) == 12 and all(b.endswith(DONE) for b in bodies)
        assert await asyncio.to_thread(pod.proc.wait, 30) == 0
        assert upstream.requests.total() == 12
    finally:
        await runner.cleanup()


async def test_the_series_budget_is_the_pods_under_the_hostile_label_mix(serve_process, tmp_path):
    """52 model names x 22 tenants x every API route, while the listing names ten new models
    at every refresh, through two workers: the pod's page, counted as Prometheus reads it,
    never holds more samples than --max-series (each worker has its share), and it did fill."""
    from sidecar.base.routes import ROUTES
    from sidecar.tools.sim.core import SimulatorConfig
    from sidecar.tools.sim.server import build_simulator_app

    served = "sim-llama-3-8b"
    generation = [0]

    @web.middleware
    async def rotating_listing(request: web.Request, handler):
        if request.path != "/v1/models":
            return await handler(request)
        names = [served] + [f"rot-{generation[0]}-{i}" for i in range(10)]
        return web.json_response({"object": "list", "data": [{"id": n} for n in names]})

    app = build_simulator_app(SimulatorConfig(model=served, jitter=0.0))
    app.middlewares.insert(0, rotating_listing)
    runner, port = await start_app(app)
    max_series = 6000
    try:
        pod = await start_pod(
            lambda url, *a, **k: serve_process(
                url, *a, "--tenant-header", "X-Tenant", "--model-refresh-seconds", "0.05",
                "--max-series", str(max_series), **k,
            ),
            f"http://127.0.0.1:{port}", tmp_path, 2,
        )  # fmt: skip
        routes = [r for r in ROUTES if "{" not in r]
        fast = {"x-sim-ttft": "0", "x-sim-tpot": "0", "x-sim-tokens": "2"}
        sem = asyncio.Semaphore(32)

        async def one(model: str, tenant: str, route: str) -> None:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                    "prompt": "hi", "stream": True}  # fmt: skip
            async with sem, aiohttp.ClientSession() as s:  # a connection each: both workers
                async with s.post(
                    pod.url + route, json=body, headers={**fast, "X-Tenant": tenant}
                ) as r:
                    await r.read()

        made_up = [f"made-up-{i}" for i in range(51)]
        tenants = [f"team-{i}" for i in range(22)]
        pages = []
        for g in range(3):
            generation[0] = g
            await asyncio.sleep(0.5)  # the new listing asked for and handed to both workers
            rotating = [f"rot-{g}-{i}" for i in range(10)]
            if g == 0:
                await asyncio.gather(*(one(served, t, r) for t in tenants for r in routes))
                await asyncio.gather(
                    *(one(m, t, r) for m in made_up for t in tenants[:2] for r in routes)
                )
            await asyncio.gather(
                *(one(m, t, r) for m in rotating for t in tenants[g::3][:2] for r in routes)
            )
            async with aiohttp.ClientSession() as s:
                async with s.get(pod.admin_url + "/metrics") as r:
                    pages.append(await r.read())
        counts = [count_series(p) for p in pages]
        assert all(n <= max_series for n in counts), counts
        assert max(counts) > 0.45 * max_series, counts  # at least a worker's share filled
        per_worker = [
            count_series((await _raw_worker_page(s)).encode()) for s in worker_sockets(tmp_path)
        ]
        assert all(n <= max_series // 2 for n in per_worker), per_worker
        pod.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(pod.proc.wait, 30) == 0
    finally:
        await runner.cleanup()


async def _raw_worker_page(sock: Path) -> str:
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as s:
        async with s.get("http://worker/metrics") as r:
            return await r.text()


async def test_a_label_one_worker_admits_is_every_workers_at_the_next_sync(serve_process, tmp_path):
    """One admission for the pod: a model name the server does not list and a tenant, both
    earned by answers on one connection (so on one worker), are label values of every worker
    at the next sync (``--worker-sync-seconds``), not ``other`` on the workers that have not
    served them yet."""
    upstream = CountingUpstream(lists=False)
    runner, port = await start_app(upstream.app())
    try:
        pod = await start_pod(
            lambda url, *a, **k: serve_process(url, *a, "--tenant-header", "X-Tenant", **k),
            f"http://127.0.0.1:{port}", tmp_path, 2,
            "--worker-sync-seconds", str(SYNC_SECONDS),
        )  # fmt: skip
        async with aiohttp.ClientSession() as s:  # one connection: one worker
            body = {
                "model": "zeta",
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
            for _ in range(3):
                async with s.post(pod.url + ROUTE, json=body, headers={"X-Tenant": "acme"}) as r:
                    assert r.status == 200
                    await r.read()

        async def labels(sock: Path) -> dict:
            connector = aiohttp.UnixConnector(path=str(sock))
            async with aiohttp.ClientSession(connector=connector) as s:
                async with s.get("http://worker/pod/labels") as r:
                    return await r.json()

        socks = worker_sockets(tmp_path)
        first = [await labels(sock) for sock in socks]
        assert sum("zeta" in doc["model"] for doc in first) >= 1  # the worker that answered

        async def everywhere() -> bool:
            docs = [await labels(sock) for sock in socks]
            return all("zeta" in d["model"] and "acme" in d["tenant"] for d in docs)

        began = time.monotonic()
        await wait_for(everywhere, timeout=SYNC_SECONDS + 10)
        assert time.monotonic() - began < SYNC_SECONDS + 2.0
        pod.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(pod.proc.wait, 30) == 0
    finally:
        await runner.cleanup()


async def test_the_pods_admin_port_caps_its_connections_as_the_single_process_does(
    serve_process, tmp_path
):
    upstream = CountingUpstream()
    runner, port = await start_app(upstream.app())
    idle = []
    try:
        pod = await start_pod(
            lambda url, *a, **k: serve_process(url, *a, "--max-admin-connections", "3", **k),
            f"http://127.0.0.1:{port}", tmp_path, 2,
        )  # fmt: skip
        idle = [await asyncio.open_connection("127.0.0.1", pod.admin_port) for _ in range(3)]
        raw = await raw_exchange(
            pod.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", wait=5.0
        )
        status, doc, _head = status_and_json(raw)
        assert (status, doc["error"]["type"]) == (503, "too_many_connections")
        for _, writer in idle:
            writer.close()
        idle = []
        await wait_for(lambda: readiness_ok(pod.admin_url), timeout=10)
        pod.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(pod.proc.wait, 30) == 0
    finally:
        for _, writer in idle:
            writer.close()
        await runner.cleanup()


def label_values(samples: dict, label: str) -> set[str]:
    """The values of ``label`` on a page, but for the overflow and missing ones."""
    return {dict(ls)[label] for (_n, ls), _v in samples.items() if label in dict(ls)} - {
        "other",
        "unknown",
    }


async def _kill_worker(pod, tmp: Path, victim: int) -> None:
    """``kill -9`` of worker ``victim`` (its newest process), then until it is replaced."""
    started = [json.loads(line) for line in pod.out if '"worker_started"' in line]
    restarts_before = sum(1 for e in started if e["worker"] == victim)
    pid = [e["pid"] for e in started if e["worker"] == victim][-1]
    os.kill(pid, signal.SIGKILL)

    def replaced() -> bool:
        now = [json.loads(line) for line in pod.out if '"worker_started"' in line]
        return sum(1 for e in now if e["worker"] == victim) > restarts_before

    await wait_for(replaced, timeout=30)
    await wait_for(lambda: readiness_ok(pod.admin_url), timeout=30)


async def test_the_tenant_and_model_bounds_are_the_pods_also_across_kills(serve_process, tmp_path):
    """``--workers 2 --max-tenants 10 --max-models 3``, an upstream that lists no models (so
    names earn their labels as tenants do): 40 tenants and 12 model names a round, each request
    on a connection of its own (so both workers see them), three rounds with a ``kill -9`` of a
    worker between them. Every page shows at most 10 tenant values and 3 model names (beside
    ``other``), the requests on it are what the clients sent, the page does not grow by a
    worker's set of series at each restart, and no counter, bucket, count or sum of the page
    ever decreases, scraped every 100 ms all along."""
    upstream = CountingUpstream(lists=False)
    runner, port = await start_app(upstream.app())
    scrapes: list[dict] = []
    stop_scraping = asyncio.Event()
    try:
        pod = await start_pod(
            lambda url, *a, **k: serve_process(
                url, *a, "--tenant-header", "X-Tenant", "--max-tenants", "10",
                "--max-models", "3", **k,
            ),
            f"http://127.0.0.1:{port}", tmp_path, 2,
            "--worker-sync-seconds", str(SYNC_SECONDS),
        )  # fmt: skip

        async def scraper() -> None:
            while not stop_scraping.is_set():
                scrapes.append(await scrape(pod.admin_url))
                await asyncio.sleep(0.1)

        scraping = asyncio.create_task(scraper())
        sent = 0

        async def one(tenant: str, model: str) -> None:
            nonlocal sent
            body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession() as s:  # a connection of its own: either worker
                async with s.post(
                    pod.url + ROUTE, json=body, headers={"X-Tenant": tenant, "x-tokens": "2"}
                ) as r:
                    assert r.status == 200
                    assert (await r.read()).endswith(DONE)
            sent += 1

        async def round_of(r: int) -> None:
            for _ in range(2):  # again: values earned in the first pass are labels by now
                await asyncio.gather(
                    *(one(f"team-{40 * r + i}", f"model-{12 * r + i % 12}") for i in range(40))
                )

        sizes, tenants, models = [], [], []
        for r in range(3):
            if r:
                await _kill_worker(pod, tmp_path, victim=r % 2)
            await round_of(r)
            await asyncio.sleep(SYNC_SECONDS + 1)  # a sync: the pod's labels handed round
            await round_of(r)
            await asyncio.sleep(1.2)  # past the page the scraper's last render may reuse
            async with aiohttp.ClientSession() as s:
                async with s.get(pod.admin_url + "/metrics") as resp:
                    raw = await resp.read()
            page = parse(raw.decode())
            sizes.append(count_series(raw))
            tenants.append(label_values(page, "tenant"))
            models.append(label_values(page, "model"))
            assert total(page, "llm_requests_total") == sent  # folded into other, not lost
            assert total(page, "llm_requests_total", outcome="ok") == sent
            for label in ("tenant", "model"):  # each request under other says why
                assert total(page, "llm_label_overflow_total", label=label) == total(
                    page, "llm_requests_total", **{label: "other"}
                )
            for sock in worker_sockets(tmp_path):  # steered: the pod's values, no others
                doc = await _worker_labels(sock)
                assert set(doc["tenant"]) <= tenants[-1] and set(doc["model"]) <= models[-1]
            await scrape(pod.admin_url)  # the copy the next kill leaves behind is this one
        stop_scraping.set()
        await scraping
        print("tenant values", [len(t) for t in tenants], "model values", [len(m) for m in models])
        print("samples after each round", sizes)
        assert all(len(t) <= 10 for t in tenants), [sorted(t) for t in tenants]
        assert all(len(m) <= 3 for m in models), [sorted(m) for m in models]
        assert sizes[2] <= sizes[1] <= sizes[0] + 8, sizes  # a few overflow counts at most
        for earlier, later in zip(scrapes, scrapes[1:], strict=False):
            for key, value in earlier.items():
                if key[0].endswith(MONOTONE):
                    assert later.get(key, 0.0) >= value, (key, value, later.get(key))
        pod.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(pod.proc.wait, 30) == 0
    finally:
        stop_scraping.set()
        await runner.cleanup()


async def _worker_labels(sock: Path) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as s:
        async with s.get("http://worker/pod/labels") as r:
            return await r.json()


async def test_the_series_budget_holds_across_kills_when_the_replacement_serves_other_routes(
    serve_process, tmp_path
):
    """``--workers 2 --max-series 600``, 20 tenants: a round of requests on two routes, a
    ``kill -9`` of a worker, a round on two other routes, another kill, a round on the last.
    The totals a killed worker left carry its series beside the new ones its replacement
    makes; the page, counted as Prometheus reads it, still never holds more than 600
    samples, and it did fill; no counter of it ever goes back."""
    from sidecar.base.routes import ROUTES
    from sidecar.tools.sim.core import SimulatorConfig
    from sidecar.tools.sim.server import build_simulator_app

    app = build_simulator_app(SimulatorConfig(model="sim-model", jitter=0.0))
    runner, port = await start_app(app)
    max_series = 600
    try:
        pod = await start_pod(
            lambda url, *a, **k: serve_process(
                url, *a, "--max-series", str(max_series), "--tenant-header", "X-Tenant", **k
            ),
            f"http://127.0.0.1:{port}", tmp_path, 2,
        )  # fmt: skip
        ok_routes = ("/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate")
        routes = [r for r in ROUTES if r in ok_routes or r == "/completion"]
        fast = {"x-sim-ttft": "0", "x-sim-tpot": "0", "x-sim-tokens": "2"}
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
                "prompt": "hi", "stream": True}  # fmt: skip

        async def tenant_client(tenant: str, routes: list[str]) -> None:
            """One kept-alive connection, as a client keeps it: its tenant's series are one
            worker's (the kernel hands a connection to one), unlike the other worker's."""
            headers = {**fast, "X-Tenant": tenant}
            connector = aiohttp.TCPConnector(limit=1)
            async with aiohttp.ClientSession(connector=connector) as s:
                for route in routes * 2:  # earned by the first, counted under it after
                    async with s.post(pod.url + route, json=body, headers=headers) as r:
                        assert r.status == 200
                        await r.read()

        pages: list[bytes] = []
        for r in range(3):
            if r:
                await _kill_worker(pod, tmp_path, victim=r % 2)
            mine = routes[2 * r : 2 * r + 2] or routes[:1]
            await asyncio.gather(*(tenant_client(f"team-{20 * r + i}", mine) for i in range(20)))
            async with aiohttp.ClientSession() as s:
                async with s.get(pod.admin_url + "/metrics") as resp:
                    pages.append(await resp.read())
        counts = [count_series(p) for p in pages]
        print("samples after each round", counts)
        assert all(n <= max_series for n in counts), counts
        assert max(counts) > 0.8 * max_series, counts  # it did fill
        parsed = [parse(p.decode()) for p in pages]
        for earlier, later in zip(parsed, parsed[1:], strict=False):
            for key, value in earlier.items():
                if key[0].endswith(MONOTONE):
                    assert later.get(key, 0.0) >= value, (key, value, later.get(key))
        pod.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(pod.proc.wait, 30) == 0
    finally:
        await runner.cleanup()


async def test_requests_counted_between_a_copy_and_a_give_back_stay_on_the_pods_page(tmp_path):
    """The production supervisor in the test's loop with two real worker processes, its sync's
    two steps (``refresh``, ``share_labels``) taken by the test (the interval is set past the
    test's end). ``--max-tenants 1``: worker 0 earns tenant ``kept`` first, so the page keeps
    it; worker 1 earns ``folded``, which the page folds into ``other``. After the sync's copy
    of every worker, worker 1 counts five more ``folded`` requests; then the sync gives
    ``folded`` back and worker 1 removes its series. The pod's page still counts every
    request, the five counted between the copy and the give-back too."""
    upstream = CountingUpstream(lists=False)
    runner, port = await start_app(upstream.app())
    settings = Settings(
        upstream=f"http://127.0.0.1:{port}",
        tenant_header="X-Tenant",
        max_tenants=1,
        worker_sync_seconds=3600.0,
    )
    rundir = run_directory()
    listener = reuse_port_socket("127.0.0.1", 0)
    supervisor = Supervisor(settings, 2, rundir)
    sessions: list[aiohttp.ClientSession] = []
    admin = None
    try:
        await supervisor.start(listener)
        await supervisor.listening(timeout=60)
        admin, admin_port = await start_app(supervisor.admin_app())
        admin_url = f"http://127.0.0.1:{admin_port}"
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        socks = [Path(w.admin_path) for w in supervisor.workers]
        sent = 0

        async def served() -> list[float]:
            return [total(await worker_page(sock), "llm_requests_total") for sock in socks]

        async def send(session: aiohttp.ClientSession, tenant: str | None) -> None:
            nonlocal sent
            before = await served()
            headers = {"x-tokens": "2", **({"X-Tenant": tenant} if tenant else {})}
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(url + ROUTE, json=body, headers=headers) as r:
                assert r.status == 200
                assert (await r.read()).endswith(DONE)
            sent += 1

            async def counted() -> bool:  # a request is counted just after its last byte
                return sum(await served()) == sum(before) + 1

            await wait_for(counted, timeout=10)

        # A kept-alive connection is one worker's: open connections (no tenant, no slot
        # taken) until each worker has one.
        pinned: dict[int, aiohttp.ClientSession] = {}
        for _ in range(64):
            if len(pinned) == 2:
                break
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            sessions.append(session)
            before = await served()
            await send(session, None)
            after = await served()
            pinned.setdefault(next(i for i in (0, 1) if after[i] > before[i]), session)
        assert len(pinned) == 2, "the kernel never handed a connection to one of the workers"

        await send(pinned[0], "kept")
        await scrape(admin_url)  # the page sees "kept" first: the pod's one tenant
        await send(pinned[1], "folded")
        await supervisor.refresh()  # the sync's copy of every worker
        for _ in range(5):
            await send(pinned[1], "folded")  # counted after the copy
        await supervisor.share_labels()  # "folded" given back: worker 1 removes its series
        assert "folded" not in (await _worker_labels(socks[1]))["tenant"]
        assert total(await worker_page(socks[1]), "llm_requests_total", tenant="folded") == 0

        page = await scrape(admin_url)
        assert total(page, "llm_requests_total") == sent
        assert total(page, "llm_requests_total", tenant="other") == 6
        assert total(page, "llm_label_overflow_total", label="tenant") == 6
        assert total(page, "llm_tokens_total", type="output", tenant="other") == 12
        assert total(page, "llm_time_to_first_token_seconds_count", tenant="other") == 6
        # A worker with nothing to give back answers as before: 204, nothing collected.
        connector = aiohttp.UnixConnector(path=str(socks[0]))
        async with aiohttp.ClientSession(connector=connector) as s:
            doc = {"adopt": {"tenant": []}, "give_back": {"tenant": ["folded"]}}
            async with s.post("http://worker/pod/labels", json=doc) as r:
                assert (r.status, await r.read()) == (204, b"")
    finally:
        for session in sessions:
            await session.close()
        supervisor.stop()
        await asyncio.wait_for(supervisor.all_exited.wait(), timeout=30)
        await supervisor.close()
        if admin is not None:
            await admin.cleanup()
        listener.close()
        shutil.rmtree(rundir, ignore_errors=True)
        await runner.cleanup()
