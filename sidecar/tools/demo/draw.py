"""What the demo prints: the header (addresses, the simulator's timing and batching model,
the load), the live table over the last seconds (redrawn in place on a terminal, one plain
line per refresh otherwise), the throughput-latency curve by band since the start, the final
summary."""

from __future__ import annotations

import contextlib
import json
import math
import signal
from collections.abc import Mapping, Sequence
from typing import TextIO

from ..sim.core import SimulatorConfig
from .exposition import BandFigures, Snapshot
from .load import LoadStats
from .quantiles import (
    WINDOW_SECONDS,
    WindowFigures,
    bucket_deltas,
    counter_delta,
    histogram_quantile,
    window_figures,
)

__all__ = [
    "BAR_WIDTH",
    "Screen",
    "batching_lines",
    "curve_lines",
    "format_ratio",
    "format_seconds",
    "intro",
    "plain_line",
    "summary",
    "table_lines",
]

BAR_WIDTH = 24
"""Characters of the curve's ITL p95 bar for the slowest band."""


def _band_order(band: str) -> float:
    return math.inf if band == "+Inf" else float(band)


def curve_lines(new: Snapshot, old: Snapshot, width: int = BAR_WIDTH) -> list[str]:
    """The throughput-latency curve between two scrapes (the demo passes the first one, so
    it covers the whole run): per decode-concurrency band with gaps, ITL p50/p95, a bar of
    the p95 right beside it (the slowest band's fills ``width``), then the pod's decode
    tokens/s at that band. What ``llm:slo_capacity:*`` reads (docs/capacity.md), from this
    sidecar's own traffic."""
    rows = []
    for band in sorted(new.bands, key=_band_order):
        now, then = new.bands[band], old.bands.get(band, BandFigures())
        deltas = bucket_deltas(now.itl, then.itl)
        if not deltas or deltas[-1][1] <= 0:
            continue
        seconds = counter_delta(now.seconds, then.seconds)
        tokens = counter_delta(now.tokens, then.tokens)
        p95 = histogram_quantile(0.95, deltas)
        rows.append(
            (band, histogram_quantile(0.5, deltas), p95, tokens / seconds if seconds > 0 else None)
        )
    if not rows:
        return []
    longest = max((r[2] for r in rows if r[2] is not None and math.isfinite(r[2])), default=0.0)
    span = new.at - old.at
    lines = [
        f"  throughput-latency curve since the start ({span:.0f}s), by streams decoding at once:",
        f"  decode streams   ITL p50   ITL p95   {'ITL p95 as a bar':<{width}}   tok/s",
    ]
    for band, p50, p95, rate in rows:
        filled = (
            round(width * p95 / longest)
            if longest and p95 is not None and math.isfinite(p95)
            else 0
        )
        speed = "-" if rate is None else f"{rate:.0f}"
        streams = "<= " + band if band != "+Inf" else "> 128"
        lines.append(
            f"  {streams:>14}  {format_seconds(p50):>8}  {format_seconds(p95):>8}   "
            f"{'█' * filled:<{width}}  {speed:>6}"
        )
    lines.append("  (tok/s: the pod's decode rate in that band; past the knee it flattens)")
    return lines


def batching_lines(config: SimulatorConfig, concurrency: int) -> list[str]:
    """The simulator's batching model in words and its time per token at a few stream
    counts, as :meth:`SimulatorConfig.batch_factor` computes it, so the TPOT the table shows
    can be read against it."""
    if not config.batch_alpha:
        return ["  batching           none: streams do not slow each other"]
    model = f"each token gap is tpot x (1 + {config.batch_alpha:g} (n - 1))"
    knee = (
        f"{config.batch_knee_factor:g}x steeper past {config.batch_knee} streams: "
        if config.batch_knee
        else ""
    )
    counts = sorted({1, 2, 4, config.batch_knee or 1, concurrency})
    figures = ", ".join(
        f"{format_seconds(config.tpot * config.batch_factor(n))} at {'n=' if n == 1 else ''}{n}"
        for n in counts
    )
    return [
        f"  batching           continuous: with n streams decoding {model},",
        f"                     {knee}{figures.replace(' at n=1', ' a token at n=1', 1)}",
    ]


