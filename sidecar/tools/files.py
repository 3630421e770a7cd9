"""Writing a generated file whole or not at all, for the generators (rules, dashboards, the
settings reference)."""

from __future__ import annotations

import os
import tempfile

__all__ = ["write_whole"]


def write_whole(path: str | os.PathLike[str], text: str, *, make_dirs: bool = False) -> None:
    """Write ``text`` to ``path`` beside it, then rename: a failed run never leaves half a
    file, and a reader never sees one. Mode 0644: mkstemp's 0600 would hide the file from
    another user (a Prometheus reading the rules)."""
    folder = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".llm-sidecar-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
