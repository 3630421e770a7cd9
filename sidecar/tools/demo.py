"""``llm-sidecar demo``: a simulated server, the sidecar and load, with live figures.

The first command a newcomer runs, so it is a real deployment in miniature::

    load generator (this process) ──► sidecar subprocess ──► simulator subprocess
                                          │ admin port: /metrics
    live table (this process) ◄── scrape ─┘ every second

The simulator and the sidecar run as their own processes (``python -m sidecar simulate``
and ``python -m sidecar serve``), exactly as a user would start them. Every figure in the
table is computed from the sidecar's ``/metrics`` the way Prometheus would compute it:
counter deltas over a sliding window for rates, and ``histogram_quantile`` over bucket
deltas for percentiles. The load generator's own error count is shown only in the final
summary, as a cross-check of what the sidecar counted.

The maths (exposition -> :class:`Snapshot`, window choice, deltas, quantiles, rates) is in
small pure functions so it can be tested by hand-computed values; the I/O is below them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "run_demo",
    "Snapshot",
    "WindowFigures",
    "parse_snapshot",
    "histogram_quantile",
    "bucket_deltas",
    "counter_delta",
    "window_baseline",
    "window_figures",
    "ADMIN_PORT_OFFSET",
]

ADMIN_PORT_OFFSET = 1384
"""The admin (metrics) port is the proxy port plus this (8080 -> 9464)."""

WINDOW_SECONDS = 10.0
"""Sliding window over which rates and percentiles are computed."""

REFRESH_SECONDS = 1.0
MAX_FAILED_SCRAPES = 5  # consecutive; then the demo stops with an error
READY_TIMEOUT = 15.0
MODEL = "sim-llama-3-8b"
HOST = "127.0.0.1"

# Realistic timing for a mid-sized model on one GPU under light load.
SIMULATOR_ARGS = (
    "--ttft", "0.25", "--tpot", "0.03", "--jitter", "0.3", "--tokens", "80",
    "--fail-rate", "0.01", "--model", MODEL,
    # Continuous batching with a knee past 4 streams (docs/capacity.md): the default 8
    # clients land in band 8, slower per stream, faster in total than band 4.
    "--batch-alpha", "0.1", "--batch-knee", "4", "--batch-knee-factor", "3",
)  # fmt: skip

# How long each child gets to exit after SIGTERM before it is killed.
SIDECAR_DRAIN_SECONDS = 5.0
SIDECAR_STOP_TIMEOUT = SIDECAR_DRAIN_SECONDS + 3.0
SIMULATOR_STOP_TIMEOUT = 3.0
LOAD_GRACE_SECONDS = 3.0  # in-flight client requests may finish before they are cancelled

RAMP_SECONDS = 2.0
"""Clients join one at a time, this far apart, so the curve fills in band by band."""

TTFT = "llm_time_to_first_token_seconds"
ITL = "llm_inter_token_latency_seconds"
TPOT = "llm_time_per_output_token_seconds"
HISTOGRAMS = (TTFT, ITL, TPOT)
ITL_BY_BAND = "llm_inter_token_latency_by_concurrency_seconds"
TOKENS_BY_BAND = "llm_decode_tokens_by_concurrency_total"
SECONDS_BY_BAND = "llm_decode_seconds_by_concurrency_total"

Buckets = tuple[tuple[float, float], ...]
"""Cumulative histogram buckets ``((le, count), ...)`` sorted by ``le``, ending at +Inf."""


# ------------------------------------------------------------------------ pure maths


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape of the sidecar's ``/metrics``, summed over every label set."""

    at: float
    """Monotonic seconds when the scrape was taken."""
    requests: float = 0.0
    """``llm_requests_total``, all outcomes."""
    errors: float = 0.0
    """``llm_requests_total{outcome="error"}``."""
    cancelled: float = 0.0
    """``llm_requests_total{outcome="cancelled"}``."""
    in_flight: float = 0.0
    """``llm_requests_in_flight`` (a gauge: the value now, not a delta)."""
    output_tokens: float = 0.0
    """``llm_tokens_total{type="output"}``."""
    histograms: Mapping[str, Buckets] = field(default_factory=dict)
    """Cumulative buckets of each histogram in :data:`HISTOGRAMS`."""
    bands: Mapping[str, "BandFigures"] = field(default_factory=dict)
    """The throughput-latency curve so far, by decode-concurrency band (docs/capacity.md)."""


