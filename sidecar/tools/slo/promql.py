"""The PromQL pieces every rule generator shares: selectors, and plain rule data (a rule, a
group of rules) before any YAML is written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .spec import SLOSpec

__all__ = ["Matcher", "Rule", "Group", "promql_string", "selector", "spec_matchers"]

Matcher = tuple[str, str, str]  # (label, operator, value)


@dataclass(frozen=True, slots=True)
class Rule:
    """One recording rule (``record``) or alerting rule (``alert``)."""

    expr: str
    record: str | None = None
    alert: str | None = None
    for_: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    rules: tuple[Rule, ...]


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def selector(metric: str, matchers: Sequence[Matcher] = ()) -> str:
    if not matchers:
        return metric
    return metric + "{" + ",".join(f"{k}{op}{promql_string(v)}" for k, op, v in matchers) + "}"


def spec_matchers(spec: SLOSpec) -> list[Matcher]:
    return [(label, "=", value) for label, value in sorted(spec.selector.items())]