def intro(
    config: SimulatorConfig,
    sim_port: int,
    port: int,
    admin: int,
    concurrency: int,
    ramp: float,
    duration: float | None,
    host: str,
) -> str:
    """The header the demo prints once its children are ready: where everything listens, the
    simulator's timing and batching model (from the config it was started with), the load."""
    request = {
        "model": config.model,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    body = json.dumps(request, separators=(",", ":"))
    until = "Ctrl-C" if duration is None else f"{duration:g}s"
    usage = (
        "as vLLM with --enable-force-include-usage"
        if config.force_include_usage
        else "usage only when the client asks"
    )
    joined = f", all running after {(concurrency - 1) * ramp:g}s" if concurrency > 1 else ""
    return "\n".join(
        [
            "llm-sidecar demo: simulated vLLM server -> sidecar -> your client",
            f"  simulated server   http://{host}:{sim_port}   ({usage})",
            f"  timing             ttft ~{format_seconds(config.ttft)}, tpot "
            f"{format_seconds(config.tpot)} alone, ~{config.tokens} tokens an "
            f"answer, {config.fail_rate:.0%} errors",
            *batching_lines(config, concurrency),
            f"  sidecar proxy      http://{host}:{port}   (--port)",
            f"  sidecar metrics    http://{host}:{admin}/metrics   (--metrics-port, "
            "default --port + 1)",
            "  try it:",
            f"    curl -N http://{host}:{port}/v1/chat/completions -H 'Content-Type: "
            f"application/json' -d '{body}'",
            f"  load: {concurrency} concurrent clients joining {ramp:g}s apart{joined}; "
            f"until {until}",
            "",
        ]
    )


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


def plain_line(f: WindowFigures, elapsed: float, running: int, concurrency: int) -> str:
    """One self-contained line per refresh, for logs and CI (no terminal codes): the clients
    running now, then the figures over the window (the last seconds, not the whole run)."""
    w = min(f.seconds, WINDOW_SECONDS)
    return (
        f"[{elapsed:5.1f}s] clients {running}/{concurrency}  last {w:.0f}s: req/s {f.requests_per_s:.1f}  in-flight {f.in_flight:.0f}  "
        f"TTFT p50 {format_seconds(f.ttft_p50)} p99 {format_seconds(f.ttft_p99)}  "
        f"ITL p50 {format_seconds(f.itl_p50)} p99 {format_seconds(f.itl_p99)}  "
        f"TPOT p50 {format_seconds(f.tpot_p50)}  out tok/s {f.output_tokens_per_s:.0f}  "
        f"errors {f.errors:.0f} ({format_ratio(f.error_ratio)})"
    )


def table_lines(
    f: WindowFigures, elapsed: float, running: int, concurrency: int, curve: Sequence[str] = ()
) -> list[str]:
    """The live table over the sliding window, redrawn in place on a terminal; the curve
    since the start below it."""
    w = min(f.seconds, WINDOW_SECONDS)
    return [
        f"  up {elapsed:4.0f}s   {running} of {concurrency} clients running",
        f"  figures over the last {w:.0f}s (a {WINDOW_SECONDS:g}s sliding window), from /metrics",
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


class Screen:
    """Redraws a block of lines in place on a TTY; prints one plain line otherwise."""

    def __init__(self, stream: TextIO, live: bool) -> None:
        self._out = stream
        self.live = live
        self._drawn = 0

    def show(
        self,
        figures: WindowFigures,
        elapsed: float,
        running: int,
        concurrency: int,
        curve: Sequence[str] = (),
    ) -> None:
        if not self.live:
            self._out.write(plain_line(figures, elapsed, running, concurrency) + "\n")
        else:
            lines = table_lines(figures, elapsed, running, concurrency, curve)
            prefix = f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""
            self._out.write(prefix + "\n".join(lines) + "\n")
            self._drawn = len(lines)
        self._out.flush()

    def text(self, message: str) -> None:
        self._out.write(message + "\n")
        self._out.flush()
        self._drawn = 0  # the block above is now history; draw the next one below


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"stopped by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def summary(first: Snapshot, last: Snapshot, load: LoadStats, codes: Mapping[str, int]) -> str:
    f = window_figures(last, first)
    total = f.requests
    cancelled = counter_delta(last.cancelled, first.cancelled)
    ok = total - f.errors - cancelled
    exits = ", ".join(f"{name} {_exit_text(code)}" for name, code in codes.items())
    known = ("usage", "engine", "estimated", "none")
    order = [*known, *sorted(set(last.token_sources) - set(known))]
    sources = {
        source: counter_delta(
            last.token_sources.get(source, 0.0), first.token_sources.get(source, 0.0)
        )
        for source in order
    }
    counted = ", ".join(f"{n:.0f} {source}" for source, n in sources.items() if n) or "-"
    return "\n".join(
        [
            f"summary over the whole run, {f.seconds:.1f}s (from the sidecar's /metrics):",
            f"  requests       {total:.0f} ({f.requests_per_s:.1f}/s): {ok:.0f} ok, {f.errors:.0f} error, "
            f"{cancelled:.0f} cancelled; error ratio {format_ratio(f.error_ratio)}",
            f"  TTFT           p50 {format_seconds(f.ttft_p50)}   p99 {format_seconds(f.ttft_p99)}",
            f"  ITL            p50 {format_seconds(f.itl_p50)}   p99 {format_seconds(f.itl_p99)}",
            f"  TPOT           p50 {format_seconds(f.tpot_p50)}",
            f"  output tokens  {counter_delta(last.output_tokens, first.output_tokens):.0f} "
            f"({f.output_tokens_per_s:.0f}/s)",
            f"  token counts   by source: {counted} (llm_token_count_source_total)",
            *curve_lines(last, first),
            f"  load generator sent {load.sent}: {load.ok} ok, {load.errors} error, "
            f"{load.stopped} stopped by the end of the demo",
            f"  {exits}" if exits else "",
        ]
    ).rstrip()
