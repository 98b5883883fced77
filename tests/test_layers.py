"""The house stays drawn: stages import only downward, and no package has an import loop.

The order of the floors is written down once, here (``FLOORS``). Every import counts — at the top,
inside a function, or under ``TYPE_CHECKING`` — because each is an arrow a reader must follow and a
lazy import is still a dependency. Read from the source with :mod:`ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "autodice"

# Lowest first: a package may import itself and the floors below it, never one above.
FLOORS = ("core", "frontend", "backend", "deploy", "report", "dse", "api", "cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Every ``autodice`` module *path* imports, resolved to a module that exists.

    ``from .x import y`` names module ``x.y`` when that is a module, else ``x``.
    """
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("autodice"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("autodice"):
                target = node.module
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def floor(module: str) -> str | None:
    """The stage a module lives in (``autodice.dse.search`` -> ``dse``); None for the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def test_every_package_has_a_floor(graph):
    stray = sorted({f for m in graph if (f := floor(m)) and f not in FLOORS and f != "__main__"})
    assert not stray, f"packages missing from FLOORS: {stray}"


def test_no_upward_import(graph):
    upward = [
        f"{m} -> {t}"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if floor(m) in FLOORS and floor(t) in FLOORS
        and FLOORS.index(floor(t)) > FLOORS.index(floor(m))
    ]
    assert not upward, "imports from a higher floor:\n" + "\n".join(upward)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_cycle_finder_finds_a_loop():
    # a -> b -> c -> a, and d alone: the checker itself must be able to fail.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_loop(graph):
    loops = cycles(graph)
    assert not loops, "import loops:\n" + "\n".join(" <-> ".join(c) for c in loops)


# Rooms a floor keeps to itself: (room, the modules of its floor that may import it). Shipping
# code reaches an emulated host through an inventory, as it reaches a real board; only the CLI's
# `cluster` verbs (and the room itself) know emulation.
ROOMS = {"autodice.deploy.emulated": ("autodice.deploy.emulated",)}


def test_rooms_are_kept_to_themselves(graph):
    for room, allowed in ROOMS.items():
        inside = [f"{m} -> {t}" for m, targets in sorted(graph.items()) for t in sorted(targets)
                  if (t == room or t.startswith(room + ".")) and floor(m) == floor(room)
                  and not m.startswith(allowed)]
        assert not inside, f"imports of {room} from its own floor:\n" + "\n".join(inside)