@dataclass(frozen=True, slots=True)
class BandFigures:
    """One band of the curve, cumulative: ITL buckets, decode tokens and decode seconds."""

    itl: Buckets = ()
    tokens: float = 0.0
    seconds: float = 0.0


def parse_snapshot(text: str, at: float, histograms: Iterable[str] = HISTOGRAMS) -> Snapshot:
    """Prometheus text exposition -> :class:`Snapshot`, summing series across labels.

    Summing buckets across ``model``/``route`` series is what
    ``sum by (le) (rate(x_bucket[w]))`` does; it is valid because every series of one
    histogram shares the same bounds. A metric with no series yet counts as zero.
    """
    wanted = set(histograms)
    requests = errors = cancelled = in_flight = output_tokens = 0.0
    buckets: dict[str, dict[float, float]] = {name: {} for name in wanted}
    band_buckets: dict[str, dict[float, float]] = {}
    band_tokens: dict[str, float] = {}
    band_seconds: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name, labels, value = s.name, s.labels, s.value
            if name == ITL_BY_BAND + "_bucket":
                per_le = band_buckets.setdefault(labels["concurrency"], {})
                le = float(labels["le"])
                per_le[le] = per_le.get(le, 0.0) + value
            elif name == TOKENS_BY_BAND:
                band_tokens[labels["concurrency"]] = band_tokens.get(labels["concurrency"], 0.0) + value
            elif name == SECONDS_BY_BAND:
                band_seconds[labels["concurrency"]] = band_seconds.get(labels["concurrency"], 0.0) + value
            elif name == "llm_requests_total":
                requests += value
                outcome = labels.get("outcome")
                if outcome == "error":
                    errors += value
                elif outcome == "cancelled":
                    cancelled += value
            elif name == "llm_requests_in_flight":
                in_flight += value
            elif name == "llm_tokens_total" and labels.get("type") == "output":
                output_tokens += value
            elif family.name in wanted and name == family.name + "_bucket":
                le = float(labels["le"])
                per_le = buckets[family.name]
                per_le[le] = per_le.get(le, 0.0) + value
    return Snapshot(
        at=at,
        requests=requests,
        errors=errors,
        cancelled=cancelled,
        in_flight=in_flight,
        output_tokens=output_tokens,
        histograms={name: tuple(sorted(b.items())) for name, b in buckets.items()},
        bands={
            band: BandFigures(tuple(sorted(per_le.items())), band_tokens.get(band, 0.0), band_seconds.get(band, 0.0))
            for band, per_le in band_buckets.items()
        },
    )


def counter_delta(new: float, old: float) -> float:
    """Increase of a counter between two scrapes; a drop means it reset, as in ``increase()``."""
    return new - old if new >= old else new


