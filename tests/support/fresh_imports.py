"""Each module of a package imported alone: in an interpreter where no other module of the
package was imported before it, so an import circle that only bites in some import order
cannot hide behind an earlier import.

An interpreter start per module costs its start and the third-party libraries' imports again
for every module. Instead, one interpreter (this file run as a script) imports the libraries
the package uses (none of the package's own modules) and forks a child per module; the child
imports that one module and exits. Each child starts where a fresh interpreter would be once
the libraries are loaded, so the package's own import order is the one ``import <module>``
gives, as in a fresh interpreter."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Imported:
    module: str
    code: int
    error: str


def _own(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def libraries_used(package: str, modules: list[str], cwd: Path) -> list[str]:
    """Every module outside ``package`` that importing all of ``modules`` loads, in the order
    they were loaded (from a throwaway interpreter)."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        pass\n"
        f"print('\\n' + json.dumps([m for m in sys.modules if not (m == {package!r} "
        f"or m.startswith({package + '.'!r}))]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])  # after whatever a module printed


def import_each_alone(package: str, modules: list[str], cwd: Path) -> dict[str, Imported]:
    """``modules`` (of ``package``, under ``cwd``) each imported alone; by module name."""
    preload = libraries_used(package, modules, cwd)
    done = subprocess.run(
        # run from cwd, as `python -c "import <module>"` would be (sys.path[0] is cwd)
        [
            sys.executable,
            "-c",
            f"import runpy; runpy.run_path({__file__!r}, run_name='__main__')",
            package,
        ],
        input="\n".join([json.dumps(preload), *modules]) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = {r["module"]: Imported(**r) for r in map(json.loads, done.stdout.splitlines())}
    assert list(results) == modules, done.stderr[-2000:]
    return results


def _serve(package: str) -> None:
    """Load the libraries named on stdin's first line, then import each module named on the
    following lines in a child of its own; one JSON line per module on stdout."""
    for name in json.loads(sys.stdin.readline()):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S110 (a module that fails here fails again in the child)
            pass
    loaded = sorted(m for m in sys.modules if _own(m, package))
    assert not loaded, f"the libraries imported {loaded}"
    for line in sys.stdin:
        name = line.strip()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # what a module prints is not a result
            code = 0
            try:
                importlib.import_module(name)
            except BaseException:
                os.write(write, traceback.format_exc().encode())
                code = 1
            os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            error = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"module": name, "code": code, "error": error}), flush=True)


if __name__ == "__main__":
    _serve(sys.argv[1])
