"""The request's own latency objectives, and whether the response met them.

llm-d's router reads per-request objectives from the headers ``x-llm-d-slo-ttft-ms`` and
``x-llm-d-slo-tpot-ms`` (milliseconds), and still from their first spelling, ``x-slo-ttft-ms``
and ``x-slo-tpot-ms``: the sidecar reads both, and where a request carries both spellings of
one objective the llm-d one is read and the other is not. Benchmarks report "goodput" against such objectives
offline. The sidecar judges every streamed API request against its objectives live, one
verdict per objective, so goodput against what the client asked for is one PromQL ratio
(``llm_request_objectives_total``, docs/metrics.md).

Where an objective comes from, per objective: the request's header when it carries a sane
value; else the default for the request's model (``--slo-model-objectives``, mirroring the
SLO spec's per-model overrides), else the sidecar's own goodput objective
(``--slo-ttft-seconds`` / ``--slo-tpot-seconds``). The headers are only read: they are
relayed unchanged, as every header.

A header value that is not a plain positive number of milliseconds up to one day (``0``,
``-5``, ``1e3``, ``NaN``, ``350ms``, a repeated header) is ignored (the default applies)
and counted (``llm_request_objective_invalid_total``); the client never sees an error. Only
HTTP's optional whitespace (space and tab) around the number is allowed: any other space
character (NBSP, U+3000, NEL) makes the value invalid, as it would for a strict parser.

The verdicts, for a streamed API request (``stream`` asked, or a token stream came):

- ttft   met when the first token came within the objective; missed when it came later,
         or never came (an error, an empty answer); not judged when the client left
         before the first token and before the objective had passed (it cannot be told).
- tpot   met when TPOT (docs/design.md) is within the objective; not judged when there is
         no TPOT (fewer than two output tokens).
- all    judged when either is: met when the request ended ``ok`` with a 2xx and every
         judged objective was met (the request's goodput).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "TTFT_HEADER",
    "TPOT_HEADER",
    "TTFT_HEADER_FIRST",
    "TPOT_HEADER_FIRST",
    "MAX_OBJECTIVE_SECONDS",
    "OBJECTIVES",
    "RequestObjectives",
    "ObjectiveDefaults",
    "Judgement",
    "parse_objective_ms",
    "read_objectives",
    "judge",
]

TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
TTFT_HEADER_FIRST = "x-slo-ttft-ms"
"""The first spelling of :data:`TTFT_HEADER`, read when a request does not carry that one."""
TPOT_HEADER_FIRST = "x-slo-tpot-ms"
"""The first spelling of :data:`TPOT_HEADER`, read when a request does not carry that one."""
MAX_OBJECTIVE_SECONDS = 86_400.0
"""Longer than a day is not an objective a latency can be judged against: ignored."""
OBJECTIVES = ("ttft", "tpot", "all")
"""Every value of the ``objective`` label."""

_MS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?")
_OWS = " \t"
"""HTTP's optional whitespace (RFC 9110, 5.6.3), the only space a field value may be padded
with; ``str.strip()`` would also take Unicode's (NBSP, U+3000, NEL)."""


def parse_objective_ms(raw: str) -> float | None:
    """A header's milliseconds -> seconds; None for anything but a plain positive number of
    milliseconds up to one day (no sign, exponent, unit, NaN or infinity)."""
    text = raw.strip(_OWS)
    if not _MS.fullmatch(text):
        return None
    seconds = float(text) / 1000.0
    if not 0.0 < seconds <= MAX_OBJECTIVE_SECONDS:
        return None
    return seconds


@dataclass(frozen=True, slots=True)
class RequestObjectives:
    """What the request's headers asked for, in seconds (None: no usable header), and which
    headers were present but not usable (``"ttft"``, ``"tpot"``)."""

    ttft: float | None = None
    tpot: float | None = None
    invalid: tuple[str, ...] = ()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    getall = getattr(headers, "getall", None)
    if getall is not None:
        values = getall(name, None)
        if not values:
            return None
        return (
            values[0] if len(values) == 1 else ", ".join(values)
        )  # repeated: a list, not a number
    return headers.get(name)