def bucket_deltas(new: Buckets, old: Buckets) -> Buckets:
    """Per-bound increase of cumulative buckets between two scrapes (``increase(x_bucket)``).

    Bounds absent from ``old`` (the series did not exist yet) count from zero.
    """
    before = dict(old)
    return tuple((le, counter_delta(count, before.get(le, 0.0))) for le, count in new)


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q``-quantile of cumulative ``buckets``, as Prometheus's ``histogram_quantile``.

    Finds the first bucket whose cumulative count reaches ``q * total`` and interpolates
    linearly inside it, the lowest bucket starting at 0. A rank that lands in the +Inf
    bucket returns the highest finite bound. ``None`` when there are no observations (where
    Prometheus returns NaN) or no +Inf bucket.

    >>> round(histogram_quantile(0.5, ((0.1, 2.0), (0.2, 6.0), (float("inf"), 8.0))), 6)
    0.15
    """
    if not buckets or not math.isinf(buckets[-1][0]):
        return None
    total = buckets[-1][1]
    if total <= 0 or math.isnan(q):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    rank = q * total
    finite = len(buckets) - 1
    b = next((i for i in range(finite) if buckets[i][1] >= rank), finite)
    if b == finite:
        return buckets[finite - 1][0] if finite else None
    upper, count = buckets[b]
    if b == 0 and upper <= 0:
        return upper
    lower = 0.0
    if b > 0:
        lower, below = buckets[b - 1]
        count -= below
        rank -= below
    if count <= 0:
        return lower
    return lower + (upper - lower) * (rank / count)


def window_baseline(history: Sequence[Snapshot], now: float, window: float) -> Snapshot:
    """The scrape to subtract from the newest one: the oldest not older than ``window``.

    Before a whole window has passed, that is the first scrape (taken before any load),
    so early figures cover everything seen so far. ``history`` is oldest first, non-empty.
    """
    for snap in history:
        if snap.at >= now - window - 1e-6:
            return snap
    return history[-1]


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """What the live table shows; rates per second, latencies in seconds, None = no data."""

    seconds: float
    requests_per_s: float
    in_flight: float
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    tpot_p50: float | None
    output_tokens_per_s: float
    requests: float
    errors: float

    @property
    def error_ratio(self) -> float | None:
        return self.errors / self.requests if self.requests else None


def window_figures(new: Snapshot, old: Snapshot) -> WindowFigures:
    """Figures for the interval between two scrapes, as PromQL over that range would give:
    ``rate()`` of counters, ``histogram_quantile()`` of bucket increases, and the gauge now.
    """
    seconds = max(new.at - old.at, 1e-9)

    def quantile(q: float, name: str) -> float | None:
        return histogram_quantile(q, bucket_deltas(new.histograms.get(name, ()), old.histograms.get(name, ())))

    requests = counter_delta(new.requests, old.requests)
    return WindowFigures(
        seconds=seconds,
        requests_per_s=requests / seconds,
        in_flight=new.in_flight,
        ttft_p50=quantile(0.5, TTFT),
        ttft_p99=quantile(0.99, TTFT),
        itl_p50=quantile(0.5, ITL),
        itl_p99=quantile(0.99, ITL),
        tpot_p50=quantile(0.5, TPOT),
        output_tokens_per_s=counter_delta(new.output_tokens, old.output_tokens) / seconds,
        requests=requests,
        errors=counter_delta(new.errors, old.errors),
    )


def _band_order(band: str) -> float:
    return math.inf if band == "+Inf" else float(band)


def curve_lines(new: Snapshot, old: Snapshot, width: int = 24) -> list[str]:
    """The throughput-latency curve since ``old``: per decode-concurrency band with gaps,
    ITL p50/p95, decode tokens/s at that band and a bar of the p95 (the longest is full).
    What ``llm:slo_capacity:*`` reads (docs/capacity.md), from this sidecar's own traffic."""
    rows = []
    for band in sorted(new.bands, key=_band_order):
        now, then = new.bands[band], old.bands.get(band, BandFigures())
        deltas = bucket_deltas(now.itl, then.itl)
        if not deltas or deltas[-1][1] <= 0:
            continue
        seconds = counter_delta(now.seconds, then.seconds)
        tokens = counter_delta(now.tokens, then.tokens)
        p95 = histogram_quantile(0.95, deltas)
        rows.append((band, histogram_quantile(0.5, deltas), p95, tokens / seconds if seconds > 0 else None))
    if not rows:
        return []
    longest = max((r[2] for r in rows if r[2] is not None and math.isfinite(r[2])), default=0.0)
    lines = ["  decode streams   ITL p50    ITL p95   tok/s   (the pod's curve: latency grows with load)"]
    for band, p50, p95, rate in rows:
        filled = round(width * p95 / longest) if longest and p95 is not None and math.isfinite(p95) else 0
        speed = "-" if rate is None else f"{rate:.0f}"
        lines.append(
            f"  {'<= ' + band if band != '+Inf' else '> 128':>14}  {format_seconds(p50):>8}  {format_seconds(p95):>9}  {speed:>6}   {'█' * filled}"
        )
    return lines


