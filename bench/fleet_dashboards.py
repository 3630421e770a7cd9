"""Every query a Grafana dashboard sends when it opens, variables at All, as Grafana expands them.

Grafana's Prometheus data source, for a panel over ``range`` seconds (``public/app/features/
templating`` and the Prometheus data source's ``interpolateVariablesInQueries``):

* ``$__interval``: the range divided by the panel's data points, never below the panel's or the
  data source's minimum interval (its "Scrape interval", 15 s unless set); over 5 minutes that
  is the scrape interval. ``$__rate_interval`` = max(``$__interval`` + scrape interval,
  4 x scrape interval). A range query's step is ``$__interval``, its start and end aligned to it.
* A multi-value variable at All: its ``allValue`` when it has one (the dashboards here use
  ``.*``), else every value it lists, regex-escaped and joined as ``(a|b|c)``; a panel repeated
  by a variable becomes one panel per value.
* A hidden target is not sent; an instant target is one query at the range's end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATA_POINTS = 1000  # about a panel's width in pixels, Grafana's default maxDataPoints
_VAR = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)(?::(\w+))?\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),\s*)?(\w+)\)\s*$", re.S)


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool
    step: float


def _panels(panels: list[dict]) -> list[dict]:
    out = []
    for p in panels:
        out.append(p)
        out += _panels(p.get("panels", []))  # a collapsed row holds its panels
    return out


def _duration(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text.strip())
    if not m:
        raise ValueError(f"not a Grafana interval: {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _grafana_duration(seconds: float) -> str:
    if seconds >= 1 and seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def _regex_escape(value: str) -> str:
    """Grafana's ``prometheusRegularEscape`` for a multi-value regex."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\1", value)


def variable_values(dashboard: dict, fetch: Callable[[str, str], list[str]]) -> dict[str, str]:
    """Each template variable's text at All. ``fetch(selector, label)`` lists a label's values
    (``label_values``), asked only for a variable without an ``allValue``."""
    out: dict[str, str] = {}
    for var in dashboard.get("templating", {}).get("list", []):
        name, kind = var["name"], var.get("type")
        if kind == "datasource":
            continue
        if kind == "constant":
            out[name] = str(var.get("query", ""))
            continue
        if var.get("includeAll") and var.get("allValue"):
            out[name] = var["allValue"]
            continue
        values = [str(o["value"]) for o in var.get("options", []) if o.get("value") != "$__all"]
        if kind == "query" and not values:
            query = var.get("query")
            text = query.get("query", "") if isinstance(query, dict) else str(query or "")
            m = _LABEL_VALUES.match(_substitute(text, out, {}))
            if m:
                values = fetch(m.group(1) or "", m.group(2))
        elif kind == "custom" and not values:
            values = [v.strip() for v in str(var.get("query", "")).split(",") if v.strip()]
        if var.get("includeAll") or var.get("multi"):
            out[name] = "(" + "|".join(_regex_escape(v) for v in values) + ")" if values else ""
        else:
            out[name] = values[0] if values else ""
    return out


def _substitute(expr: str, values: dict[str, str], builtins: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(3) or m.group(4)
        if name in builtins:
            return builtins[name]
        if name in values:
            return values[name]
        return m.group(0)

    # Longest names first is what Grafana's regex does by matching \w+ greedily.
    return _VAR.sub(one, expr)


def dashboard_queries(
    path: Path,
    range_s: float,
    scrape_interval: float,
    fetch: Callable[[str, str], list[str]],
) -> list[Query]:
    """The queries ``path`` sends when it opens over the last ``range_s`` seconds."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    values = variable_values(doc, fetch)
    out = []
    for panel in _panels(doc.get("panels", [])):
        targets = [t for t in panel.get("targets", []) if t.get("expr") and not t.get("hide")]
        if not targets:
            continue
        points = float(panel.get("maxDataPoints") or DATA_POINTS)
        floor = scrape_interval
        if panel.get("interval"):
            floor = max(floor, _duration(_substitute(panel["interval"], values, {})))
        repeats = [{}]
        repeat = panel.get("repeat")
        if repeat:
            text = values.get(repeat, "")
            items = text[1:-1].split("|") if text.startswith("(") else [text]
            repeats = [{repeat: v} for v in items]
        for target in targets:
            t_floor = floor
            if target.get("interval"):
                t_floor = max(t_floor, _duration(_substitute(target["interval"], values, {})))
            interval = max(t_floor, range_s / points)
            builtins = {
                "__interval": _grafana_duration(interval),
                "__interval_ms": str(int(interval * 1000)),
                "__rate_interval": _grafana_duration(
                    max(interval + scrape_interval, 4 * scrape_interval)
                ),
                "__range": _grafana_duration(range_s),
                "__range_s": str(int(range_s)),
                "__range_ms": str(int(range_s * 1000)),
            }
            for extra in repeats:
                expr = _substitute(target["expr"], {**values, **extra}, builtins)
                out.append(
                    Query(
                        dashboard=path.name,
                        panel=str(panel.get("title", "")),
                        ref=str(target.get("refId", "")),
                        expr=expr,
                        instant=bool(target.get("instant")) and not target.get("range"),
                        step=interval,
                    )
                )
    return out
