"""Burn-rate alert windows: the Google SRE workbook's table, as data.

Each row says: alert when the share ``budget_consumed`` of the whole period's error budget
has been spent within ``long`` (and the ``short`` window, 1/12 of it, confirms that the burn
is still going on, so the alert resets soon after the problem stops). The burn-rate
threshold follows from the period instead of being written down::

    factor = budget_consumed * period / long

For a 30-day period that gives the workbook's 14.4, 6, 3 and 1; a 28-day period gives
13.44, 5.6, 2.8 and 0.933. An arm fires ``budget_consumed * period / burn_rate`` after a
constant burn starts (when that is within ``long``), which is how the promtool tests
predict firing times.

Reference: The Site Reliability Workbook, chapter 5 "Alerting on SLOs", approach 6:
multiwindow, multi-burn-rate alerts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

__all__ = [
    "Severity",
    "AlertWindow",
    "WORKBOOK_WINDOWS",
    "ARM_NAMES",
    "burn_rate_factor",
    "detection_seconds",
    "parse_duration",
    "format_duration",
    "format_number",
    "record_windows",
    "REFERENCE_PERIOD",
    "windows_for_period",
    "is_drill_period",
    "is_long_window",
]

Severity = Literal["page", "ticket"]

MINUTE = 60
HOUR = 60 * MINUTE
DAY = 24 * HOUR

_UNITS = {"y": 365 * DAY, "w": 7 * DAY, "d": DAY, "h": HOUR, "m": MINUTE, "s": 1}
_DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text: str) -> int:
    """Prometheus duration (``"30d"``, ``"1h30m"``; no milliseconds) -> whole seconds."""
    m = _DURATION.fullmatch(str(text).strip())
    if not m or not any(m.groups()):
        raise ValueError(f"{text!r} is not a duration like 5m, 6h, 30d")
    return sum(int(n) * _UNITS[u] for n, u in zip(m.groups(), "ywdhms", strict=True) if n)


def format_duration(seconds: int) -> str:
    """Whole seconds -> the Prometheus duration in the largest exact unit up to days."""
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def format_number(value: Fraction | float) -> str:
    """A rule-file number: shortest faithful form, six significant digits at most."""
    return format(float(value), ".6g")


@dataclass(frozen=True, slots=True)
class AlertWindow:
    """One multi-window alert arm."""

    severity: Severity
    long: int
    """Seconds of the long window: how much budget was spent recently."""
    short: int
    """Seconds of the short window: is it still being spent now."""
    budget_consumed: Fraction
    """Share of the period's budget spent within ``long`` when the arm fires."""
    name: str = ""
    """The arm's name (``page-fast`` ...): the key a spec's ``windows`` or the chart's
    ``prometheus.rules.windows`` changes it by."""

    @property
    def long_name(self) -> str:
        return format_duration(self.long)

    @property
    def short_name(self) -> str:
        return format_duration(self.short)


# The workbook's recommended parameters, for any period length.
WORKBOOK_WINDOWS: tuple[AlertWindow, ...] = (
    AlertWindow("page", 1 * HOUR, 5 * MINUTE, Fraction(2, 100), "page-fast"),
    AlertWindow("page", 6 * HOUR, 30 * MINUTE, Fraction(5, 100), "page-slow"),
    AlertWindow("ticket", 1 * DAY, 2 * HOUR, Fraction(10, 100), "ticket-fast"),
    AlertWindow("ticket", 3 * DAY, 6 * HOUR, Fraction(10, 100), "ticket-slow"),
)
ARM_NAMES: tuple[str, ...] = tuple(w.name for w in WORKBOOK_WINDOWS)
"""The alert arms, fastest first; a spec's ``windows`` may change each one's windows and budget share."""


REFERENCE_PERIOD = 30 * DAY
"""The period the workbook's windows were written for."""


def is_drill_period(period: int) -> bool:
    """A period under a day is a drill (an end-to-end test, a game day): its windows shrink."""
    return period < DAY


def windows_for_period(period: int) -> tuple[AlertWindow, ...]:
    """The alert windows of a compliance period.

    Periods of whole days keep the workbook's absolute windows (1h/5m ... 3d/6h), and the
    factors move with the period (30d: 14.4, 28d: 13.44). A drill period under a day scales
    every window by ``period / 30d`` instead (12h: 1m/5s, 6m/30s, 24m/2m, 72m/6m), so the
    factors stay the 30d ones and an alert fires after the same *share* of the period. A
    window that would not be whole seconds raises :class:`ValueError`.
    """
    if not is_drill_period(period):
        return WORKBOOK_WINDOWS
    out = []
    for w in WORKBOOK_WINDOWS:
        long, short = (
            Fraction(w.long * period, REFERENCE_PERIOD),
            Fraction(w.short * period, REFERENCE_PERIOD),
        )
        if long.denominator != 1 or short.denominator != 1:
            raise ValueError(
                f"a drill period of {format_duration(period)} scales the {w.long_name}/{w.short_name} "
                "windows to fractions of a second; a drill period must be a multiple of 2h24m "
                "(12h gives windows 1m/5s ... 72m/6m)"
            )
        out.append(AlertWindow(w.severity, int(long), int(short), w.budget_consumed, w.name))
    return tuple(out)


def burn_rate_factor(window: AlertWindow, period: int) -> Fraction:
    """The burn rate above which ``window`` fires, for a compliance period of ``period`` s."""
    return window.budget_consumed * period / window.long


def detection_seconds(window: AlertWindow, period: int, burn_rate: float) -> float | None:
    """Seconds from the start of a constant burn (after clean traffic) until the arm fires.

    ``None`` when the burn is too slow for this arm ever to fire.
    """
    factor = burn_rate_factor(window, period)
    if burn_rate <= float(factor):  # as the rule compares: a float threshold
        return None
    return float(window.budget_consumed * period) / burn_rate


def is_long_window(window: int, period: int) -> bool:
    """Windows of a day or more (1/30 of the period for a drill) are read from recorded
    short-window event rates with ``sum_over_time``, never by ``rate`` over raw series."""
    return window * 30 >= period


def record_windows(windows: tuple[AlertWindow, ...] = WORKBOOK_WINDOWS) -> list[int]:
    """Every window the alerts read, shortest first."""
    return sorted({w for a in windows for w in (a.long, a.short)})
