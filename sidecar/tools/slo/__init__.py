"""SLO spec -> Prometheus recording and multi-window multi-burn-rate alert rules.

The shape follows Sloth: a versioned spec (:mod:`.spec`), the burn-rate windows as data
(:mod:`.windows`), every generated name in one place (:mod:`.conventions`), pure rule
generation (:mod:`.rules`) and rendering to a ``groups:`` file (:mod:`.render`). The
command line (:mod:`.cli`) is a thin shim over those.
"""

from __future__ import annotations

from .capacity import generate
from .render import render_rules
from .spec import SLOSpec, SpecError, load_spec, parse_spec

__all__ = ["SLOSpec", "SpecError", "load_spec", "parse_spec", "generate", "render_rules"]
