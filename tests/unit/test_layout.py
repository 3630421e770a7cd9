"""The package is layered and has no import circle.

Layers, each importing only the ones below it (docs/design.md, "Code layout"):

    base -> streams -> measure -> relay | export -> config -> app -> fleet -> cli

``relay`` and ``export`` sit side by side and never import each other: measuring flows from
the relay into one record per request, and the exporters read that record. Neither reads the
settings model: ``app`` builds them from it with plain arguments. ``fleet`` runs N of what
``app`` serves (``--workers``) and merges their pages. Inside ``relay`` three
folders are layered the same way, ``server -> data -> control``: the client-facing server's
plumbing (aiohttp's internals, what it refuses, the error answers, draining), the data plane
(a request to the upstream and its bytes back, measured on the way) and the control plane (the
sidecar's own requests to the upstream: its listing, its metrics page, its health). The tools
(``sidecar.tools``: simulator, demo, dashboards and SLO generators) sit beside the runtime:
they may import it, the runtime never imports them, except the command line, which starts a
tool inside the function that runs its subcommand (so ``import sidecar.cli`` loads none).

Checked statically on the module graph (every ``import`` in sidecar/**/*.py, relative ones
resolved, lazy ones inside functions included) and dynamically (each module imported alone in
a fresh interpreter, so a circle that only bites in some import order cannot hide behind an
earlier import)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.fresh_imports import Imported, import_each_alone

PACKAGE = Path(__file__).resolve().parents[2] / "sidecar"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path, *, top_level_only: bool = False) -> set[str]:
    """The package modules ``name`` imports, anywhere in its body (or only where the module
    itself runs: not inside a function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path)), top_level_only):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from pkg import mod` imports the submodule (its package is already running or
            # done); `from mod import name` imports the module.
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _import_nodes(tree: ast.AST, top_level_only: bool):
    if not top_level_only:
        yield from ast.walk(tree)
        return
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        )


# The runtime's layers, lowest first. A module's layer is its folder (or, at the top, its
# own name); ``sidecar`` itself (the version) is base.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"base"}),
    frozenset({"streams"}),
    frozenset({"measure"}),
    frozenset({"relay", "export"}),
    frozenset({"config"}),
    frozenset({"app"}),
    frozenset({"fleet"}),
    frozenset({"cli"}),
)
TOOLS = "tools"
# Inside relay, lowest first; relay/__init__ holds no code.
RELAY_PARTS = ("server", "data", "control")


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "base"
    return "cli" if parts[1] == "__main__" else parts[1]


def rank(layer: str) -> int | None:
    """The layer's place, lowest first (the tools above all); None outside every layer."""
    if layer == TOOLS:
        return len(LAYERS)
    return next((i for i, members in enumerate(LAYERS) if layer in members), None)


def backward_imports(
    graph: dict[str, set[str]], top_level: dict[str, set[str]] | None = None
) -> list[str]:
    """Every import that points up, sideways across folders of one layer, or from the runtime
    into the tools (only the command line may, and only inside a function)."""
    wrong = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here == there:
                if here == "relay" and _relay_rank(target) > _relay_rank(module):
                    wrong.append(f"{module} -> {target}")
                continue
            if there == TOOLS and here == "cli" and top_level is not None:
                if target not in top_level.get(module, set()):
                    continue  # started inside the subcommand's function
            if rank(here) is None or rank(there) is None:
                wrong.append(f"{module} -> {target} (outside every layer)")
                continue
            if here == TOOLS or rank(there) < rank(here):
                continue
            wrong.append(f"{module} -> {target}")
    return wrong


def _relay_rank(module: str) -> int:
    """A relay module's place among RELAY_PARTS (-1 for relay itself, len for none)."""
    parts = module.split(".")
    if len(parts) < 3:
        return -1
    return RELAY_PARTS.index(parts[2]) if parts[2] in RELAY_PARTS else len(RELAY_PARTS)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path ``a -> b -> ... -> a``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_graph() -> dict[str, set[str]]:
    """Edges between modules; a package's ``__init__`` counts only for what it imports itself,
    not as a parent of its submodules (Python runs it first, but it imports none of them)."""
    return {name: imported_modules(name, path) for name, path in MODULES.items()}


def top_level_graph() -> dict[str, set[str]]:
    return {
        name: imported_modules(name, path, top_level_only=True) for name, path in MODULES.items()
    }


def test_every_import_points_down_the_layers():
    assert backward_imports(package_graph(), top_level_graph()) == []


def test_every_module_of_the_package_has_a_layer():
    unknown = {layer_of(m) for m in MODULES} - {TOOLS} - set().union(*LAYERS)
    assert not unknown, f"modules outside every layer: {unknown} (add them to LAYERS)"


def test_every_relay_module_sits_in_one_of_its_three_folders():
    loose = [m for m in MODULES if layer_of(m) == "relay" and _relay_rank(m) == len(RELAY_PARTS)]
    assert not loose, f"relay modules outside {RELAY_PARTS}: {loose}"
    assert not imported_modules("sidecar.relay", PACKAGE / "relay" / "__init__.py")


def test_the_layer_check_reports_what_points_the_wrong_way():
    graph = {
        "sidecar.measure.observe": {
            "sidecar.relay.data.upstream",
            "sidecar.streams.sse",
            "sidecar.base.routes",
        },
        "sidecar.export.metrics": {"sidecar.relay.data.proxy"},
        "sidecar.relay.data.proxy": {
            "sidecar.tools.sim.core",
            "sidecar.measure.observe",
            "sidecar.relay.server.errors",
        },
        "sidecar.relay.server.drain": {
            "sidecar.relay.data.upstream",
            "sidecar.relay.server.errors",
        },
        "sidecar.relay.data.upstream": {"sidecar.relay.control.model_discovery"},
        "sidecar.cli": {"sidecar.tools.demo", "sidecar.tools.sim.core"},
        "sidecar.tools.demo": {"sidecar.app", "sidecar.cli"},
    }
    top_level = {"sidecar.cli": {"sidecar.tools.sim.core"}}
    assert backward_imports(graph, top_level) == [
        "sidecar.cli -> sidecar.tools.sim.core",  # at import time: not lazy
        "sidecar.export.metrics -> sidecar.relay.data.proxy",  # sideways across one layer
        "sidecar.measure.observe -> sidecar.relay.data.upstream",  # up
        "sidecar.relay.data.proxy -> sidecar.tools.sim.core",  # runtime into the tools
        "sidecar.relay.data.upstream -> sidecar.relay.control.model_discovery",  # up inside relay
        "sidecar.relay.server.drain -> sidecar.relay.data.upstream",  # up inside relay
    ]


def test_the_static_import_graph_of_the_package_has_no_cycle():
    assert find_cycle(package_graph()) is None


def test_the_cycle_finder_reports_a_circle_it_is_given():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_relative_and_lazy_imports():
    graph = package_graph()
    assert (
        "sidecar.tools.sim.core" in graph["sidecar.tools.sim.dialects"]
    )  # from .core import (...)
    assert "sidecar.tools.sim.server" in graph["sidecar.cli"]  # imported inside main()
    assert "sidecar.export.semconv" in graph["sidecar.export.spans"]  # from . import semconv


IMPORTABLE = [n for n in MODULES if not n.endswith("__main__")]


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, Imported]:
    """Every module imported alone (tests/support/fresh_imports.py: one interpreter with the
    libraries loaded, a forked child per module), all at once."""
    return import_each_alone("sidecar", IMPORTABLE, PACKAGE.parent)


@pytest.mark.parametrize("name", IMPORTABLE)
def test_each_module_imports_alone_in_a_fresh_interpreter(imported_alone, name):
    result = imported_alone[name]
    assert result.code == 0, result.error[-2000:]


def test_importing_alone_finds_a_circle_that_only_one_order_hits(tmp_path):
    """The forked imports see what fresh interpreters see: ``a`` imports ``b``, which needs a
    name ``a`` defines after that import; ``import b`` works (it loads ``a`` whole first),
    ``import a`` fails, and neither hides the other."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\nX = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("from pkg.a import X\nprint(X)\n")
    results = import_each_alone("pkg", ["pkg.b", "pkg.a", "pkg"], tmp_path)
    assert results["pkg.b"].code == 0 and results["pkg"].code == 0
    assert results["pkg.a"].code == 1
    assert "partially initialized module 'pkg.a'" in results["pkg.a"].error


def test_the_simulator_no_longer_has_its_two_halves_importing_each_other():
    graph = package_graph()
    assert "sidecar.tools.sim.dialects" not in graph["sidecar.tools.sim.core"]
    assert (
        not (PACKAGE / "simulate.py").exists() and not (PACKAGE / "simulate_dialects.py").exists()
    )


def test_every_folder_of_modules_is_a_package_the_build_ships():
    # setuptools' find (pyproject: include = ["sidecar*"]) skips a folder without
    # __init__.py: it would import from a checkout and be missing from the wheel and image.
    from setuptools import find_packages

    shipped = set(find_packages(str(PACKAGE.parent), include=["sidecar*"]))
    folders = {module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("*.py")}
    assert folders <= shipped, folders - shipped