def read_objectives(headers: Mapping[str, str]) -> RequestObjectives | None:
    """The request's objectives, or None when it sent no objective header (nearly every
    request: four membership tests, nothing built)."""
    if (
        TTFT_HEADER not in headers
        and TTFT_HEADER_FIRST not in headers
        and TPOT_HEADER not in headers
        and TPOT_HEADER_FIRST not in headers
    ):
        return None
    raw_ttft = _header(headers, TTFT_HEADER)
    if raw_ttft is None:
        raw_ttft = _header(headers, TTFT_HEADER_FIRST)
    raw_tpot = _header(headers, TPOT_HEADER)
    if raw_tpot is None:
        raw_tpot = _header(headers, TPOT_HEADER_FIRST)
    if raw_ttft is None and raw_tpot is None:
        return None
    ttft = None if raw_ttft is None else parse_objective_ms(raw_ttft)
    tpot = None if raw_tpot is None else parse_objective_ms(raw_tpot)
    invalid = tuple(
        name
        for name, raw, value in (("ttft", raw_ttft, ttft), ("tpot", raw_tpot, tpot))
        if raw is not None and value is None
    )
    return RequestObjectives(ttft, tpot, invalid)


@dataclass(frozen=True, slots=True)
class ObjectiveDefaults:
    """The objectives of a request that sent none: per model (the SLO spec's overrides),
    else the sidecar's goodput objectives. None: no default for that objective."""

    ttft: float | None = None
    tpot: float | None = None
    by_model: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def for_model(self, model: str) -> tuple[float | None, float | None]:
        override = self.by_model.get(model) if model else None
        if override is None:
            return self.ttft, self.tpot
        ttft, tpot = override
        return (self.ttft if ttft is None else ttft), (self.tpot if tpot is None else tpot)


class Judgement(NamedTuple):
    """One request's objectives (seconds), where each came from, and the verdicts (None:
    not judged; see the module doc)."""

    ttft_objective: float | None
    tpot_objective: float | None
    ttft_from_header: bool
    tpot_from_header: bool
    ttft_met: bool | None
    tpot_met: bool | None
    met: bool | None

    def verdicts(self) -> tuple[tuple[str, bool], ...]:
        """``(objective, met)`` for each judged objective, ``all`` last."""
        out: tuple[tuple[str, bool], ...] = ()
        if self.ttft_met is not None:
            out = (("ttft", self.ttft_met),)
        if self.tpot_met is not None:
            out += (("tpot", self.tpot_met),)
        if self.met is not None:
            out += (("all", self.met),)
        return out


def judge(
    defaults: ObjectiveDefaults,
    model: str,
    asked: RequestObjectives | None,
    ttft: float | None,
    tpot: float | None,
    e2e: float,
    cancelled: bool,
    served: bool,
) -> Judgement | None:
    """The verdicts of a finished streamed API request (sidecar/measure/summary.py asks only
    for those) of ``model`` that asked for ``asked`` (None: no objective header), with its
    TTFT, TPOT and end-to-end seconds, whether its client left (``cancelled``) and whether it
    was ``served`` (ok with a 2xx); None when no objective applies."""
    default_ttft, default_tpot = (
        defaults.for_model(model) if defaults.by_model else (defaults.ttft, defaults.tpot)
    )  # (no override to look up: the goodput objectives, as for_model gives them)
    ttft_obj = asked.ttft if asked is not None and asked.ttft is not None else default_ttft
    tpot_obj = asked.tpot if asked is not None and asked.tpot is not None else default_tpot
    if ttft_obj is None and tpot_obj is None:
        return None
    ttft_met = tpot_met = None
    if ttft_obj is not None:
        if ttft is not None:
            ttft_met = ttft <= ttft_obj
        elif not cancelled or e2e > ttft_obj:
            ttft_met = False  # no token ever came, or the objective had passed when the client left
    if tpot_obj is not None and tpot is not None:
        tpot_met = tpot <= tpot_obj
    met = None
    if ttft_met is not None or tpot_met is not None:
        met = served and ttft_met is not False and tpot_met is not False
    return Judgement(
        ttft_obj,
        tpot_obj,
        asked is not None and asked.ttft is not None,
        asked is not None and asked.tpot is not None,
        ttft_met,
        tpot_met,
        met,
    )
