"""N fake pods from one process: each serves the recorded /metrics pages of one sidecar, its
counters advancing as a pod's would.

    python -m bench.fleet_pods --pages pages.json --pods 200 --port 9000

Pod ``i`` answers ``GET /pods/<i>/metrics``; Prometheus tells the pods apart by the labels its
scrape configuration gives each target (namespace, pod, release: see :mod:`bench.fleet`), as the
PodMonitor's relabelings would, so every pod serves the same page text.

How a page moves: the recording holds pages ``P_0 .. P_K`` read at ``t_0 .. t_K``. A pod at
``x`` seconds (its own phase, drawn per pod, plus the seconds this process has served) is in
cycle ``c = 1 + x // span`` at ``r = x % span`` and serves the last page read by ``t_0 + r``,
every counter (counters, and a histogram's or summary's ``_bucket``, ``_count``, ``_sum``) raised
by ``c`` times its growth over the recording (``P_K - P_0``): the counters keep growing at the
recorded rate and never go back, a histogram stays cumulative, and a pod starts where the
recording ended (every series it ever had already there). Gauges take the page's value.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

COUNTER_TYPES = {"counter": ("_total", ""), "histogram": ("_bucket", "_count", "_sum"),
                 "summary": ("_count", "_sum")}  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Sample:
    family: str
    kind: str  # counter, gauge, histogram, summary, untyped
    name: str
    key: str  # name{labels}
    value: float

    @property
    def counts(self) -> bool:
        """A sample that only grows: a counter's, or a histogram's/summary's cumulative one."""
        suffixes = COUNTER_TYPES.get(self.kind)
        if suffixes is None:
            return False
        rest = self.name[len(self.family) :]
        return rest in suffixes


def parse_page(text: str) -> tuple[list[str], list[Sample]]:
    """The page's header lines (``# HELP``/``# TYPE``, in order, each before its family's
    samples) and its samples."""
    kinds: dict[str, str] = {}
    family = ""
    samples = []
    order: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                family = parts[2]
                kinds[family] = parts[3]
            order.append(line)
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        fam = family if name.startswith(family) else name
        samples.append(Sample(fam, kinds.get(fam, "untyped"), name, key, float(value)))
        order.append(key)
    return order, samples


class Replay:
    """The recorded pages, rendered for any moment of any pod."""

    def __init__(self, pages: list[dict]) -> None:
        if len(pages) < 2:
            raise ValueError("a replay needs at least two recorded pages")
        self.times = [p["t"] for p in pages]
        self.span = self.times[-1] - self.times[0]
        if self.span <= 0:
            raise ValueError("the pages must be read at increasing times")
        parsed = [parse_page(p["text"]) for p in pages]
        self.layout, last = parsed[-1]
        first = {s.key: s.value for s in parsed[0][1]}
        self.last = {s.key: s for s in last}
        self.delta = {s.key: s.value - first.get(s.key, 0.0) for s in last if s.counts}
        self.values = [{s.key: s.value for s in samples} for _, samples in parsed]
        self._cache: dict[tuple[int, int], bytes] = {}

    def at(self, x: float) -> tuple[int, int]:
        """(page index, cycle) at ``x`` seconds into a pod's life."""
        cycle, r = 1 + int(x // self.span), x % self.span
        k = 0
        while k + 1 < len(self.times) and self.times[k + 1] - self.times[0] <= r:
            k += 1
        return k, cycle

    def render(self, k: int, cycle: int) -> bytes:
        cached = self._cache.get((k, cycle))
        if cached is not None:
            return cached
        page = self.values[k]
        out = []
        for item in self.layout:
            if item.startswith("#"):
                out.append(item)
                continue
            sample = self.last[item]
            if item in self.delta:
                value = page.get(item, 0.0) + cycle * self.delta[item]
            else:
                value = page.get(item, sample.value)
            out.append(f"{item} {value!r}")
        body = ("\n".join(out) + "\n").encode()
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[(k, cycle)] = body
        return body


def build_pods_app(replay: Replay, pods: int, seed: int = 0) -> web.Application:
    rng = random.Random(seed)
    phases = [rng.uniform(0, replay.span) for _ in range(pods)]
    started = time.monotonic()
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        i = int(request.match_info["i"])
        if not 0 <= i < pods:
            raise web.HTTPNotFound()
        k, cycle = replay.at(phases[i] + time.monotonic() - started)
        return web.Response(body=replay.render(k, cycle), headers={"Content-Type": CONTENT_TYPE})

    async def ready(request: web.Request) -> web.Response:  # noqa: ARG001
        return web.Response(text="ok")

    app.router.add_get("/pods/{i}/metrics", metrics)
    app.router.add_get("/ready", ready)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--pages", type=Path, required=True, help="a recording (bench.fleet --save-pages)"
    )
    p.add_argument("--pods", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seed", type=int, default=0, help="draws each pod's phase")
    args = p.parse_args(argv)
    replay = Replay(orjson.loads(args.pages.read_bytes())["pages"])
    web.run_app(
        build_pods_app(replay, args.pods, args.seed),
        host="127.0.0.1", port=args.port, access_log=None, print=None,
    )  # fmt: skip


if __name__ == "__main__":
    main()
