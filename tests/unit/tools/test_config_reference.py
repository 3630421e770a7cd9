"""docs/configuration.md's settings table is the configuration model's, and every ``serve``
flag is documented: the page says "every setting", so a setting added to the model without
regenerating the page fails here."""

from __future__ import annotations

import re
import subprocess
import sys

from sidecar.cli import serve_parser
from sidecar.config import ENV_PREFIX, Settings
from sidecar.tools.config_reference import BEGIN, DOC, END, render
from tests.support.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = [sys.executable, "-m", "sidecar.tools.config_reference"]


def _table(text: str) -> str:
    return BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END


def _rows(table: str) -> dict[str, list[str]]:
    """YAML key -> the row's cells, from the generated table."""
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 6 and cells[2].startswith("`"):
            rows[cells[2].strip("`")] = cells
    return rows


def test_the_page_holds_the_current_reference():
    text = DOC.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert _table(text) == render(), "stale: run python -m sidecar.tools.config_reference"
    # The hand-written prose stays around the table.
    assert text.startswith("# Configuration\n") and "Mistakes are caught by name" in text


def test_every_setting_is_a_row_with_its_flag_variable_and_default():
    rows = _rows(_table(DOC.read_text(encoding="utf-8")))
    assert set(rows) == set(Settings.model_fields)
    for name, info in Settings.model_fields.items():
        flag, env, _, _, default, description = rows[name]
        assert flag.startswith(f"`--{name.replace('_', '-')}"), flag
        assert env == f"`{ENV_PREFIX}{name.upper()}`"
        assert description and description.startswith(info.description.replace("|", "\\|")[:20])
        if info.is_required():
            assert default == "required"
        elif isinstance(info.default, int | float) and not isinstance(info.default, bool):
            figure = float(default.split("`")[1])
            assert figure == info.default, (name, default)


def test_every_serve_flag_appears_in_the_docs():
    text = "\n".join(page.read_text(encoding="utf-8") for page in DOCS)
    flags = [o for a in serve_parser()._actions for o in a.option_strings]
    assert len(flags) > len(Settings.model_fields)  # the settings, --config and --help
    missing = [
        f
        for f in flags
        if f not in ("-h", "--help") and not re.search(rf"`{re.escape(f)}[` ]", text)
    ]
    assert not missing, f"serve flags no doc names: {missing}"


def test_the_command_rewrites_a_stale_table_and_check_says_so(tmp_path):
    page = tmp_path / "configuration.md"
    current = DOC.read_text(encoding="utf-8")
    stale = current.replace("| `--read-timeout SECONDS` |", "| `--read-timeout S` |", 1)
    assert stale != current
    page.write_text(stale, encoding="utf-8")
    check = subprocess.run(
        [*COMMAND, "--doc", str(page), "--check"], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 1 and "python -m sidecar.tools.config_reference" in check.stderr
    assert page.read_text(encoding="utf-8") == stale  # --check writes nothing
    write = subprocess.run(
        [*COMMAND, "--doc", str(page)], capture_output=True, text=True, timeout=60
    )
    assert write.returncode == 0, write.stderr
    assert page.read_text(encoding="utf-8") == current
    again = subprocess.run([*COMMAND, "--doc", str(page), "--check"], timeout=60)
    assert again.returncode == 0


def test_a_page_without_its_markers_is_refused(tmp_path):
    page = tmp_path / "configuration.md"
    page.write_text("# Configuration\n\nno table\n", encoding="utf-8")
    done = subprocess.run(
        [*COMMAND, "--doc", str(page)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "BEGIN settings reference" in done.stderr
    assert page.read_text(encoding="utf-8") == "# Configuration\n\nno table\n"
