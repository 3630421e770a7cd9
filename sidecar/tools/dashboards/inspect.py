"""Reading generated dashboards back: every query a panel or a variable runs, and the
variables substituted the way Grafana would for "All", so the PromQL can be checked by a
real parser and run against a real Prometheus (the tests do both)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PanelQuery",
    "VariableQuery",
    "panel_queries",
    "variable_queries",
    "substitute",
    "ALL_VALUES",
    "LABEL_VALUES",
]

ALL_VALUES: Mapping[str, str] = {
    "__rate_interval": "1m",
    "cluster": ".*",
    "namespace": ".*",
    "llm_release": ".*",
    "pod": ".*",
    "model": ".*",
    "route": ".*",
}
"""What Grafana puts in place of each variable when every value is selected (All = ``.*``);
``$__rate_interval`` is at least four scrape intervals, 1m for the usual 15 s scrape."""

LABEL_VALUES = re.compile(
    r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>[a-zA-Z_]\w*)\)$", re.S
)
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True, slots=True)
class PanelQuery:
    dashboard: str
    panel_id: int
    panel_title: str
    ref_id: str
    expr: str

    @property
    def where(self) -> str:
        return f"{self.dashboard} panel {self.panel_id} {self.panel_title!r} query {self.ref_id}"


@dataclass(frozen=True, slots=True)
class VariableQuery:
    dashboard: str
    name: str
    selector: str | None
    label: str

    @property
    def where(self) -> str:
        return f"{self.dashboard} variable {self.name}"


def _panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside collapsed rows


def panel_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    uid = dashboard["uid"]
    return [
        PanelQuery(uid, p["id"], p.get("title", ""), t.get("refId", ""), t["expr"])
        for p in _panels(dashboard)
        for t in p.get("targets", [])
    ]


def variable_queries(dashboard: Mapping[str, Any]) -> list[VariableQuery]:
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        query = v["query"]
        text = query["query"] if isinstance(query, Mapping) else query
        m = LABEL_VALUES.match(text.strip())
        if m is None:
            raise ValueError(
                f"{dashboard['uid']} variable {v['name']}: not a label_values() query: {text!r}"
            )
        out.append(VariableQuery(dashboard["uid"], v["name"], m["selector"], m["label"]))
    return out


def substitute(expr: str, values: Mapping[str, str] = ALL_VALUES) -> str:
    """``$name`` / ``${name}`` -> ``values[name]``; an unknown variable raises KeyError."""

    def repl(m: re.Match[str]) -> str:
        return values[m[1] or m[2]]

    return _VARIABLE.sub(repl, expr)
