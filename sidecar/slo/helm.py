"""The chart's rules: the same generator, with each objective's target and threshold as a
Helm values lookup, so ``helm install --set prometheus.rules.objectives.ttft.target=99``
(or a values file) changes an SLO without rendering rules by hand.

Why this way: the generator stays the single source of every rule; only the numbers that a
user may change are left to Helm. The burn-rate factors depend on the period alone, and the
windows, names and labels on the spec, so they stay fixed; per-model overrides keep the
spec's numbers. With the default values, ``helm template`` gives the rules
``llm-sidecar slo render`` gives, byte for byte (a test checks it): Helm formats each number
with ``%.6g`` as :func:`~.windows.format_number` does, and a bucket bound as
prometheus_client writes it (``2.0``, ``0.1``). ``values.schema.json`` admits only bucket
bounds as thresholds (a threshold between bounds would read no bucket) and targets from 50
to below 100, as the spec does.

Prometheus' own ``{{ ... }}`` in the annotations is escaped for Helm (``{{`{{`}}``), and the
chart passes the file through ``tpl``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from prometheus_client.utils import floatToGoString

from . import conventions as c
from .render import render_rules
from .capacity import generate
from .rules import Numbers, Rule, RuleSet
from .spec import SLOSpec, Scope

__all__ = [
    "VALUES_PATH",
    "SHIPPED",
    "LABEL_DEPLOYMENT",
    "SEVERITIES",
    "HelmNumbers",
    "release_scope",
    "scoped_spec",
    "release_rules",
    "render_helm_rules",
    "values_section",
    "schema_section",
]

VALUES_PATH = ("prometheus", "rules", "objectives")
"""Where the objectives live in the chart's values."""

SHIPPED = {"llm-sidecar-rules.yaml": "deploy/slo/default.yaml"}
"""Chart rules file (helm/llm-sidecar/files/rules/) -> the spec it is rendered from."""

_TOKEN = re.compile(r"@@helm:([a-z_]+):([a-z][a-z0-9_-]*)@@")

LABEL_DEPLOYMENT = "deployment"
"""The label the chart's PodMonitor/ServiceMonitor gives every series of a release (its
fullname); with the namespace it names one deployment, and every rule of the release
selects and carries both, so releases never read or write each other's series."""

SEVERITIES = {"page": "critical", "ticket": "warning", "info": "info"}
"""The chart's default ``prometheus.rules.severities``: the spec's severity -> the label
value the alerts carry (kube-prometheus-stack routes critical/warning/info)."""


