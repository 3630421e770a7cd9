"""The chart's rules: the same generator, with each objective's target and threshold as a
Helm values lookup, so ``helm install --set prometheus.rules.objectives.ttft.target=99``
(or a values file) changes an SLO without rendering rules by hand.

Why this way: the generator stays the single source of every rule; only the numbers that a
user may change are left to Helm. The period, names and labels stay the spec's.

Burn-rate windows (``prometheus.rules.windows``: each arm's long and short window and budget
share) and per-model overrides (``prometheus.rules.modelOverrides``) are values too. The
generator renders them from stand-ins: each arm window is a sentinel duration (``7000001s``
...) replaced by its values lookup, its factor and budget share are computed by Helm as
:func:`~.windows.burn_rate_factor` does, and whether a window is read from the recorded
base-window rates or the raw series follows its length (the template decides with both
expressions at hand, as :meth:`~.rules.Numbers.window_error` does), and so does whether the
base window's events are read from the aggregates' records (only when it is their 5m:
:meth:`~.rules.Numbers.base_rate`). A window two arms share
is recorded once (each window's records are wrapped in an ``if`` that the window is new).
Each objective gets one stand-in override model: its scope's rules are wrapped in a
``range`` over the overrides of that objective, with the model, target and threshold as
lookups, and the default scope's ``model!=`` matcher for it becomes a ``range`` over the
same list, so the other models' rules leave every overridden model out exactly as
:meth:`~.spec.Objective.scopes` does. With the default values, ``helm template`` gives the rules
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
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client.utils import floatToGoString

from . import aggregates, conventions as c
from .capacity import generate
from .promql import Rule
from .render import render_rules
from .rules import Numbers, RuleSet
from .spec import ModelOverride, Scope, SLOSpec, WindowSetting
from .windows import AlertWindow

__all__ = [
    "VALUES_PATH",
    "SHIPPED",
    "LABEL_RELEASE",
    "release_id",
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

_TOKEN = re.compile(r"@@helm:([a-z_]+):([a-z][a-z0-9_.-]*)@@")
_MARK = re.compile(r"^ *- record: '?@@mark(\d+)@@'?\n *expr: '?@@helm:mark@@'?\n", re.MULTILINE)

WINDOWS_PATH = ("prometheus", "rules", "windows")
"""Where the burn-rate alert arms live in the chart's values."""

OVERRIDES_PATH = ("prometheus", "rules", "modelOverrides")
"""Where the per-model overrides live in the chart's values (a list: ``--set x[0].model=...``)."""

MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$"
"""Model names an override may name from values (kept out of PromQL and YAML quoting)."""

_SENTINEL_BASE = 7_000_001
"""First stand-in window in seconds (odd, so never a whole minute: it renders as ``7000001s``)."""

LABEL_RELEASE = c.LABEL_RELEASE
"""The label the chart's PodMonitor/ServiceMonitor gives every series of a release:
``<release namespace>/<release fullname>`` (:func:`release_id`). Every rule of the release
selects and carries it, so releases never read or write each other's series, wherever their
pods run. The series' ``namespace`` stays the scraped pod's (the operator's), and the rules
group by it without selecting it: a PodMonitor may scrape pods of other namespaces
(monitoring-only ``existingServer.namespaces``), and plain manifests are applied to a
namespace their render did not know."""

ANY_NAMESPACE_PATH = ("prometheus", "rules", "anyNamespace")
"""The value that makes the rules select the release's name in any namespace
(``llm_release=~".+/<fullname>"``): for manifests rendered once and applied with
``kubectl apply -n`` anywhere (deploy/kubernetes/)."""

_RELEASE_STAND_IN = "@@helm:release:id@@"

SEVERITIES = {"page": "critical", "ticket": "warning", "info": "info"}
"""The chart's default ``prometheus.rules.severities``: the spec's severity -> the label
value the alerts carry (kube-prometheus-stack routes critical/warning/info)."""


def release_id(namespace: str, fullname: str) -> str:
    """The ``llm_release`` value of a release: what the operator makes of the monitor's
    namespace and name (the chart names its monitors by the release's fullname)."""
    return f"{namespace}/{fullname}"


