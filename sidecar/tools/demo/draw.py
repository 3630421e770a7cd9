"""What the demo prints: the live table (redrawn in place on a terminal, one plain line
per refresh otherwise), the throughput-latency curve by band, the final summary."""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Mapping, Sequence

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
    "Screen",
    "curve_lines",
    "format_ratio",
    "format_seconds",
    "plain_line",
    "summary",
    "table_lines",
]


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
        rows.append(
            (band, histogram_quantile(0.5, deltas), p95, tokens / seconds if seconds > 0 else None)
        )
    if not rows:
        return []
    longest = max((r[2] for r in rows if r[2] is not None and math.isfinite(r[2])), default=0.0)
    lines = [
        "  decode streams   ITL p50    ITL p95   tok/s   (the pod's curve: latency grows with load)"
    ]
    for band, p50, p95, rate in rows:
        filled = (
            round(width * p95 / longest)
            if longest and p95 is not None and math.isfinite(p95)
            else 0
        )
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


def plain_line(f: WindowFigures, elapsed: float) -> str:
    """One self-contained line per refresh, for logs and CI (no terminal codes)."""
    return (
        f"[{elapsed:5.1f}s] req/s {f.requests_per_s:.1f}  in-flight {f.in_flight:.0f}  "
        f"TTFT p50 {format_seconds(f.ttft_p50)} p99 {format_seconds(f.ttft_p99)}  "
        f"ITL p50 {format_seconds(f.itl_p50)} p99 {format_seconds(f.itl_p99)}  "
        f"TPOT p50 {format_seconds(f.tpot_p50)}  out tok/s {f.output_tokens_per_s:.0f}  "
        f"errors {f.errors:.0f} ({format_ratio(f.error_ratio)})"
    )


def table_lines(
    f: WindowFigures, elapsed: float, concurrency: int, curve: Sequence[str] = ()
) -> list[str]:
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


class Screen:
    """Redraws a block of lines in place on a TTY; prints one plain line otherwise."""

    def __init__(self, stream, live: bool) -> None:
        self._out = stream
        self.live = live
        self._drawn = 0

    def show(
        self, figures: WindowFigures, elapsed: float, concurrency: int, curve: Sequence[str] = ()
    ) -> None:
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
