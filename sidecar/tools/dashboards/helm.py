"""The chart's dashboards: the same generators, rendered as Helm templates, so each release
gets its own copy (its own uid and title here, its own data key, the file Grafana's dashboard
sidecar writes, in templates/dashboards.yaml: two releases never overwrite each other's) and
its SLO dashboard draws the objectives its own rules use (``--set
prometheus.rules.objectives.ttft.thresholdSeconds=5.0`` reads "<= 5s", not the spec's 2 s).

Why this way, as for the rules (``sidecar/tools/slo/helm.py``): the generator stays the one
source of every panel; only what a release changes is left to Helm. The SLO dashboard is
built from a stand-in spec: each objective's target and threshold and each burn-rate arm's
windows and budget share are numbers no real spec has (``91.2345``, ``3.21987``, ``7000001s``,
``1.11112``), so every place the dashboard writes one (in a title, a description, a
threshold, a query, as the target, its ratio, its error budget, a bucket bound, a window
name, a factor) can be found in the text and replaced by the Helm action that writes the
same number from the release's values, formatted as the generator formats it (``%.6g``).
Per-model overrides from values (``prometheus.rules.modelOverrides``) are added where the
spec's own overrides would be: each overridden model's target line and its own threshold in
the breakdown (both as ``(override) or (default)`` in one query), its target as the SLI
stat's colour, and a sentence in the descriptions. Each copy opens on its own release (the
``llm_release`` variable's current value). With the default values, ``helm template`` gives
the committed ``dashboards/*.json`` but for uid, title and that value (a test checks it); the plain files stay the one copy for a cluster-wide install (``kubectl apply -k
dashboards/``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

from ..slo import conventions as c
from ..slo.rules import objective_text
from ..slo.spec import Objective, SLOSpec, WindowSetting
from ..slo.windows import burn_rate_factor, format_duration, format_number
from .render import json_text

__all__ = ["TEMPLATE_DIR", "chart_templates"]

TEMPLATE_DIR = "helm/llm-sidecar/files/dashboard-templates"
"""Where the chart reads its dashboard templates (templates/dashboards.yaml ``tpl``s them)."""

_OBJECTIVES = "$.Values.prometheus.rules.objectives"
_WINDOWS = "$.Values.prometheus.rules.windows"
_OVERRIDES = "$.Values.prometheus.rules.modelOverrides"

_TARGET_BASE = 91.2345  # + i / 10000 for objective i: six significant digits, seen nowhere else
_THRESHOLD_BASE = 3.21987  # + i / 100000
_WINDOW_BASE = 7_000_001  # seconds, odd: renders as "7000001s"
_BUDGET_BASE = 1.11111  # percent, + k / 100000 for arm k


def _escape(text: str) -> str:
    """Grafana's own ``{{label}}`` legends, kept from Helm."""
    return re.sub(r"\{\{|\}\}", lambda m: "{{`" + m.group() + "`}}", text)


def _seconds(lookup: str) -> str:
    return f'(include "llm-sidecar.seconds" {lookup} | atoi)'


def _constant(value: str) -> Callable[[re.Match[str]], str]:
    """A re.sub replacement that is ``value`` as it is (no backslash processing)."""
    return lambda _match: value


class _Replacements:
    """(literal, Helm action) pairs, applied longest literal first so that no literal
    replaces part of a longer one."""

    def __init__(self) -> None:
        self.pairs: dict[str, str] = {}

    def add(self, literal: str, action: str) -> None:
        if self.pairs.get(literal, action) != action:
            raise AssertionError(f"stand-in {literal!r} has two meanings")
        self.pairs[literal] = action

    def apply(self, text: str) -> str:
        for literal in sorted(self.pairs, key=len, reverse=True):
            pattern = rf"(?<![0-9.]){re.escape(literal)}(?![0-9])"
            text = re.sub(pattern, _constant(self.pairs[literal]), text)
        return text


def _target_actions(t: str) -> dict[str, Callable[[], str]]:
    """The forms a target takes in the SLO dashboard, as Helm actions of the lookup ``t``."""
    return {
        "target": lambda: f'{{{{ printf "%.6g" {t} }}}}',
        "ratio": lambda: f'{{{{ printf "%.6g" (divf {t} 100) }}}}',
        "budget": lambda: f'{{{{ printf "%.6g" (subf 100 {t}) }}}}',
    }