def release_scope(namespace: str, fullname: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(extra grouping labels, selector) of one release's rules: the one place that says how a
    release is scoped, for every generator of chart rules (SLO, capacity, ...). No
    ``namespace`` matcher: the release's pods may run in any namespace its monitor watches."""
    return (LABEL_RELEASE,), {LABEL_RELEASE: release_id(namespace, fullname)}


def scoped_spec(spec: SLOSpec, namespace: str, fullname: str) -> SLOSpec:
    """``spec`` as one release applies it: grouped by, and selecting, its own release."""
    extra, selector = release_scope(namespace, fullname)
    grouping = tuple(spec.grouping) + tuple(label for label in extra if label not in spec.grouping)
    return spec.model_copy(update={"grouping": grouping, "selector": {**spec.selector, **selector}})


def _scoped_stand_in(spec: SLOSpec) -> SLOSpec:
    """``spec`` scoped to a stand-in release, whose matcher the chart's template writes
    (``llm-sidecar.releaseMatcher``: exact, or the name in any namespace)."""
    grouping = tuple(spec.grouping) + (
        (LABEL_RELEASE,) if LABEL_RELEASE not in spec.grouping else ()
    )
    return spec.model_copy(
        update={
            "grouping": grouping,
            "selector": {**spec.selector, LABEL_RELEASE: _RELEASE_STAND_IN},
        }
    )


def _stand_in_model(objective: str) -> str:
    return f"@@helm:model:{objective}@@"


def _is_stand_in(model: str | None) -> bool:
    return model is not None and model.startswith("@@helm:model:")


@dataclass(frozen=True)
class _Slot:
    arm: str
    kind: str  # "long" | "short"
    seconds: int  # the stand-in

    @property
    def key(self) -> str:
        return f"{self.arm}.{self.kind}"

    @property
    def text(self) -> str:
        return f"{self.seconds}s"

    @property
    def lookup(self) -> str:
        path = ".".join(("$.Values", *WINDOWS_PATH))
        return f'(index {path} "{self.arm}" "{self.kind}")'


def _slots(spec: SLOSpec) -> list[_Slot]:
    """Every arm's long and short window, ordered as the spec's own windows are (so the
    records come out in the generator's order with the default values), as stand-ins."""
    pairs = [
        (w.name, kind, getattr(w, kind)) for w in spec.alert_windows for kind in ("short", "long")
    ]
    pairs.sort(key=lambda p: p[2])
    return [_Slot(arm, kind, _SENTINEL_BASE + 2 * i) for i, (arm, kind, _) in enumerate(pairs)]


class HelmNumbers(Numbers):
    """Placeholders for an objective's default scope and for the stand-in override of values;
    the spec's own overrides keep their literal numbers. Windows' factors and budget shares,
    and the choice between recorded and raw long windows, are Helm's too."""

    def __init__(self, slots: list[_Slot] | None = None) -> None:
        self.slots = {slot.seconds: slot for slot in slots or ()}

    def _token(self, scope: Scope, what: str, literal: str) -> str:
        if _is_stand_in(scope.model):
            return f"@@helm:o{what}:{scope.objective.name}@@"
        return literal if scope.model is not None else f"@@helm:{what}:{scope.objective.name}@@"

    def factor(self, window: AlertWindow, period: int) -> str:
        return f"@@helm:factor:{window.name}@@" if self.slots else super().factor(window, period)

    def spent(self, window: AlertWindow) -> str:
        return f"@@helm:spent:{window.name}@@" if self.slots else super().spent(window)

    def base_rate(self, window: int, recorded: str, raw: str) -> str:
        slot = self.slots.get(window)
        if slot is None:
            return super().base_rate(window, recorded, raw)
        return f"@@helm:ifbase:{slot.key}@@{recorded}@@helm:else:x@@{raw}@@helm:end:x@@"

    def window_error(self, window: int, period: int, recorded: str, raw: str) -> str:
        slot = self.slots.get(window)
        if slot is None:
            return super().window_error(window, period, recorded, raw)
        return f"@@helm:iflong:{slot.key}@@{recorded}@@helm:else:x@@{raw}@@helm:end:x@@"

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


def _override_lookup(objective: str, key: str) -> str:
    """The override's own number, else its objective's (``$o``: the override being ranged over)."""
    path = ".".join(("$.Values", *VALUES_PATH))
    return f'(float64 (default (index {path} "{objective}" "{key}") (index $o "{key}")))'


def _number(what: str, lookup: Callable[[str, str], str], objective: str) -> str:
    if what == "target":
        return f'{{{{ printf "%.6g" {lookup(objective, "target")} }}}}'
    if what == "budget":
        return f'{{{{ printf "%.6g" (subf 1 (divf {lookup(objective, "target")} 100)) }}}}'
    if what == "threshold":
        return f'{{{{ printf "%.6g" {lookup(objective, "thresholdSeconds")} }}}}'
    # le: prometheus_client's floatToGoString; "2.0" for a whole number, else Go's shortest form.
    t = lookup(objective, "thresholdSeconds")
    return f'{{{{ if eq {t} (floor {t}) }}}}{{{{ printf "%.1f" {t} }}}}{{{{ else }}}}{{{{ {t} }}}}{{{{ end }}}}'


def _seconds(lookup: str) -> str:
    return f'(include "llm-sidecar.seconds" {lookup} | atoi)'


def _arm(arm: str, key: str) -> str:
    path = ".".join(("$.Values", *WINDOWS_PATH))
    return f'(index {path} "{arm}" "{key}")'


def _action(
    what: str, objective: str, period: int = 0, slots: dict[str, _Slot] | None = None
) -> str:
    """The Helm action that writes one number (or a release label) the way the literal rules do."""
    if what == "model":
        return "{{ $o.model }}"
    if what in ("otarget", "obudget", "othreshold", "ole"):
        return _number(what[1:], _override_lookup, objective)
    if what == "factor":  # budget share x period / long window, as windows.burn_rate_factor
        budget = f"(float64 {_arm(objective, 'budgetPercent')})"
        return f'{{{{ printf "%.6g" (divf (mulf {budget} {period}) (mulf 100 {_seconds(_arm(objective, "long"))})) }}}}'
    if what == "spent":
        return f'{{{{ printf "%.6g" (float64 {_arm(objective, "budgetPercent")}) }}}}'
    if what == "iflong":  # windows.is_long_window
        assert slots is not None
        return f"{{{{ if ge (mul 30 {_seconds(slots[objective].lookup)}) {period} }}}}"
    if what == "ifbase":  # the aggregates' window: their records answer (Numbers.base_rate)
        assert slots is not None
        return f"{{{{ if eq {_seconds(slots[objective].lookup)} {aggregates.WINDOW} }}}}"
    if what == "else":
        return "{{ else }}"
    if what == "end":
        return "{{ end }}"
    if what == "release":  # only in a matcher, replaced before: anywhere else is a bug
        raise AssertionError("the release stand-in outside a release matcher")
    if what == "severity":
        return f'{{{{ index $.Values.prometheus.rules.severities "{objective}" }}}}'
    if what == "runbook":
        return "{{ $.Values.prometheus.rules.runbookUrl }}"
    return _number(what, _lookup, objective)


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

    return replace(
        ruleset,
        groups=tuple(replace(g, rules=tuple(one(r) for r in g.rules)) for g in ruleset.groups),
    )


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


def _stand_ins(spec: SLOSpec, slots: list[_Slot]) -> SLOSpec:
    """``spec`` with a stand-in window per arm window and a stand-in override per objective
    (built without validation: stand-ins are not real durations or models)."""
    by_arm: dict[str, dict[str, int]] = {}
    for slot in slots:
        by_arm.setdefault(slot.arm, {})[slot.kind] = slot.seconds
    windows = {
        arm: WindowSetting.model_construct(long=w["long"], short=w["short"], budget_percent=None)
        for arm, w in by_arm.items()
    }
    objectives = [
        o.model_copy(
            update={"models": {**o.models, _stand_in_model(o.name): ModelOverride(target=o.target)}}
        )
        for o in spec.objectives
    ]
    return spec.model_copy(update={"windows": windows, "objectives": objectives})


def _marked(ruleset: RuleSet, slots: list[_Slot], marks: list[str]) -> RuleSet:
    """``ruleset`` with marker rules (replaced by Helm actions in the text) around each stand-in
    override's rules (a range over the overrides of its objective) and around each window's
    records but the base window's (an if that no earlier arm window has the same value)."""
    path = ".".join(("$.Values", *OVERRIDES_PATH))
    ends = {slot.text: i for i, slot in enumerate(slots) if i}

    def mark(action: str) -> Rule:
        marks.append(action)
        return Rule("@@helm:mark@@", record=f"@@mark{len(marks) - 1}@@")

    groups = []
    for g in ruleset.groups:
        rules: list[Rule] = []
        open_model = None
        for r in g.rules:
            model = r.labels.get(c.LABEL_MODEL)
            if open_model is not None and model != open_model:
                rules.append(mark("{{- end }}{{- end }}"))
                open_model = None
            if _is_stand_in(model) and open_model is None:
                objective = r.labels[c.LABEL_SLO]
                rules.append(
                    mark(
                        f'{{{{- range $o := {path} }}}}{{{{- if eq $o.objective "{objective}" }}}}'
                    )
                )
                open_model = model
            i = next((i for text, i in ends.items() if r.record and r.record.endswith(text)), None)
            if i is None:
                rules.append(r)
            else:
                earlier = " ".join(slot.lookup for slot in slots[:i])
                rules += [
                    mark(f"{{{{- if not (has {slots[i].lookup} (list {earlier})) }}}}"),
                    r,
                    mark("{{- end }}"),
                ]
        if open_model is not None:
            rules.append(mark("{{- end }}{{- end }}"))
        groups.append(replace(g, rules=tuple(rules)))
    return replace(ruleset, groups=tuple(groups))


def render_helm_rules(spec: SLOSpec) -> str:
    """The rules file as a Helm template (the chart ``tpl``s it with the release's values).

    :func:`release_rules` with each release-specific part as a lookup: every rule selects and
    carries ``llm_release`` (:func:`release_scope`; the ``llm-sidecar.releaseMatcher`` template
    writes the matcher, exact or, with ``anyNamespace``, any namespace); targets, thresholds,
    severities, the runbook URL, the burn-rate windows and per-model overrides come from
    values."""
    slots = _slots(spec)
    scoped = _scoped_stand_in(_stand_ins(spec, slots))
    ruleset = _relabel(
        generate(scoped, numbers=HelmNumbers(slots)),
        lambda s: f"@@helm:severity:{s}@@",
        "@@helm:runbook:url@@",
    )
    marks: list[str] = []
    text = render_rules(_marked(ruleset, slots, marks))
    # The plain file's header comments would name the stand-ins: the Helm comment below says it.
    text = text[text.index("\ngroups:\n") + 1 :]
    text = re.sub(r"\{\{|\}\}", lambda m: "{{`" + m.group() + "`}}", text)
    text = _MARK.sub(lambda m: marks[int(m.group(1))] + "\n", text)
    overrides = ".".join(("$.Values", *OVERRIDES_PATH))
    for o in spec.objectives:
        text = text.replace(
            f',{c.LABEL_MODEL}!="{_stand_in_model(o.name)}"',
            f'{{{{ range $x := {overrides} }}}}{{{{ if eq $x.objective "{o.name}" }}}},'
            f'{c.LABEL_MODEL}!="{{{{ $x.model }}}}"{{{{ end }}}}{{{{ end }}}}',
        )
    for slot in slots:
        text = text.replace(slot.text, f"{{{{ {slot.lookup[1:-1]} }}}}")
    by_key = {slot.key: slot for slot in slots}
    matcher = f'{LABEL_RELEASE}="{_RELEASE_STAND_IN}"'
    assert matcher in text, "the rules select no release"
    # A matcher first in its braces would make "{{{", which Helm cannot parse: that brace is an action too.
    text = text.replace("{" + matcher, '{{ "{" }}' + matcher).replace(
        matcher, '{{ include "llm-sidecar.releaseMatcher" $ }}'
    )
    # LLMSidecarDown watches the job the chart's monitor writes (prometheus.monitor.jobLabel):
    # with the spec's job fixed here, another jobLabel would page every release for ever.
    job = f'job="{spec.alerts.target_down.job}"'
    assert job in text, "the rules watch no scrape job"
    text = text.replace(job, "job={{ $.Values.prometheus.monitor.jobLabel | quote }}")
    text = _TOKEN.sub(lambda m: _action(m.group(1), m.group(2), spec.period, by_key), text)
    assert "@@" not in text and not any(slot.text in text for slot in slots), (
        "a stand-in was left in the chart's rules"
    )
    # A Helm comment, so that the rendered rules are exactly the plain ones.
    header = (
        "{{- /* Helm template of the rules (the chart passes it through tpl): each objective's\n"
        f"target and threshold come from .Values.{'.'.join(VALUES_PATH)}, the burn-rate\n"
        f"windows from .Values.{'.'.join(WINDOWS_PATH)}, per-model overrides from\n"
        f".Values.{'.'.join(OVERRIDES_PATH)}. Period {spec.period_name}. Rendered by\n"
        "sidecar/tools/slo/helm.py from the spec; refresh with scripts/sync-chart.sh. */ -}}\n"
    )
    return header + _guard(spec, slots) + text


def _guard(spec: SLOSpec, slots: list[_Slot]) -> str:
    """Refuse at render time what the schema cannot: a target out of range (a string from
    --set), a window not in canonical form or not shorter than its long window or the period,
    a base window (the shortest arm window, whose rates the long windows sum) that is not the
    shortest, and an override given twice."""
    path = ".".join(("$.Values", *VALUES_PATH))
    key = ".".join(VALUES_PATH)
    wkey = ".".join(WINDOWS_PATH)
    okey = ".".join(OVERRIDES_PATH)
    windows = ".".join(("$.Values", *WINDOWS_PATH))
    overrides = ".".join(("$.Values", *OVERRIDES_PATH))
    base = slots[0]
    target_check = (
        "{{- if or (lt (float64 %(t)s) 50.0) (ge (float64 %(t)s) 100.0) }}"
        '{{- fail (printf "%(what)s must be at least 50 and below 100, got %%v" %(args)s) }}'
        "{{- end }}"
    )
    return (
        f"{{{{- range $name, $o := {path} }}}}"
        + target_check % {"t": "$o.target", "what": f"{key}.%s.target", "args": "$name $o.target"}
        + "{{- end }}"
        f"{{{{- $base := {_seconds(base.lookup)} }}}}"
        f"{{{{- range $arm, $w := {windows} }}}}"
        '{{- range $kind := list "short" "long" }}'
        "{{- $d := toString (index $w $kind) }}"
        '{{- if not (regexMatch "^[1-9][0-9]*[smhd]$" $d) }}'
        f'{{{{- fail (printf "{wkey}.%s.%s must be a duration such as 5m, 6h or 3d, got %s" $arm $kind $d) }}}}'
        "{{- end }}"
        '{{- $canonical := include "llm-sidecar.duration" (include "llm-sidecar.seconds" $d) }}'
        "{{- if ne $canonical $d }}"
        f'{{{{- fail (printf "{wkey}.%s.%s: write %s as %s (the name the rules give the window)" $arm $kind $d $canonical) }}}}'
        "{{- end }}"
        '{{- if lt (include "llm-sidecar.seconds" $d | atoi) $base }}'
        f'{{{{- fail (printf "{wkey}.%s.%s (%s) is shorter than {base.key} (%s), the base window the long windows sum; shorten {base.key}" $arm $kind $d {base.lookup}) }}}}'
        "{{- end }}"
        "{{- end }}"
        '{{- if ge (include "llm-sidecar.seconds" $w.short | atoi) (include "llm-sidecar.seconds" $w.long | atoi) }}'
        f'{{{{- fail (printf "{wkey}.%s: the short window (%s) must be shorter than the long one (%s)" $arm $w.short $w.long) }}}}'
        "{{- end }}"
        f'{{{{- if ge (include "llm-sidecar.seconds" $w.long | atoi) {spec.period} }}}}'
        f'{{{{- fail (printf "{wkey}.%s.long (%s) must be shorter than the period ({spec.period_name})" $arm $w.long) }}}}'
        "{{- end }}"
        "{{- if or (le (float64 $w.budgetPercent) 0.0) (gt (float64 $w.budgetPercent) 100.0) }}"
        f'{{{{- fail (printf "{wkey}.%s.budgetPercent must be above 0 and at most 100, got %v" $arm $w.budgetPercent) }}}}'
        "{{- end }}"
        "{{- end }}"
        "{{- $seen := list }}"
        f"{{{{- range $i, $o := {overrides} }}}}"
        '{{- $id := printf "%s %s" $o.objective $o.model }}'
        "{{- if has $id $seen }}"
        f'{{{{- fail (printf "{okey}[%d]: objective %s has a second override for model %s" $i $o.objective $o.model) }}}}'
        "{{- end }}"
        "{{- $seen = append $seen $id }}"
        '{{- if hasKey $o "target" }}'
        + target_check
        % {"t": "$o.target", "what": f"{okey}[%d].target", "args": "$i $o.target"}
        + "{{- end }}"
        "{{- end -}}\n"
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
            latency = c.latency_sli(o.sli, o.cache_class)
            as_text = sorted(
                {format(b, "g") for b in latency.buckets}
                | {floatToGoString(b) for b in latency.buckets},  # type: ignore[no-untyped-call]  # unannotated upstream
                key=lambda t: (float(t), t),
            )
            entry["thresholdSeconds"] = {
                "enum": [*latency.buckets, *as_text],
                "description": f"a bucket bound of {latency.histogram} (the SLI reads the bucket at the threshold)",
            }
            required.append("thresholdSeconds")
        props[o.name] = {
            "type": "object",
            "additionalProperties": False,
            "required": required,
            "properties": entry,
        }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [o.name for o in spec.objectives],
        "description": "Target and threshold of each SLO objective of the shipped spec (deploy/slo/default.yaml)",
        "properties": props,
    }


def windows_values(spec: SLOSpec) -> dict[str, dict[str, Any]]:
    """The chart's default ``prometheus.rules.windows``: each alert arm of ``spec``."""
    out: dict[str, dict[str, Any]] = {}
    for w in spec.alert_windows:
        percent = w.budget_consumed * 100
        out[w.name] = {
            "long": w.long_name,
            "short": w.short_name,
            "budgetPercent": int(percent) if percent.denominator == 1 else float(percent),
        }
    return out


_DURATION_SCHEMA = {
    "type": "string",
    "pattern": r"^[1-9][0-9]*[smhd]$",
    "description": "a Prometheus duration of one unit in its largest exact unit (5m, 6h, 1d; not 60m)",
}


def windows_schema(spec: SLOSpec) -> dict[str, Any]:
    """JSON schema of ``prometheus.rules.windows``: the spec's arms, each with its windows and
    budget share (the template refuses what a schema cannot say: see :func:`_guard`)."""
    budget = {
        "anyOf": [
            {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
            {"type": "string", "pattern": r"^(100(\.0+)?|[0-9]{1,2}(\.[0-9]+)?)$"},
        ],
        "description": "percent of the period's error budget spent within the long window when the arm fires",
    }
    arm = {
        "type": "object",
        "additionalProperties": False,
        "required": ["long", "short", "budgetPercent"],
        "properties": {
            "long": _DURATION_SCHEMA,
            "short": _DURATION_SCHEMA,
            "budgetPercent": budget,
        },
    }
    names = [w.name for w in spec.alert_windows]
    return {
        "type": "object",
        "additionalProperties": False,
        "required": names,
        "description": (
            "Burn-rate alert arms (SRE workbook): each fires when the burn rate over its long and "
            "its short window exceeds budgetPercent/100 x period / long"
        ),
        "properties": {name: arm for name in names},
    }


def overrides_schema(spec: SLOSpec) -> dict[str, Any]:
    """JSON schema of ``prometheus.rules.modelOverrides``: per objective, the fields it allows
    (a threshold only for latency objectives, and then only a bucket bound of its histogram)."""
    objectives = schema_section(spec)["properties"]
    rules = []
    for o in spec.objectives:
        then: dict[str, Any] = {"properties": {}}
        if "thresholdSeconds" in objectives[o.name]["properties"]:
            then["properties"]["thresholdSeconds"] = objectives[o.name]["properties"][
                "thresholdSeconds"
            ]
        else:
            then["not"] = {"required": ["thresholdSeconds"]}
        rules.append({"if": {"properties": {"objective": {"const": o.name}}}, "then": then})
    item = {
        "type": "object",
        "additionalProperties": False,
        "required": ["objective", "model"],
        "anyOf": [{"required": ["target"]}, {"required": ["thresholdSeconds"]}],
        "properties": {
            "objective": {
                "enum": [o.name for o in spec.objectives],
                "description": "the objective it changes",
            },
            "model": {
                "type": "string",
                "pattern": MODEL_PATTERN,
                "description": "the `model` label value",
            },
            "target": schema_section(spec)["properties"][spec.objectives[0].name]["properties"][
                "target"
            ],
            "thresholdSeconds": {"description": "a bucket bound of the objective's histogram"},
        },
        "allOf": rules,
    }
    return {
        "type": "array",
        "items": item,
        "description": (
            "Per-model overrides: the model's rules use this target and/or threshold, and the "
            "objective's rules for every other model leave it out"
        ),
    }


GUARD_TEMPLATE = "llm-sidecar.rulesGuard"
"""The named template holding :func:`_guard`'s checks (helm/llm-sidecar/templates/_rules-guard.tpl)."""


def render_helm_guard(spec: SLOSpec) -> str:
    """:func:`_guard`'s checks as a named template, which the chart includes from a plain
    template rendered before the rules: a wrong value then fails with its one line, where a
    ``fail`` inside the rules' ``tpl`` would print the whole rules file before it."""
    return f'{{{{- define "{GUARD_TEMPLATE}" -}}}}\n' + _guard(spec, _slots(spec)) + "{{- end -}}\n"