def release_scope(namespace: str, deployment: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(extra grouping labels, selector) of one release's rules: the one place that says how a
    release is scoped, for every generator of chart rules (SLO, capacity, ...)."""
    return (LABEL_DEPLOYMENT,), {"namespace": namespace, LABEL_DEPLOYMENT: deployment}


def scoped_spec(spec: SLOSpec, namespace: str, deployment: str) -> SLOSpec:
    """``spec`` as one release applies it: grouped by, and selecting, its own deployment."""
    extra, selector = release_scope(namespace, deployment)
    grouping = tuple(spec.grouping) + tuple(label for label in extra if label not in spec.grouping)
    return spec.model_copy(update={"grouping": grouping, "selector": {**spec.selector, **selector}})


class HelmNumbers(Numbers):
    """Placeholders for an objective's default scope; overrides keep their literal numbers."""

    def _token(self, scope: Scope, what: str, literal: str) -> str:
        return literal if scope.model is not None else f"@@helm:{what}:{scope.objective.name}@@"

    def target(self, scope: Scope) -> str:
        return self._token(scope, "target", super().target(scope))

    def budget(self, scope: Scope) -> str:
        return self._token(scope, "budget", super().budget(scope))

    def threshold(self, scope: Scope) -> str:
        return self._token(scope, "threshold", super().threshold(scope))

    def le(self, scope: Scope) -> str:
        return self._token(scope, "le", super().le(scope))


def _lookup(objective: str, key: str) -> str:
    path = ".".join(("$.Values", *VALUES_PATH))
    return f'(float64 (index {path} "{objective}" "{key}"))'


def _action(what: str, objective: str) -> str:
    """The Helm action that writes one number (or a release label) the way the literal rules do."""
    if what == "release":
        if objective == "namespace":
            return "{{ $.Release.Namespace }}"
        return '{{ include "llm-sidecar.fullname" $ }}'
    if what == "severity":
        return f'{{{{ index $.Values.prometheus.rules.severities "{objective}" }}}}'
    if what == "runbook":
        return "{{ $.Values.prometheus.rules.runbookUrl }}"
    if what == "target":
        return f'{{{{ printf "%.6g" {_lookup(objective, "target")} }}}}'
    if what == "budget":
        return f'{{{{ printf "%.6g" (subf 1 (divf {_lookup(objective, "target")} 100)) }}}}'
    if what == "threshold":
        return f'{{{{ printf "%.6g" {_lookup(objective, "thresholdSeconds")} }}}}'
    # le: prometheus_client's floatToGoString; "2.0" for a whole number, else Go's shortest form.
    t = _lookup(objective, "thresholdSeconds")
    return f'{{{{ if eq {t} (floor {t}) }}}}{{{{ printf "%.1f" {t} }}}}{{{{ else }}}}{{{{ {t} }}}}{{{{ end }}}}'


def _relabel(ruleset: RuleSet, severity: Callable[[str], str], runbook_url: str) -> RuleSet:
    """``ruleset`` with each severity label mapped and each runbook link rebased."""
    old_url = ruleset.spec.alerts.runbook_url

    def one(rule: Rule) -> Rule:
        labels = dict(rule.labels)
        if c.LABEL_SEVERITY in labels:
            labels[c.LABEL_SEVERITY] = severity(labels[c.LABEL_SEVERITY])
        annotations = dict(rule.annotations)
        link = annotations.get("runbook_url", "")
        if link.startswith(old_url + "#"):
            annotations["runbook_url"] = runbook_url + link[len(old_url) :]
        return replace(rule, labels=labels, annotations=annotations)

    return replace(ruleset, groups=tuple(replace(g, rules=tuple(one(r) for r in g.rules)) for g in ruleset.groups))


def release_rules(
    spec: SLOSpec,
    namespace: str,
    deployment: str,
    severities: Mapping[str, str] = SEVERITIES,
    runbook_url: str | None = None,
) -> RuleSet:
    """The rules one release of the chart gets (what its template renders, as plain rules)."""
    ruleset = generate(scoped_spec(spec, namespace, deployment))
    return _relabel(ruleset, lambda s: severities[s], runbook_url or spec.alerts.runbook_url)


def render_helm_rules(spec: SLOSpec) -> str:
    """The rules file as a Helm template (the chart ``tpl``s it with the release's values).

    :func:`release_rules` with each release-specific part as a lookup: every rule selects and
    carries ``namespace`` and ``deployment`` (:func:`release_scope`); targets, thresholds,
    severities and the runbook URL come from values."""
    scoped = scoped_spec(spec, "@@helm:release:namespace@@", "@@helm:release:deployment@@")
    ruleset = _relabel(
        generate(scoped, numbers=HelmNumbers()), lambda s: f"@@helm:severity:{s}@@", "@@helm:runbook:url@@"
    )
    text = render_rules(ruleset)
    text = re.sub(r"\{\{|\}\}", lambda m: "{{`" + m.group() + "`}}", text)
    text = _TOKEN.sub(lambda m: _action(m.group(1), m.group(2)), text)
    # A Helm comment, so that the rendered rules are exactly the plain ones.
    header = (
        "{{- /* Helm template of the rules (the chart passes it through tpl): each objective's\n"
        f"target and threshold come from .Values.{'.'.join(VALUES_PATH)}. Rendered by\n"
        "sidecar/slo/helm.py from the spec; refresh with scripts/sync-chart.sh. */ -}}\n"
    )
    return header + _guard() + text


def _guard() -> str:
    """Refuse an out-of-range target at render time (the schema cannot bound a string)."""
    path = ".".join(("$.Values", *VALUES_PATH))
    return (
        f"{{{{- range $name, $o := {path} }}}}"
        "{{- if or (lt (float64 $o.target) 50.0) (ge (float64 $o.target) 100.0) }}"
        f'{{{{- fail (printf "{".".join(VALUES_PATH)}.%s.target must be at least 50 and below 100, got %v" $name $o.target) }}}}'
        "{{- end }}{{- end -}}\n"
    )


def values_section(spec: SLOSpec) -> dict[str, dict[str, Any]]:
    """The chart's default values for ``spec``: target (and thresholdSeconds) per objective."""
    out: dict[str, dict[str, Any]] = {}
    for o in spec.objectives:
        entry: dict[str, Any] = {"target": o.target}
        if o.threshold_seconds is not None:
            entry["thresholdSeconds"] = o.threshold_seconds
        out[o.name] = entry
    return out


def schema_section(spec: SLOSpec) -> dict[str, Any]:
    """JSON schema of the objectives' values: bucket bounds only, targets as the spec checks."""
    # `helm --set x=0.1` passes a decimal as a string (only integers are typed), so a number
    # written as a string is accepted too; the rules template refuses targets out of range.
    target = {
        "anyOf": [
            {"type": "number", "minimum": 50, "exclusiveMaximum": 100},
            {"type": "string", "pattern": r"^(5[0-9]|[6-9][0-9])(\.[0-9]+)?$"},
        ],
        "description": "percent of good events, at least 50 and below 100",
    }
    props: dict[str, Any] = {}
    for o in spec.objectives:
        entry: dict[str, Any] = {"target": target}
        required = ["target"]
        if o.sli != "availability":
            latency = c.LATENCY_SLIS[o.sli]
            as_text = sorted({format(b, "g") for b in latency.buckets} | {floatToGoString(b) for b in latency.buckets}, key=lambda t: (float(t), t))
            entry["thresholdSeconds"] = {
                "enum": [*latency.buckets, *as_text],
                "description": f"a bucket bound of {latency.histogram} (the SLI reads the bucket at the threshold)",
            }
            required.append("thresholdSeconds")
        props[o.name] = {"type": "object", "additionalProperties": False, "required": required, "properties": entry}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [o.name for o in spec.objectives],
        "description": "Target and threshold of each SLO objective of the shipped spec (deploy/slo/default.yaml)",
        "properties": props,
    }
