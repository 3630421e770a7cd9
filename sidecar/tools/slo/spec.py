"""The SLO spec: a versioned YAML document, validated once, rejected with one clear line.

::

    version: 1
    period: 30d                      # compliance period; 28d also common; 12h for a drill
    grouping: [cluster, namespace, model]   # one SLO and error budget per deployment
    selector: {namespace: team-a-prod}      # optional: only these deployments (one spec each)
    objectives:
      - name: ttft                   # the `slo` label, and the alert name LLMTTFTBurnRate
        sli: ttft                    # availability | ttft | tpot | itl | e2e
        target: 95                   # percent of events that must be good
        threshold_seconds: 2.0       # latency SLIs: a histogram bucket bound
        prompt_class: le1024         # ttft only: one prompt-length class (sidecar --ttft-prompt-classes)
        cache_class: none            # ttft only: prefix-cache misses alone (prefill); or partial, most
        models:                      # per-model overrides of target and/or threshold
          my-405b: {threshold_seconds: 5.0}
    alerts:
      runbook_url: https://.../docs/runbooks.md   # default: docs/runbooks.md
      target_down: {job: llm-sidecar, for: 5m, severity: page}
      no_traffic: {for: 30m, severity: ticket}
      history_short: {severity: info}   # the period reaches back before the first data
      streams_stalled: {for: 1m, window: 2m, severity: page}   # a hung engine: stalled, none completed
    windows:                         # optional: change a burn-rate alert arm (default: the SRE workbook's)
      page-fast: {long: 2h, short: 10m, budget_percent: 2}   # page-slow, ticket-fast, ticket-slow

``grouping`` names the labels every SLO is per: each distinct combination gets its own
records, error budget and alerts, and the alerts carry those labels for Alertmanager routing.
A label the series lack (``cluster`` on a single Prometheus) simply stays empty, so the default
keeps ``cluster`` where a Thanos or Mimir ruler sees it.

A latency SLI reads the histogram's cumulative bucket at its threshold, so a threshold that
is not a bucket bound would silently read nothing: such a spec is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .conventions import LABEL_TENANT, SLI_KINDS, TENANT_SLIS, latency_sli
from .windows import (
    ARM_NAMES,
    WORKBOOK_WINDOWS,
    AlertWindow,
    Severity,
    format_duration,
    is_drill_period,
    parse_duration,
    windows_for_period,
)

__all__ = [
    "SPEC_VERSION",
    "DEFAULT_RUNBOOK_URL",
    "RUNBOOK_URL_PATTERN",
    "SpecError",
    "ModelOverride",
    "Objective",
    "TargetDownAlert",
    "NoTrafficAlert",
    "HistoryShortAlert",
    "StreamsStalledAlert",
    "Alerts",
    "WindowSetting",
    "DEFAULT_GROUPING",
    "PROMPT_CLASS_PATTERN",
    "SLOSpec",
    "Scope",
    "parse_spec",
    "load_spec",
]

SPEC_VERSION = 1
DEFAULT_RUNBOOK_URL = "docs/runbooks.md"
"""Where the runbooks are: the file in the repository, since nothing is published at a fixed
address. Set your copy's URL (``alerts.runbook_url``, ``slo render --runbook-url``, the chart's
``prometheus.rules.runbookUrl``)."""

RUNBOOK_URL_PATTERN = r"^(https?://[^\s'#]+|[A-Za-z0-9_.][A-Za-z0-9_./-]*)$"
"""An http(s) URL or a relative path, without a fragment (``#runbook-<alert>`` is appended)."""


class SpecError(Exception):
    """The spec is unusable; the message is one line naming the problem."""


def _duration(value: Any) -> int:
    if not isinstance(value, str):
        raise ValueError(f"write a duration such as 5m, 6h or 30d, got {value!r}")
    return parse_duration(value)


Duration = Annotated[int, BeforeValidator(_duration)]
"""A Prometheus duration string in the YAML, whole seconds in Python."""


def _check_target(value: float) -> float:
    if not 50 <= value < 100:
        raise ValueError(
            f"target is a percentage of good events, at least 50 and below 100 (e.g. 99.5), got {value!r}"
        )
    return value


def _check_threshold(sli: str, value: float, cache_class: str | None = None) -> None:
    latency = latency_sli(sli, cache_class)
    if float(value) not in latency.buckets:
        bounds = ", ".join(format(b, "g") for b in latency.buckets)
        raise ValueError(
            f"threshold_seconds {value:g} is not a bucket bound of {latency.histogram} "
            f"(the SLI reads the bucket at the threshold); choose one of {bounds}"
        )


_STRICT = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ModelOverride(BaseModel):
    """What one model does differently from its objective."""

    model_config = _STRICT

    target: float | None = None
    threshold_seconds: float | None = None

    @field_validator("target")
    @classmethod
    def _target(cls, v: float | None) -> float | None:
        return None if v is None else _check_target(v)

    @model_validator(mode="after")
    def _not_empty(self) -> ModelOverride:
        if self.target is None and self.threshold_seconds is None:
            raise ValueError("an override sets target, threshold_seconds or both")
        return self


PROMPT_CLASS_PATTERN = r"^(le[1-9][0-9]*|gt[1-9][0-9]*|unknown|all)$"
"""The values of the TTFT histogram's ``prompt_class`` label (sidecar/base/prompt_class.py)."""

DEFAULT_GROUPING = ("cluster", "namespace", "model")
"""A deployment's identity after scrape: Prometheus' target labels, the model, and ``cluster``
where an external label or a Thanos/Mimir ruler keeps it."""

_RESERVED_LABELS = frozenset(
    {"slo", "severity", "long_window", "short_window", "le", "outcome", "__name__"}
)


class Objective(BaseModel):
    """One SLO: which SLI, how good it must be, and per-model exceptions."""

    model_config = _STRICT

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,39}$")
    sli: Literal["availability", "ttft", "tpot", "itl", "e2e"]
    target: float
    threshold_seconds: float | None = None
    prompt_class: str | None = Field(None, pattern=PROMPT_CLASS_PATTERN)
    """TTFT only: count only requests of this prompt-length class (``le1024``, ``gt8192``, ...)."""
    cache_class: Literal["none", "partial", "most"] | None = None
    """TTFT only: count only requests of this prefix-cache class, from the companion histogram
    ``llm_time_to_first_token_by_cache_seconds``. ``none`` judges the misses alone: prefill
    speed, which hits would otherwise hide (and a cache that stops hitting would otherwise
    burn). Requests whose server did not report cached tokens (``unknown``) are left out."""
    models: dict[str, ModelOverride] = Field(default_factory=dict)

    @field_validator("target")
    @classmethod
    def _target(cls, v: float) -> float:
        return _check_target(v)

    @model_validator(mode="after")
    def _thresholds(self) -> Objective:
        if any(not model for model in self.models):
            raise ValueError("models: a model name is empty")
        if self.prompt_class is not None and self.sli != "ttft":
            raise ValueError(
                f"prompt_class applies to ttft objectives only (the TTFT histogram has it), not {self.sli}"
            )
        if self.cache_class is not None:
            if self.sli != "ttft":
                raise ValueError(
                    f"cache_class applies to ttft objectives only (TTFT by cache class is measured), not {self.sli}"
                )
            if self.prompt_class is not None:
                raise ValueError(
                    "cache_class and prompt_class cannot be combined: the TTFT-by-cache histogram has no prompt_class"
                )
        if self.sli == "availability":
            if self.threshold_seconds is not None:
                raise ValueError("availability has no threshold_seconds (it counts server errors)")
            for model, o in self.models.items():
                if o.threshold_seconds is not None:
                    raise ValueError(f"models.{model}: availability has no threshold_seconds")
            return self
        if self.threshold_seconds is None:
            raise ValueError(
                f"a {self.sli} objective needs threshold_seconds (a histogram bucket bound)"
            )
        _check_threshold(self.sli, self.threshold_seconds, self.cache_class)
        for model, o in self.models.items():
            if o.threshold_seconds is not None:
                try:
                    _check_threshold(self.sli, o.threshold_seconds, self.cache_class)
                except ValueError as exc:
                    raise ValueError(f"models.{model}: {exc}") from None
        return self

    def scopes(self, selector: tuple[tuple[str, str], ...] = ()) -> list[Scope]:
        """The default scope (every model without an override), then one per override.
        ``selector``: the spec's label matchers (the deployments the spec covers)."""
        overridden = tuple(self.models)
        out = [Scope(self, None, self.target, self.threshold_seconds, overridden, selector)]
        for model, o in self.models.items():
            target = self.target if o.target is None else o.target
            threshold = (
                self.threshold_seconds if o.threshold_seconds is None else o.threshold_seconds
            )
            out.append(Scope(self, model, target, threshold, (), selector))
        return out


