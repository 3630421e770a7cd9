"""``llm-sidecar slo render SPEC.yaml [--output FILE]``: thin over load -> generate -> render."""

from __future__ import annotations

import os
import sys
import tempfile

from .render import render_rules
from .capacity import generate
from .spec import SpecError, load_spec

__all__ = ["render_command"]


def _fail(message: str) -> int:
    print(f"llm-sidecar: {message}", file=sys.stderr)
    return 2


def render_command(spec_path: str, output: str | None) -> int:
    """Render ``spec_path``'s rules to ``output`` (or stdout). 0, or 2 with one line on stderr."""
    try:
        text = render_rules(generate(load_spec(spec_path)))
    except SpecError as exc:
        return _fail(f"SLO spec {exc}")
    if output is None or output == "-":
        sys.stdout.write(text)
        return 0
    # Write beside the target and rename, so a failed run never leaves half a rules file.
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".slo-render-", dir=os.path.dirname(os.path.abspath(output)))
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the rules from a Prometheus user
        os.replace(tmp, output)
    except OSError as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        return _fail(f"cannot write {output}: {exc.strerror or exc}")
    return 0
