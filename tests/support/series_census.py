"""The series a pod's /metrics page holds under a realistic mix, counted the way a fleet pays
for them: by family, by label, and how many never moved.

The mix: three models, each its own simulator (sidecar/tools/sim) behind one upstream that
routes by the body's ``model`` and lists all three on ``/v1/models`` (a multi-model server);
chat and completions; 80 % streamed; the simulators' own 500s and dropped streams; streams
the client cancels part way; requests for models nobody serves (404s); some chat requests
whose usage reports cached prompt tokens. Poisson arrivals at ``rate`` a second, seeded.

The sidecar is ``llm-sidecar serve`` as a subprocess with the chart's defaults (only the
upstream and the ports given), so the page counted is the production one.

Run it by hand (the figures in docs/metrics.md, "Series a pod"):

    .venv/bin/python -m tests.support.series_census --seconds 45
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app

__all__ = [
    "MIX_MODELS",
    "CensusRun",
    "PageCensus",
    "census_of",
    "census_run",
    "mix_upstream",
    "run_mix",
]

MIX_MODELS: dict[str, SimulatorConfig] = {
    "llama-3.1-8b": SimulatorConfig(
        model="llama-3.1-8b", ttft=0.15, tpot=0.02, tokens=48, jitter=0.3,
        fail_rate=0.02, drop_rate=0.02, seed=1, force_include_usage=True,
    ),
    "qwen2.5-7b": SimulatorConfig(
        model="qwen2.5-7b", ttft=0.35, tpot=0.03, tokens=32, jitter=0.3,
        fail_rate=0.02, drop_rate=0.02, seed=2, force_include_usage=True,
    ),
    "mistral-7b": SimulatorConfig(
        model="mistral-7b", ttft=0.8, tpot=0.015, tokens=40, jitter=0.3,
        fail_rate=0.02, drop_rate=0.02, seed=3, force_include_usage=True,
    ),
}  # fmt: skip
"""The served models (the chart's vLLM flags: usage on every stream)."""

_WEIGHTS = (0.5, 0.3, 0.2)
_UNKNOWN_MODELS = ("gpt-4o", "llama-3-70b", "claude-3", "my-finetune")
_UNKNOWN_SHARE = 0.05
_STREAMED_SHARE = 0.8
_CHAT_SHARE = 0.75
_CANCEL_SHARE = 0.03  # of streams: the client leaves after a few lines
_CACHED_SHARE = 0.15  # of chat requests: usage reports cached prompt tokens


@contextlib.asynccontextmanager
async def mix_upstream() -> AsyncIterator[str]:
    """Three simulators behind one router on 127.0.0.1; yields the router's URL. Everything
    started here is cleaned up on the way out, also on failure."""
    runners: list[web.AppRunner] = []
    sims: dict[str, str] = {}
    session = aiohttp.ClientSession(
        auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)
    )
    try:
        for name, config in MIX_MODELS.items():
            sims[name] = await _start(build_simulator_app(config), runners)
        first = next(iter(sims.values()))

        async def models(request: web.Request) -> web.Response:
            data = [{"id": n, "object": "model", "owned_by": "vllm"} for n in MIX_MODELS]
            return web.json_response({"object": "list", "data": data})

        async def relay(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            target = first
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                target = sims.get(json.loads(body).get("model"), first)
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() not in ("host", "content-length", "transfer-encoding", "connection")
            }
            async with session.request(
                request.method, target + request.path_qs, data=body, headers=headers
            ) as up:
                out = web.StreamResponse(status=up.status)
                for k in ("Content-Type", "x-queue-time"):
                    if k in up.headers:
                        out.headers[k] = up.headers[k]
                await out.prepare(request)
                try:
                    async for chunk in up.content.iter_any():
                        await out.write(chunk)
                except aiohttp.ClientPayloadError:  # the simulator dropped the stream: so do we
                    assert request.transport is not None
                    request.transport.abort()
                    return out
                await out.write_eof()
                return out

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_route("*", "/{tail:.*}", relay)
        yield await _start(app, runners)
    finally:
        await session.close()
        for runner in reversed(runners):
            await runner.cleanup()