@dataclass(frozen=True, eq=False, slots=True)
class Scope:
    """An objective as it applies to one model (an override) or to all the others."""

    objective: Objective
    model: str | None
    """The overridden model, or None for every model without an override."""
    target: float
    threshold: float | None
    excluded: tuple[str, ...]
    """Models the default scope leaves to their overrides."""
    selector: tuple[tuple[str, str], ...] = ()
    """Label equalities every series of the spec must have (its ``selector``)."""

    @property
    def error_budget(self) -> Fraction:
        """1 - target, exactly (99.5 -> 1/200)."""
        return 1 - Fraction(str(self.target)) / 100


class TargetDownAlert(BaseModel):
    model_config = _STRICT

    job: str = Field(
        "llm-sidecar", min_length=1, description="the `job` label of the sidecar's scrape targets"
    )
    for_: Duration = Field(5 * 60, alias="for")
    severity: Severity = "page"


class NoTrafficAlert(BaseModel):
    model_config = _STRICT

    for_: Duration = Field(30 * 60, alias="for")
    severity: Severity = "ticket"


class HistoryShortAlert(BaseModel):
    model_config = _STRICT

    enabled: bool = True
    severity: Literal["page", "ticket", "info"] = "info"


class StreamsStalledAlert(BaseModel):
    """Streams stalled on a pod (``llm_streams_stalled``) while it completed none within
    ``window``, for ``for``: a hung engine (sidecar/tools/slo/stall.py)."""

    model_config = _STRICT

    enabled: bool = True
    for_: Duration = Field(60, alias="for")
    window: Duration = 2 * 60
    severity: Severity = "page"

    @field_validator("window")
    @classmethod
    def _window(cls, v: int) -> int:
        if v < 60:
            raise ValueError(
                "window must be at least 1m: increase() needs two scrapes of the request counter"
            )
        return v


