"""The Dockerfile read as instructions, for tests of the image that need no image built
(``tests/unit/chart/test_helm_files.py``) and of the command line the kubelet composes from it
(``tests/integration/chart/test_kubelet_argv.py``).
"""

from __future__ import annotations

import json

from tests.support.paths import ROOT


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            logical.append(current)
            current = ""
    out = []
    for entry in logical:
        instruction, _, args = entry.partition(" ")
        out.append((instruction.upper(), args.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for instruction, args in dockerfile_instructions():
        if instruction == "FROM":
            out.append([])
        if out:
            out[-1].append((instruction, args))
    return out


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1]


def image_entrypoint_and_cmd() -> tuple[list[str], list[str]]:
    """The runtime stage's ENTRYPOINT and CMD, exec form (a shell form would wrap the
    kubelet's args in `sh -c` and lose them)."""
    found = {i: json.loads(a) for i, a in final_stage() if i in ("ENTRYPOINT", "CMD")}
    return found.get("ENTRYPOINT", []), found.get("CMD", [])