def format_seconds(value: float | None) -> str:
    """``0.2625`` -> ``"262 ms"``; ``12.3`` -> ``"12.3 s"``; ``None`` -> ``"-"``."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    if value < 10.0:
        return f"{value * 1000:.0f} ms"
    return f"{value:.1f} s"


def format_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


# ------------------------------------------------------------------------ rendering


def plain_line(f: WindowFigures, elapsed: float) -> str:
    """One self-contained line per refresh, for logs and CI (no terminal codes)."""
    return (
        f"[{elapsed:5.1f}s] req/s {f.requests_per_s:.1f}  in-flight {f.in_flight:.0f}  "
        f"TTFT p50 {format_seconds(f.ttft_p50)} p99 {format_seconds(f.ttft_p99)}  "
        f"ITL p50 {format_seconds(f.itl_p50)} p99 {format_seconds(f.itl_p99)}  "
        f"TPOT p50 {format_seconds(f.tpot_p50)}  out tok/s {f.output_tokens_per_s:.0f}  "
        f"errors {f.errors:.0f} ({format_ratio(f.error_ratio)})"
    )


def table_lines(f: WindowFigures, elapsed: float, concurrency: int, curve: Sequence[str] = ()) -> list[str]:
    """The live table, redrawn in place on a terminal; the curve since the start below it."""
    w = min(f.seconds, WINDOW_SECONDS)
    return [
        f"  up {elapsed:4.0f}s   {concurrency} clients   figures over the last {w:.0f}s, from /metrics",
        "  ───────────────────────────────────────────────────────────────",
        f"  requests/s    {f.requests_per_s:8.1f}      in flight      {f.in_flight:6.0f}",
        f"  TTFT     p50  {format_seconds(f.ttft_p50):>8}      p99        {format_seconds(f.ttft_p99):>10}",
        f"  ITL      p50  {format_seconds(f.itl_p50):>8}      p99        {format_seconds(f.itl_p99):>10}",
        f"  TPOT     p50  {format_seconds(f.tpot_p50):>8}",
        f"  output tok/s  {f.output_tokens_per_s:8.0f}",
        f"  errors        {f.errors:8.0f}      ratio      {format_ratio(f.error_ratio):>10}",
        "",
        *curve,
        *([""] if curve else []),
        "  Ctrl-C to stop",
    ]


class _Screen:
    """Redraws a block of lines in place on a TTY; prints one plain line otherwise."""

    def __init__(self, stream, live: bool) -> None:
        self._out = stream
        self.live = live
        self._drawn = 0

    def show(self, figures: WindowFigures, elapsed: float, concurrency: int, curve: Sequence[str] = ()) -> None:
        if not self.live:
            self._out.write(plain_line(figures, elapsed) + "\n")
        else:
            lines = table_lines(figures, elapsed, concurrency, curve)
            prefix = f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""
            self._out.write(prefix + "\n".join(lines) + "\n")
            self._drawn = len(lines)
        self._out.flush()

    def text(self, message: str) -> None:
        self._out.write(message + "\n")
        self._out.flush()
        self._drawn = 0  # the block above is now history; draw the next one below


# ------------------------------------------------------------------------ processes


class DemoError(Exception):
    """Ends the demo with a message for the user and an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _port_free(port: int, host: str = HOST) -> bool:
    # SO_REUSEADDR as aiohttp binds, so a port in TIME_WAIT is not reported as taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _parent_death_signal():
    """On Linux, a child gets SIGTERM if the demo itself is killed (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes  # noqa: PLC0415

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


class _Child:
    """A subprocess whose combined output goes to an anonymous file, for error messages."""

    def __init__(self, name: str, args: Sequence[str]) -> None:
        self.name = name
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", *args],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            # Own process group: a Ctrl-C in the terminal reaches only the demo, which then
            # stops load, reads the final figures and stops the children in order.
            start_new_session=True,
            preexec_fn=_parent_death_signal(),
        )

    @property
    def exited(self) -> bool:
        return self.proc.poll() is not None

    def tail(self, lines: int = 15) -> str:
        try:
            self.log.seek(0)
            data = self.log.read()
        except (OSError, ValueError):
            return ""
        text = data.decode("utf-8", "replace").rstrip()
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        self.log.close()


def _exited_message(child: _Child, what: str) -> str:
    tail = child.tail()
    detail = ("\n" + _indent(tail)) if tail else " (no output)"
    return f"the {child.name} exited with code {child.proc.returncode} {what}:{detail}"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


# ------------------------------------------------------------------------ load


@dataclass
class LoadStats:
    """What the load generator saw (client side)."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    stopped: int = 0
    """Cut short when the demo stopped (the sidecar counts them as ``cancelled``)."""