def _target_forms(target: float) -> dict[str, str]:
    exact = Fraction(str(target))
    return {
        "target": format_number(target),
        "ratio": format_number(target / 100),
        "budget": format_number((1 - exact / 100) * 100),
        "record": format_number(target).replace(".", "_"),
    }


def _le_action(t: str) -> str:
    """A bucket bound as prometheus_client writes it: ``2.0`` for a whole number."""
    return f'{{{{ if eq {t} (floor {t}) }}}}{{{{ printf "%.1f" {t} }}}}{{{{ else }}}}{{{{ {t} }}}}{{{{ end }}}}'


def _stand_in(spec: SLOSpec, out: _Replacements) -> SLOSpec:
    """``spec`` with stand-in numbers, and the replacement of each by its values lookup."""
    objectives = []
    for i, o in enumerate(spec.objectives):
        if o.models:
            raise ValueError(
                f"objective {o.name}: the chart's spec ships no per-model overrides (values add them)"
            )
        target = round(_TARGET_BASE + i / 10000, 4)
        t = f'(float64 (index {_OBJECTIVES} "{o.name}" "target"))'
        actions = _target_actions(t)
        forms = _target_forms(target)
        for form, action in actions.items():
            out.add(forms[form], action())
        # The capacity row's quantile (p95) and its record name stay the spec's: the chart's
        # capacity rules record them with the spec's target (sidecar/tools/slo/capacity.py).
        original = _target_forms(o.target)
        out.add(f"p{forms['target']}", f"p{original['target']}")
        out.add(forms["record"], original["record"])
        update: dict[str, Any] = {"target": target}
        if o.threshold_seconds is not None:
            threshold = round(_THRESHOLD_BASE + i / 100000, 5)
            th = f'(float64 (index {_OBJECTIVES} "{o.name}" "thresholdSeconds"))'
            out.add(f'le=\\"{threshold}\\"', f'le=\\"{_le_action(th)}\\"')
            out.add(format_number(threshold), f'{{{{ printf "%.6g" {th} }}}}')
            update["threshold_seconds"] = threshold
        objectives.append(o.model_copy(update=update))
    windows = {}
    slot = 0
    for k, arm in enumerate(spec.alert_windows):
        setting = {}
        for kind in ("short", "long"):
            seconds = _WINDOW_BASE + 2 * slot
            slot += 1
            setting[kind] = seconds
            out.add(format_duration(seconds), f'{{{{ index {_WINDOWS} "{arm.name}" "{kind}" }}}}')
        budget = round(_BUDGET_BASE + k / 100000, 5)
        windows[arm.name] = WindowSetting.model_construct(
            long=setting["long"], short=setting["short"], budget_percent=budget
        )
        b = f'(float64 (index {_WINDOWS} "{arm.name}" "budgetPercent"))'
        out.add(format_number(budget), f'{{{{ printf "%.6g" {b} }}}}')
    stand_in = spec.model_copy(update={"objectives": objectives, "windows": windows})
    for arm in stand_in.alert_windows:
        b = f'(float64 (index {_WINDOWS} "{arm.name}" "budgetPercent"))'
        long_ = _seconds(f'(index {_WINDOWS} "{arm.name}" "long")')
        factor = f'{{{{ printf "%.6g" (divf (mulf {b} {spec.period}) (mulf 100 {long_})) }}}}'
        out.add(format_number(burn_rate_factor(arm, spec.period)), factor)
    return stand_in