async def _start(app: web.Application, runners: list[web.AppRunner]) -> str:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    runners.append(runner)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return f"http://127.0.0.1:{port}"


@dataclass
class MixStats:
    """What the client sent and saw, by kind."""

    sent: Counter[str] = field(default_factory=Counter)


def _request(rng: random.Random) -> tuple[str, dict[str, Any], dict[str, str], str]:
    """One request of the mix: path, body, headers, and its kind for the client's tally."""
    if rng.random() < _UNKNOWN_SHARE:
        model, kind = rng.choice(_UNKNOWN_MODELS), "unknown-model"
    else:
        model = rng.choices(list(MIX_MODELS), _WEIGHTS)[0]
        kind = "served"
    chat = rng.random() < _CHAT_SHARE
    body: dict[str, Any] = {"model": model, "max_tokens": rng.choice((16, 32, 64, 96))}
    headers: dict[str, str] = {}
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": "word " * rng.randint(5, 400)}]
        if rng.random() < _CACHED_SHARE:
            prompt = 1 + 2 * len(body["messages"][0]["content"].split())  # at most the prompt
            headers["x-sim-cached-tokens"] = str(rng.choice((0, prompt // 4, prompt)))
    else:
        path = "/v1/completions"
        body["prompt"] = "word " * rng.randint(5, 400)
    if rng.random() < _STREAMED_SHARE:
        body["stream"] = True
        if rng.random() < _CANCEL_SHARE:
            kind = "cancelled"
    return path, body, headers, kind


async def _one(session: aiohttp.ClientSession, url: str, req: tuple, stats: MixStats) -> None:
    path, body, headers, kind = req
    stats.sent[kind] += 1
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        async with session.post(url + path, json=body, headers=headers) as resp:
            stats.sent[f"status {resp.status}"] += 1
            if kind == "cancelled":
                for _ in range(3):
                    await resp.content.readline()
                resp.close()  # the client leaves mid-stream
                return
            await resp.read()


async def run_mix(sidecar_url: str, seconds: float, rate: float = 6.0, seed: int = 50) -> MixStats:
    """Send the mix through ``sidecar_url`` for ``seconds``, Poisson arrivals at ``rate``; waits
    for every request to end."""
    rng = random.Random(seed)
    stats = MixStats()
    tasks: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.monotonic()
        at = 0.0
        while at < seconds:
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(_one(session, sidecar_url, _request(rng), stats))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            at += rng.expovariate(rate)
        if tasks:
            await asyncio.wait(tasks)
    return stats


@dataclass(frozen=True)
class PageCensus:
    """One /metrics page, counted: ``total`` samples (every line that is not a comment);
    ``families`` samples by family (the name without ``_bucket``/``_sum``/``_count``/
    ``_total``); ``labels`` samples carrying each label name; ``buckets``; ``zero``, samples
    at 0 (never moved); ``idle_buckets``, buckets holding no observation of their own (equal
    to the bucket below); and ``zero_by_family``."""

    total: int
    families: Counter[str]
    labels: Counter[str]
    buckets: int
    zero: int
    idle_buckets: int
    zero_by_family: Counter[str]

    def report(self, top: int = 40) -> str:
        lines = [
            f"series {self.total}; _bucket {self.buckets} "
            f"({100 * self.buckets / max(self.total, 1):.0f} %); never moved {self.zero} "
            f"({100 * self.zero / max(self.total, 1):.0f} %); buckets without an observation "
            f"of their own {self.idle_buckets}",
            "by family (series, of them at 0):",
        ]
        for name, n in self.families.most_common(top):
            lines.append(f"  {n:6d} {self.zero_by_family[name]:6d}  {name}")
        lines.append("by label (series carrying it):")
        for name, n in self.labels.most_common():
            lines.append(f"  {n:6d}  {name}")
        return "\n".join(lines)


_SUFFIXES = ("_bucket", "_sum", "_count", "_total")


def _parse(line: str) -> tuple[str, dict[str, str], float]:
    name, _, rest = line.partition("{")
    labels: dict[str, str] = {}
    if rest:
        body, _, value = rest.rpartition("}")
        for part in _split_labels(body):
            key, _, raw = part.partition("=")
            labels[key.strip()] = raw.strip().strip('"')
        text = value.split()[0]
    else:
        name, text = line.split()[:2]
    return name.strip(), labels, float(text)


def _split_labels(body: str) -> list[str]:
    parts, cur, quoted, escaped = [], "", False, False
    for ch in body:
        if escaped:
            cur, escaped = cur + ch, False
        elif ch == "\\":
            cur, escaped = cur + ch, True
        elif ch == '"':
            cur, quoted = cur + ch, not quoted
        elif ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def census_of(page: str) -> PageCensus:
    """Count a text exposition (as ``/metrics`` serves it)."""
    families: Counter[str] = Counter()
    zero_by_family: Counter[str] = Counter()
    labels: Counter[str] = Counter()
    total = buckets = zero = idle = 0
    below: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in page.splitlines():
        if not line or line.startswith("#"):
            continue
        name, lab, value = _parse(line)
        family = name
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                family = name[: -len(suffix)]
                break
        total += 1
        families[family] += 1
        labels.update(lab.keys())
        if value == 0:
            zero += 1
            zero_by_family[family] += 1
        if name.endswith("_bucket"):
            buckets += 1
            key = (name, tuple(sorted((k, v) for k, v in lab.items() if k != "le")))
            if value == below.get(key, 0.0):  # the page lists a child's bounds in order
                idle += 1
            below[key] = value
    return PageCensus(total, families, labels, buckets, zero, idle, zero_by_family)


@dataclass(frozen=True)
class CensusRun:
    """What a run saw: ``page``, the /metrics page once every request had ended, and
    ``busiest``, the largest page scraped while the mix was running (the in-flight families
    are there only then), with its series count."""

    page: str
    busiest: str
    busiest_total: int


async def census_run(
    seconds: float, rate: float, seed: int, extra: tuple[str, ...] = (), every: float = 5.0
) -> CensusRun:
    """Start the mix's upstream and ``llm-sidecar serve`` (the chart's defaults plus
    ``extra``), run the mix while scraping /metrics every ``every`` seconds as Prometheus
    would, and return the pages."""
    from tests.support.serve import ServeProcess  # noqa: PLC0415 (a test helper's import)

    async with mix_upstream() as upstream:
        serve = ServeProcess(upstream, *extra, clean_env=True)
        try:
            await serve.wait_alive()
            async with aiohttp.ClientSession() as session:

                async def scrape() -> str:
                    async with session.get(serve.admin_url + "/metrics") as resp:
                        assert resp.status == 200, resp.status
                        return await resp.text()

                busiest, most = "", -1
                mix = asyncio.create_task(run_mix(serve.url, seconds, rate, seed))
                while not mix.done():
                    await asyncio.wait({mix}, timeout=every)
                    page = await scrape()
                    total = census_of(page).total
                    if total > most:
                        busiest, most = page, total
                await mix
                return CensusRun(await scrape(), busiest, most)
        finally:
            serve.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=50)
    parser.add_argument("--page", help="also write the page to this file")
    args = parser.parse_args()
    run = asyncio.run(census_run(args.seconds, args.rate, args.seed))
    if args.page:
        with open(args.page, "w") as f:
            f.write(run.page)
    print(census_of(run.page).report())
    print(f"busiest page scraped during the mix: {run.busiest_total} series")


if __name__ == "__main__":
    main()