class Alerts(BaseModel):
    model_config = _STRICT

    runbook_url: str = Field(DEFAULT_RUNBOOK_URL, pattern=RUNBOOK_URL_PATTERN)
    """The runbooks page the alerts link into (docs/runbooks.md or your copy of it);
    ``#runbook-<alert>`` is appended."""
    target_down: TargetDownAlert = Field(default_factory=TargetDownAlert)
    no_traffic: NoTrafficAlert = Field(default_factory=NoTrafficAlert)
    history_short: HistoryShortAlert = Field(default_factory=HistoryShortAlert)
    streams_stalled: StreamsStalledAlert = Field(default_factory=StreamsStalledAlert)


class WindowSetting(BaseModel):
    """What a spec changes in one burn-rate alert arm (``windows: {page-fast: {long: 2h}}``)."""

    model_config = _STRICT

    long: Duration | None = None
    short: Duration | None = None
    budget_percent: float | None = Field(None, gt=0, le=100)
    """Percent of the period's error budget spent within ``long`` when the arm fires."""

    @model_validator(mode="after")
    def _not_empty(self) -> WindowSetting:
        if self.long is None and self.short is None and self.budget_percent is None:
            raise ValueError("a window setting sets long, short, budget_percent or some of them")
        return self


class SLOSpec(BaseModel):
    """A whole spec (``version: 1``)."""

    model_config = _STRICT

    version: int
    period: Duration = 30 * 24 * 3600
    grouping: tuple[str, ...] = DEFAULT_GROUPING
    selector: dict[str, str] = Field(default_factory=dict)
    """Only series with these label values (e.g. ``{namespace: team-a-prod}``): one spec per
    deployment, each with its own targets, side by side in one Prometheus. Each label must be
    a grouping label, so the records of two specs never collide."""
    objectives: list[Objective]
    alerts: Alerts = Field(default_factory=Alerts)
    windows: dict[str, WindowSetting] = Field(default_factory=dict)
    """Changes to the burn-rate alert arms (page-fast, page-slow, ticket-fast, ticket-slow):
    their long and short windows and budget share; the factor follows. Default: the SRE
    workbook's (scaled for a drill period)."""

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SPEC_VERSION:
            raise ValueError(
                f"unsupported spec version {v}; this llm-sidecar reads version {SPEC_VERSION}"
            )
        return v

    @field_validator("period")
    @classmethod
    def _period(cls, v: int) -> int:
        if is_drill_period(v):
            windows_for_period(v)  # raises when the scaled windows are not whole seconds
            return v
        longest = max(w.long for w in WORKBOOK_WINDOWS)
        if v % (24 * 3600) or v <= longest:
            raise ValueError(
                f"period must be whole days and longer than the {format_duration(longest)} alert window "
                f"(30d or 28d are usual; a drill period under 1d, such as 12h, scales the windows), "
                f"got {format_duration(v)}"
            )
        return v

    @field_validator("grouping")
    @classmethod
    def _grouping(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for label in v:
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label):
                raise ValueError(f"{label!r} is not a Prometheus label name")
            if label in _RESERVED_LABELS:
                raise ValueError(
                    f"{label!r} cannot be a grouping label: the rules set or read it themselves"
                )
        if len(set(v)) != len(v):
            raise ValueError("a grouping label is repeated")
        if "model" not in v:
            raise ValueError(
                "grouping must include model (per-model overrides and goodput are per model)"
            )
        return v

    @model_validator(mode="after")
    def _tenant_grouping(self) -> SLOSpec:
        if LABEL_TENANT in self.grouping:
            for o in self.objectives:
                if o.sli not in TENANT_SLIS:
                    raise ValueError(
                        f"objectives.{o.name}: grouping by {LABEL_TENANT} needs an SLI whose series carry it "
                        f"({', '.join(sorted(TENANT_SLIS))}); {o.sli} has no {LABEL_TENANT} label"
                    )
                if o.cache_class is not None:
                    raise ValueError(
                        f"objectives.{o.name}: grouping by {LABEL_TENANT} cannot judge a cache_class: "
                        f"the TTFT-by-cache histogram has no {LABEL_TENANT} label"
                    )
        return self

    @model_validator(mode="after")
    def _selector(self) -> SLOSpec:
        for label, value in self.selector.items():
            if label not in self.grouping:
                raise ValueError(
                    f"selector: {label!r} must be a grouping label too (else two specs' records would collide)"
                )
            if not value:
                raise ValueError(f"selector: {label} needs a value")
        return self

    @model_validator(mode="after")
    def _windows(self) -> SLOSpec:
        for name in self.windows:
            if name not in ARM_NAMES:
                raise ValueError(
                    f"windows: unknown alert arm {name!r}; choose one of {', '.join(ARM_NAMES)}"
                )
        for w in self.alert_windows:
            if w.short >= w.long:
                raise ValueError(
                    f"windows.{w.name}: the short window ({w.short_name}) must be shorter than the long one ({w.long_name})"
                )
            if w.long >= self.period:
                raise ValueError(
                    f"windows.{w.name}: the long window ({w.long_name}) must be shorter than the period"
                )
        return self

    def scopes(self, objective: Objective) -> list[Scope]:
        """``objective``'s scopes, restricted to the spec's selector."""
        return objective.scopes(tuple(sorted(self.selector.items())))

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v: list[Objective]) -> list[Objective]:
        if not v:
            raise ValueError("no objectives: there would be nothing to render")
        names = [o.name for o in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"objective names must be unique; repeated: {', '.join(dupes)}")
        return v

    @property
    def period_name(self) -> str:
        return format_duration(self.period)

    @property
    def alert_windows(self) -> tuple[AlertWindow, ...]:
        """The burn-rate arms for this period (the workbook's, scaled for a drill period),
        with the spec's ``windows`` changes."""
        out = []
        for w in windows_for_period(self.period):
            setting = self.windows.get(w.name)
            if setting is not None:
                w = AlertWindow(
                    w.severity,
                    w.long if setting.long is None else setting.long,
                    w.short if setting.short is None else setting.short,
                    w.budget_consumed
                    if setting.budget_percent is None
                    else Fraction(str(setting.budget_percent)) / 100,
                    w.name,
                )
            out.append(w)
        return tuple(out)