# ----------------------------------------------------------------- per-model overrides


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``node``, outermost first (panels, rows' panels, queries)."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _override_value(objective: str, key: str) -> str:
    """The override's own number, else its objective's (``$o``: the override ranged over)."""
    return f'(float64 (default (index {_OBJECTIVES} "{objective}" "{key}") (index $o "{key}")))'


def _mark_overrides(
    data: dict[str, Any], spec: SLOSpec, stand_in: SLOSpec, marks: dict[str, str]
) -> None:
    """Put a marker where values' per-model overrides add to the SLO dashboard: before each
    objective's target line and breakdown query (``(override) or`` per overridden model), in
    its SLI stat's field overrides (the model's own target colour), at the end of its SLI
    panels' descriptions (a sentence per override) and of its row's title (their count)."""
    by_name = {o.name: o for o in stand_in.objectives}
    for panel in _walk(data):
        targets = panel.get("targets")
        if not isinstance(targets, list):
            continue
        title = panel.get("title", "")
        for o in stand_in.objectives:
            if not title.startswith(f"{o.name}: "):
                continue
            forms = _target_forms(o.target)
            for q in targets:
                expr = q.get("expr", "")
                if expr.startswith("0 * ") and expr.endswith(f" + {forms['ratio']}"):
                    key = f"@@mark{len(marks)}@@"
                    marks[key] = _target_line_action(o.name, expr, forms["ratio"])
                    q["expr"] = key + expr
                elif (
                    title.endswith("bad-event share by pod and route")
                    and o.threshold_seconds is not None
                ):
                    key = f"@@mark{len(marks)}@@"
                    marks[key] = _breakdown_action(o.name, expr, o.threshold_seconds)
                    q["expr"] = key + expr
            if title == f"{o.name}: SLI over {spec.period_name}":
                key = f"@@mark{len(marks)}@@"
                marks[key] = _stat_overrides_action(o.name, panel["fieldConfig"]["overrides"])
                panel["fieldConfig"]["overrides"] = key
            if "description" in panel and title.startswith(f"{o.name}: SLI"):
                key = f"@@mark{len(marks)}@@"
                marks[key] = _overrides_sentence(by_name[o.name])
                panel["description"] += key
    for panel in _walk(data):
        if panel.get("type") == "row":
            for o in stand_in.objectives:
                if panel.get("title", "").startswith(f"SLO {o.name}: "):
                    key = f"@@mark{len(marks)}@@"
                    marks[key] = _overrides_count(o.name)
                    panel["title"] += key


def _range(objective: str, body: str, need: str | None = None) -> str:
    cond = f'eq $o.objective "{objective}"'
    if need is not None:
        cond = f'and ({cond}) (hasKey $o "{need}")'
    return f"{{{{ range $o := {_OVERRIDES} }}}}{{{{ if {cond} }}}}{body}{{{{ end }}}}{{{{ end }}}}"


def _with_model(expr: str) -> str:
    """``expr`` restricted to the override's model (next to each ``$model`` matcher)."""
    return expr.replace('model=~"$model"', 'model=~"$model", model="{{ $o.model }}"')


def _target_line_action(objective: str, expr: str, ratio: str) -> str:
    line = (
        _with_model(expr)[: -len(ratio)]
        + _target_actions(_override_value(objective, "target"))["ratio"]()
    )
    return _range(objective, f"({_json(line)}) or ")


def _breakdown_action(objective: str, expr: str, threshold: float) -> str:
    th = _override_value(objective, "thresholdSeconds")
    variant = _with_model(expr).replace(f'le="{threshold}"', f'le="{_le_action(th)}"')
    return _range(objective, f"({_json(variant)}) or ", need="thresholdSeconds")


def _stat_overrides_action(objective: str, existing: list[Any]) -> str:
    """The SLI stat's field overrides: an overridden model's legend (it ends with the model)
    coloured by its own target. Built by Helm as data, written with toJson."""
    t = _override_value(objective, "target")
    body = (
        '{{ $items = append $items (dict "matcher" (dict "id" "byRegexp" "options" (printf "^(.* )?%s$" (regexQuoteMeta $o.model)))'
        ' "properties" (list (dict "id" "thresholds" "value" (dict "mode" "absolute" "steps" (list (dict "color" "red" "value" nil)'
        f' (dict "color" "green" "value" (divf {t} 100))))))) }}}}'
    )
    return (
        f"{{{{ $items := fromJsonArray {json.dumps(json.dumps(existing))} }}}}"
        + _range(objective, body, need="target")
        + "{{ toJson $items }}"
    )


def _overrides_count(objective: str) -> str:
    """ " (N per-model overrides)" after the objective's row title, as the generator writes it."""
    count = _range(objective, "{{ $n = add1 $n }}")
    return (
        "{{ $n := 0 }}"
        + count
        + "{{ if $n }} ({{ $n }} per-model override{{ if gt $n 1 }}s{{ end }}){{ end }}"
    )


def _overrides_sentence(objective: Objective) -> str:
    """ " Per-model overrides: model M: <objective text>; ..." for the objective's overrides in values."""
    scope = objective.scopes()[0]
    text = objective_text(scope)
    forms = _target_forms(objective.target)
    text = text.replace(
        forms["target"], _target_actions(_override_value(objective.name, "target"))["target"](), 1
    )
    if objective.threshold_seconds is not None:
        th = _override_value(objective.name, "thresholdSeconds")
        text = text.replace(
            format_number(objective.threshold_seconds), f'{{{{ printf "%.6g" {th} }}}}', 1
        )
    body = f"{{{{ if $first }}}} Per-model overrides: {{{{ else }}}}; {{{{ end }}}}model {{{{ $o.model }}}}: {_json(text)}{{{{ $first = false }}}}"
    return "{{ $first := true }}" + _range(objective.name, body) + "{{ if not $first }}.{{ end }}"


def _json(text: str) -> str:
    """``text`` as it sits inside a JSON string (its quotes escaped), Helm actions kept whole."""
    parts = re.split(r"(\{\{.*?\}\})", text)
    return "".join(p if p.startswith("{{") else json.dumps(p)[1:-1] for p in parts)


# ------------------------------------------------------------------------ the templates


def _release_marks(data: dict[str, Any], marks: dict[str, str]) -> None:
    """The release's uid and title, and its own series selected when the dashboard opens (the
    release variable's current value: ``<namespace>/<fullname>``, as its monitors label them)."""
    base_uid, base_title = data["uid"], data["title"]
    marks["@@uid@@"] = f'{{{{ include "llm-sidecar.dashboardUid" (list $ "{base_uid}") }}}}'
    marks["@@title@@"] = (
        f'{{{{ include "llm-sidecar.dashboardTitle" (list $ "{_json(base_title)}") }}}}'
    )
    marks["@@release@@"] = '{{ $.Release.Namespace }}/{{ include "llm-sidecar.fullname" $ }}'
    data["uid"], data["title"] = "@@uid@@", "@@title@@"
    for variable in data.get("templating", {}).get("list", []):
        if variable.get("name") == c.LABEL_RELEASE:
            variable["current"] = {
                "selected": True,
                "text": ["@@release@@"],
                "value": ["@@release@@"],
            }


def _finish(
    data: dict[str, Any], marks: dict[str, str], replacements: _Replacements | None = None
) -> str:
    text = _escape(json_text(data))
    if replacements is not None:
        text = replacements.apply(text)
    for key, action in marks.items():
        # A marker that stands for a whole JSON value (an array Helm writes) goes with its quotes.
        text = (
            text.replace(json.dumps(key), action)
            if "toJson" in action
            else text.replace(key, action)
        )
    if "@@" in text:
        raise AssertionError("a marker was left in a chart dashboard template")
    header = (
        "{{- /* Helm template of a dashboard (templates/dashboards.yaml passes it through tpl): "
        "rendered by sidecar/tools/dashboards/helm.py; DO NOT EDIT. */ -}}\n"
    )
    return header + text


def chart_templates(
    spec: SLOSpec, build: Callable[[SLOSpec], dict[str, dict[str, Any]]]
) -> dict[str, str]:
    """File name -> the chart's Helm template of that dashboard. ``build`` makes the
    dashboards for a spec (``sidecar.tools.dashboards.build_dashboards``)."""
    out: dict[str, str] = {}
    replacements = _Replacements()
    stand_in = _stand_in(spec, replacements)
    plain = build(spec)
    stood = build(stand_in)
    for name, data in stood.items():
        marks: dict[str, str] = {}
        if json_text(data) == json_text(plain[name]):  # no objective in it: only uid and title
            _release_marks(data, marks)
            out[name] = _finish(data, marks)
            continue
        _mark_overrides(data, spec, stand_in, marks)
        _release_marks(data, marks)
        text = _finish(data, marks, replacements)
        leftover = [
            lit
            for lit in replacements.pairs
            if re.search(rf"(?<![0-9.]){re.escape(lit)}(?![0-9])", text)
        ]
        if leftover or str(_WINDOW_BASE) in text:
            raise AssertionError(f"{name}: stand-ins left in the chart template: {leftover}")
        out[name] = text
    return out
