"""``python -m sidecar.tools.dashboards [--spec SPEC] [--root DIR] [--check]``: write (or check) the
generated dashboards and their kustomization."""

from __future__ import annotations

import argparse
import os
import sys

from ..files import write_whole
from ..slo import SpecError, load_spec
from . import DEFAULT_SPEC, render_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sidecar.tools.dashboards", description=__doc__)
    parser.add_argument("--root", default=".", help="repository root to write under (default: .)")
    parser.add_argument("--spec", default=None, help=f"SLO spec (default: ROOT/{DEFAULT_SPEC})")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is stale"
    )
    args = parser.parse_args(argv)
    spec_path = args.spec or os.path.join(args.root, DEFAULT_SPEC)
    try:
        files = render_files(load_spec(spec_path))
    except SpecError as exc:
        print(f"llm-sidecar: SLO spec {exc}", file=sys.stderr)
        return 2
    stale = []
    for rel, text in files.items():
        path = os.path.join(args.root, rel)
        try:
            with open(path, encoding="utf-8") as fh:
                current = fh.read()
        except FileNotFoundError:
            current = None
        if current == text:
            continue
        stale.append(rel)
        if not args.check:
            write_whole(path, text, make_dirs=True)
    if args.check and stale:
        print(
            "stale (run python -m sidecar.tools.dashboards): " + ", ".join(stale), file=sys.stderr
        )
        return 1
    for rel in stale:
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
