"""``llm-sidecar slo render SPEC.yaml [--output FILE] [--runbook-url URL]``: thin over load ->
generate -> render."""

from __future__ import annotations

import re
import sys

from ..files import write_whole
from .capacity import generate
from .render import render_rules
from .spec import RUNBOOK_URL_PATTERN, SLOSpec, SpecError, load_spec

__all__ = ["render_command"]


def _fail(message: str) -> int:
    print(f"llm-sidecar: {message}", file=sys.stderr)
    return 2


def with_runbook_url(spec: SLOSpec, url: str) -> SLOSpec:
    """``spec`` with its alerts linking into ``url`` (docs/runbooks.md where the team reads it)."""
    if not re.fullmatch(RUNBOOK_URL_PATTERN, url):
        raise SpecError(f"--runbook-url {url!r}: an http(s) URL or a relative path, without '#'")
    return spec.model_copy(update={"alerts": spec.alerts.model_copy(update={"runbook_url": url})})


def render_command(spec_path: str, output: str | None, runbook_url: str | None = None) -> int:
    """Render ``spec_path``'s rules to ``output`` (or stdout). 0, or 2 with one line on stderr."""
    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        return _fail(f"SLO spec {exc}")
    try:
        if runbook_url is not None:
            spec = with_runbook_url(spec, runbook_url)
        text = render_rules(generate(spec))
    except SpecError as exc:
        return _fail(
            str(exc)
            if runbook_url is not None and "--runbook-url" in str(exc)
            else f"SLO spec {exc}"
        )
    if output is None or output == "-":
        sys.stdout.write(text)
        return 0
    try:
        write_whole(output, text)
    except OSError as exc:
        return _fail(f"cannot write {output}: {exc.strerror or exc}")
    return 0
