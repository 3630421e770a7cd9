"""The settings reference of docs/configuration.md, generated from the one configuration model.

``python -m sidecar.tools.config_reference [--doc PATH] [--check]`` rewrites the table between
the two markers of the page (the prose around it is written by hand), or with ``--check``
writes nothing and exits 1 when the table is not the model's. Each row is one setting of
:class:`~sidecar.config.Settings`: its ``serve`` flag (as ``serve --help`` shows it), its
``LLM_SIDECAR_*`` variable, its YAML key, type, default and description, so a new setting is
documented by the same change that adds it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from types import NoneType, UnionType
from typing import Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from ..cli import serve_parser
from ..config import BOOLEAN_WORDS, ENV_PREFIX, Settings
from .files import write_whole

__all__ = ["BEGIN", "END", "DOC", "render", "updated", "main"]

COMMAND = "python -m sidecar.tools.config_reference"
DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN = f"<!-- BEGIN settings reference: generated from sidecar/config.py by `{COMMAND}`; DO NOT EDIT -->"
END = "<!-- END settings reference -->"


class MarkerError(Exception):
    """The page has not exactly one pair of markers, in order."""


def _kind(annotation: object) -> str:
    """A setting's type in a reader's words."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (Union, UnionType) and NoneType in args:
        (inner,) = (a for a in args if a is not NoneType)
        return f"{_kind(inner)}, empty: unset"
    if origin in (Union, UnionType):
        return " or ".join(_kind(a) for a in args)
    if origin is list:
        return f"list of {_kind(args[0])}s, comma-separated"
    if origin is dict:
        return "mapping (JSON in the flag and the variable)"
    if annotation is bool:
        return "boolean: " + ", ".join(BOOLEAN_WORDS)
    names = {str: "string", int: "integer", float: "number"}
    return (
        names.get(annotation, str(annotation)) if isinstance(annotation, type) else str(annotation)
    )


def _number(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _default(name: str, info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        text = f"`{_number(value)}`"
        if name.endswith("_bytes") and isinstance(value, int) and value >= 1024:
            for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
                if value % size == 0:
                    return f"{text} ({value // size} {unit})"
        return text
    if value in ([], {}):
        return "empty"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flag(action: argparse.Action) -> str:
    option = action.option_strings[0]
    if action.nargs == 0:
        return f"`{option}`"
    value = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
    )
    return f"`{option} {value}`"


def render() -> str:
    """The table, markers included: one row per setting, then ``--config``."""
    actions = {a.dest: a for a in serve_parser()._actions if a.option_strings}
    lines = [
        BEGIN,
        "",
        "| flag | environment variable | YAML key | type | default | description |",
        "|---|---|---|---|---|---|",
    ]
    for name, info in Settings.model_fields.items():
        cells = (
            _flag(actions[name]),
            f"`{ENV_PREFIX}{name.upper()}`",
            f"`{name}`",
            _kind(info.annotation),
            _default(name, info),
            _cell(info.description or ""),
        )
        lines.append("| " + " | ".join(cells) + " |")
    config = actions["config"]
    help_text = (config.help or "").split(" [env ")[0]
    lines.append(
        f"| {_flag(config)} | `{ENV_PREFIX}CONFIG` | — | path | unset | {_cell(help_text)}: "
        "a mapping of the YAML keys above |"
    )
    lines += ["", END]
    return "\n".join(lines)


def updated(text: str) -> str:
    """``text`` with the table between its markers replaced by :func:`render`'s."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise MarkerError(f"expected one {BEGIN!r} line and, after it, one {END!r} line")
    head, rest = text.split(BEGIN)
    tail = rest.split(END)[1]
    return head + render() + tail


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Write (or check) the settings reference of the configuration page.",
    )
    parser.add_argument("--doc", type=Path, default=DOC, help="the page (default: %(default)s)")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the table is stale"
    )
    args = parser.parse_args(argv)
    current = args.doc.read_text(encoding="utf-8")
    try:
        fresh = updated(current)
    except MarkerError as exc:
        print(f"{args.doc}: {exc}", file=sys.stderr)
        return 2
    if fresh == current:
        return 0
    if args.check:
        print(f"stale (run {COMMAND}): {args.doc}", file=sys.stderr)
        return 1
    write_whole(args.doc, fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