def _where(loc: tuple[Any, ...], data: Any) -> str:
    """``('objectives', 1, 'threshold_seconds')`` -> ``objectives[1] (ttft).threshold_seconds``."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            if isinstance(node, list) and part < len(node):
                node = node[part]
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    out += f" ({node['name']})"
            else:
                node = None
        else:
            out += ("." if out else "") + str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out


def parse_spec(data: Any, source: str = "spec") -> SLOSpec:
    """Validate a loaded YAML document; :class:`SpecError` names the first problem."""
    if data is None:
        raise SpecError(f"{source}: the spec is empty; there would be nothing to render")
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping with version and objectives")
    if "version" not in data:
        raise SpecError(
            f"{source}: version is required (write `version: {SPEC_VERSION}` at the top)"
        )
    try:
        return SLOSpec.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        err = errors[0]
        where = _where(err["loc"], data)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "is required"
        elif err["type"] == "literal_error" and where.endswith(".sli"):
            msg = f"unknown SLI {err['input']!r}; choose one of {', '.join(SLI_KINDS)}"
        elif err["type"] == "string_pattern_mismatch" and where.endswith(".name"):
            msg = f"{err['input']!r} must be lower case letters, digits, - or _ (it becomes a label value)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SpecError(f"{source}: {where or 'spec'}: {msg}{more}") from None


def load_spec(path: str) -> SLOSpec:
    """Read and validate a spec file."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise SpecError(f"{path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_spec(data, path)