_PROMPTS = (
    "Explain time to first token in one paragraph.",
    "Write a haiku about tail latency.",
    "Summarise why p99 matters more than the mean for interactive chat.",
    "List three causes of slow prefill.",
    "hi",
)
_MAX_TOKENS = (16, 32, 64, 96, 128, 192)


def _request(rng: random.Random) -> tuple[str, dict, bool]:
    """One request of the mix: mostly streamed chat, some completions and non-streamed."""
    roll = rng.random()
    chat = roll < 0.8
    stream = roll < 0.65 or 0.8 <= roll < 0.92
    prompt = rng.choice(_PROMPTS)
    body: dict = {"model": MODEL, "max_tokens": rng.choice(_MAX_TOKENS)}
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        path = "/v1/completions"
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    return path, body, stream


async def _one_request(session: aiohttp.ClientSession, base: str, rng: random.Random) -> bool:
    path, body, stream = _request(rng)
    async with session.post(base + path, json=body) as resp:
        if resp.status != 200:
            await resp.read()
            return False
        if not stream:
            doc = await resp.json()
            return isinstance(doc, dict) and "error" not in doc
        done = False
        async for line in resp.content:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b'data: {"error"'):
                return False
        return done  # no [DONE]: the stream was cut


async def _client_loop(
    session: aiohttp.ClientSession, base: str, stats: LoadStats, stop: asyncio.Event, seed: int, delay: float = 0.0
) -> None:
    rng = random.Random(seed)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), delay)  # join the ramp (or leave if stopped first)
    while not stop.is_set():
        stats.sent += 1
        try:
            ok = await _one_request(session, base, rng)
        except asyncio.CancelledError:
            stats.stopped += 1
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            ok = False
            await asyncio.sleep(0.05)  # do not spin if the sidecar is gone
        if ok:
            stats.ok += 1
        else:
            stats.errors += 1


# ------------------------------------------------------------------------ the demo


async def _scrape(session: aiohttp.ClientSession, url: str) -> Snapshot:
    async with session.get(url) as resp:
        resp.raise_for_status()
        text = await resp.text()
    return parse_snapshot(text, time.monotonic())


async def _wait_ready(session: aiohttp.ClientSession, url: str, children: Sequence[_Child]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    last = "no answer"
    while True:
        for child in children:
            if child.exited:
                tail = child.tail()
                if child.proc.returncode == 2 and "cannot listen" in tail:
                    # Someone took the port between our check and the bind: still a one-liner.
                    raise DemoError(f"{child.name}: {tail.splitlines()[-1].removeprefix('llm-sidecar: ')}", 2)
                raise DemoError(_exited_message(child, "before the sidecar was ready"))
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                body = await resp.text()
                if resp.status == 200:
                    return
                last = f"{resp.status} {body.strip()}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            last = type(exc).__name__
        if time.monotonic() > deadline:
            tails = "".join(
                f"\n  {c.name} output:\n{_indent(c.tail()) or '    (none)'}" for c in children
            )
            raise DemoError(f"the sidecar was not ready after {READY_TIMEOUT:.0f}s ({url}: {last}){tails}")
        await asyncio.sleep(0.1)


def _intro(port: int, admin: int, sim_port: int, concurrency: int, duration: float | None) -> str:
    body = '{"model":"%s","stream":true,"messages":[{"role":"user","content":"hi"}]}' % MODEL
    until = "Ctrl-C" if duration is None else f"{duration:g}s"
    return "\n".join(
        [
            "llm-sidecar demo: simulated vLLM server -> sidecar -> your client",
            f"  simulated server   http://{HOST}:{sim_port}   (ttft ~0.25s, tpot ~0.03s, 1% errors)",
            f"  sidecar proxy      http://{HOST}:{port}",
            f"  sidecar metrics    http://{HOST}:{admin}/metrics   (what Prometheus would scrape)",
            "  try it:",
            f"    curl -N http://{HOST}:{port}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'",
            f"  load: {concurrency} concurrent clients (joining {RAMP_SECONDS:g}s apart) until {until}",
            "",
        ]
    )


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"stopped by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _summary(first: Snapshot, last: Snapshot, load: LoadStats, codes: Mapping[str, int]) -> str:
    f = window_figures(last, first)
    total = f.requests
    cancelled = counter_delta(last.cancelled, first.cancelled)
    ok = total - f.errors - cancelled
    exits = ", ".join(f"{name} {_exit_text(code)}" for name, code in codes.items())
    return "\n".join(
        [
            f"summary over {f.seconds:.1f}s (from the sidecar's /metrics):",
            f"  requests       {total:.0f} ({f.requests_per_s:.1f}/s): {ok:.0f} ok, {f.errors:.0f} error, "
            f"{cancelled:.0f} cancelled; error ratio {format_ratio(f.error_ratio)}",
            f"  TTFT           p50 {format_seconds(f.ttft_p50)}   p99 {format_seconds(f.ttft_p99)}",
            f"  ITL            p50 {format_seconds(f.itl_p50)}   p99 {format_seconds(f.itl_p99)}",
            f"  TPOT           p50 {format_seconds(f.tpot_p50)}",
            f"  output tokens  {counter_delta(last.output_tokens, first.output_tokens):.0f} "
            f"({f.output_tokens_per_s:.0f}/s)",
            *curve_lines(last, first),
            f"  load generator sent {load.sent}: {load.ok} ok, {load.errors} error, "
            f"{load.stopped} stopped by the end of the demo",
            f"  {exits}" if exits else "",
        ]
    ).rstrip()


async def _demo(duration: float | None, concurrency: int, port: int, screen: _Screen) -> int:
    admin = port + ADMIN_PORT_OFFSET
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main = asyncio.current_task()

    def on_signal() -> None:
        if stop.is_set() and main is not None:
            main.cancel()  # a second Ctrl-C: stop now, the finally still reaps the children
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)

    sim_port = _free_port()
    children: list[_Child] = []
    load_tasks: list[asyncio.Task] = []
    stats = LoadStats()
    codes: dict[str, int] = {}
    try:
        simulator = _Child("simulator", ["simulate", "--listen", f"{HOST}:{sim_port}", *SIMULATOR_ARGS])
        children.append(simulator)
        sidecar = _Child(
            "sidecar",
            [
                "serve",
                "--upstream", f"http://{HOST}:{sim_port}",
                "--listen", f"{HOST}:{port}",
                "--metrics-listen", f"{HOST}:{admin}",
                "--log-level", "warning",
                "--access-log", "false",
                "--drain-seconds", f"{SIDECAR_DRAIN_SECONDS:g}",
            ],
        )  # fmt: skip
        children.append(sidecar)

        admin_timeout = aiohttp.ClientTimeout(total=5.0)
        async with aiohttp.ClientSession(timeout=admin_timeout) as admin_session:
            await _wait_ready(admin_session, f"http://{HOST}:{admin}/readyz", children)
            metrics_url = f"http://{HOST}:{admin}/metrics"
            first = await _scrape(admin_session, metrics_url)
            history: deque[Snapshot] = deque([first], maxlen=int(WINDOW_SECONDS / REFRESH_SECONDS) + 5)
            screen.text(_intro(port, admin, sim_port, concurrency, duration))

            client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=30.0)
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(timeout=client_timeout, connector=connector) as load_session:
                base = f"http://{HOST}:{port}"
                seed = random.randrange(1 << 30)
                load_tasks = [
                    asyncio.create_task(_client_loop(load_session, base, stats, stop, seed + i, i * RAMP_SECONDS))
                    for i in range(concurrency)
                ]
                started = first.at
                deadline = None if duration is None else started + duration
                tick = started
                failed_scrapes = 0
                while not stop.is_set():
                    tick += REFRESH_SECONDS
                    wake = tick if deadline is None else min(tick, deadline)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), max(0.0, wake - time.monotonic()))
                    for child in children:
                        if child.exited:
                            raise DemoError(_exited_message(child, "while the demo was running"))
                    if stop.is_set():
                        break
                    try:
                        snap = await _scrape(admin_session, metrics_url)
                    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                        failed_scrapes += 1
                        if failed_scrapes >= MAX_FAILED_SCRAPES:
                            raise DemoError(f"cannot scrape {metrics_url}: {exc!r}") from None
                        continue  # skip this refresh; the window absorbs the gap
                    failed_scrapes = 0
                    history.append(snap)
                    base_snap = window_baseline(history, snap.at, WINDOW_SECONDS)
                    screen.show(window_figures(snap, base_snap), snap.at - started, concurrency, curve_lines(snap, first))
                    if deadline is not None and snap.at >= deadline - 1e-3:
                        break

                # Stop the load: no new requests; in-flight ones get a moment to finish.
                stop.set()
                _, pending = await asyncio.wait(load_tasks, timeout=LOAD_GRACE_SECONDS)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*load_tasks, return_exceptions=True)
            # The load session is closed: no client connection is left for the drain.
            try:
                last = await _scrape(admin_session, metrics_url)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise DemoError(f"cannot scrape {metrics_url} for the summary: {exc!r}") from None

        # As a pod with a native sidecar stops: the server first, then the sidecar, which
        # drains for as long as its upstream answers (sidecar/relay/drain.py).
        codes["simulator"] = simulator.stop(SIMULATOR_STOP_TIMEOUT)
        codes["sidecar"] = sidecar.stop(SIDECAR_STOP_TIMEOUT)
        screen.text("\n" + _summary(first, last, stats, codes))
        if codes["sidecar"] != 0:
            raise DemoError(_exited_message(sidecar, "on SIGTERM (expected 0 after draining)"))
        return 0
    finally:
        for task in load_tasks:
            task.cancel()
        for child in children:  # the upstream first, then the sidecar (it follows it down)
            child.stop(SIDECAR_STOP_TIMEOUT if child.name == "sidecar" else SIMULATOR_STOP_TIMEOUT)
            child.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def run_demo(duration: float | None = None, concurrency: int = 8, port: int = 8080) -> int:
    """Run the demo; returns the process exit code (0 ok, 1 failure, 2 bad usage or port taken)."""

    def fail(message: str, code: int) -> int:
        print(f"llm-sidecar demo: {message}", file=sys.stderr, flush=True)
        return code

    admin = port + ADMIN_PORT_OFFSET
    if port < 1 or admin > 65535:
        top = 65535 - ADMIN_PORT_OFFSET
        return fail(f"--port must be 1-{top} (the metrics port is --port + {ADMIN_PORT_OFFSET})", 2)
    if concurrency < 1:
        return fail("--concurrency must be at least 1", 2)
    if duration is not None and not duration > 0:
        return fail("--duration must be a positive number of seconds", 2)
    for p, what in ((port, "proxy"), (admin, "metrics")):
        if not _port_free(p):
            return fail(f"{HOST}:{p} ({what} port) is already in use; pick another with --port (make demo PORT=...)", 2)

    screen = _Screen(sys.stdout, live=sys.stdout.isatty() and os.environ.get("TERM") != "dumb")
    try:
        return asyncio.run(_demo(duration, concurrency, port, screen))
    except DemoError as exc:
        return fail(str(exc), exc.code)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return fail("interrupted", 130)
