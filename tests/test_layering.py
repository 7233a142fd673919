"""The package's layers, read from the source with ``ast`` (nothing is imported): only ``fedvlr_plus/cli/`` sees
argparse or ends the process, nothing imports the CLI, and the subpackages do not import each other in a circle
beyond the ones listed below."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: where each importable package lives in the checkout (pyproject's package-dir)
PACKAGE_DIRS = {
    "fedvlr_plus": ROOT / "fedvlr_plus",
    "fedvlr_plus.adapters": ROOT / "adapters",
    "fedvlr_plus.datasets": ROOT / "datasets",
}
CLI = "fedvlr_plus.cli"

#: library modules allowed one of the CLI's habits, and why; each must still have it (else drop it from here)
ALLOWED: set[tuple[str, str]] = set()

#: groups of top-level units that still import each other in a circle (function-level imports included); a
#: group may shrink, none may grow and no new one may appear. None is left: the engine learns a backbone's fast
#: paths through the Backbone contract (closed_form, chunk_refusal/start_chunk), and the layer's RecBole wrapper
#: lives with the method (fedvlr/recbole_layer.py).
KNOWN_CYCLES: list[frozenset] = []
#: (lower, higher): the lower unit never imports the higher one, even where no circle would close
LAYERS = [
    ("adapters", "fedvlr"),
    ("adapters", "federation"),
    ("federation", "fedvlr"),
    ("federation", "flower"),
    ("fedvlr", "flower"),
    ("datasets", "adapters"),
    ("views", "fedvlr"),
    ("evaluation", "federation"),
    # the report reads what the others wrote into a folder; none of them depends on it
    ("federation", "report"),
    ("fedvlr", "report"),
    ("evaluation", "report"),
    ("coldstart", "report"),
    ("experiments", "report"),
]


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    mods = {}
    for pkg, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if pkg == "fedvlr_plus" and parts[0] in ("adapters", "datasets"):
                continue
            is_pkg = parts[-1] == "__init__"
            mods[".".join([pkg] + (parts[:-1] if is_pkg else parts))] = (path, is_pkg)
    return mods


MODULES = _modules()


def _imports(name: str) -> list[str]:
    """Every module name ``name`` imports, anywhere in the file, relative imports resolved."""
    path, is_pkg = MODULES[name]
    package = name if is_pkg else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out += [module] + [f"{module}.{a.name}" for a in node.names]
    return out


def _exits(name: str) -> list[int]:
    """Lines where ``name`` raises SystemExit or calls sys.exit / exit / quit."""
    path, _ = MODULES[name]
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target = node.exc if isinstance(node, ast.Raise) else node.func if isinstance(node, ast.Call) else None
        if isinstance(target, ast.Call):
            target = target.func
        if isinstance(node, ast.Raise) and isinstance(target, ast.Name) and target.id == "SystemExit":
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and (ast.unparse(target) in ("sys.exit", "exit", "quit")):
            lines.append(node.lineno)
    return lines


def _is_cli(module: str) -> bool:
    return module == CLI or module.startswith(CLI + ".")


LIBRARY = sorted(m for m in MODULES if not _is_cli(m))


def _habits(name: str) -> set[str]:
    found = {"imports fedvlr_plus.cli" for m in _imports(name) if _is_cli(m)}
    found |= {"argparse" for m in _imports(name) if m == "argparse" or m.startswith("argparse.")}
    found |= {"SystemExit"} if _exits(name) else set()
    return found


@pytest.mark.parametrize("name", LIBRARY)
def test_library_code_has_no_cli_habits(name):
    bad = {h for h in _habits(name) if (name, h) not in ALLOWED}
    assert not bad, f"{MODULES[name][0].relative_to(ROOT)}: {', '.join(sorted(bad))} belongs in fedvlr_plus/cli/"


def test_every_allowed_exception_is_still_needed():
    stale = [(m, h) for m, h in ALLOWED if m not in MODULES or h not in _habits(m)]
    assert not stale, f"no longer needed, remove from ALLOWED: {stale}"


def test_the_checks_see_what_they_look_for():
    assert "argparse" in _habits("fedvlr_plus.cli.parser") and "SystemExit" in _habits("fedvlr_plus.cli.parser")
    assert any(_is_cli(m) for m in _imports("fedvlr_plus.cli.main"))


def _unit(module: str) -> str:
    """The top-level unit of a module: its subpackage or module right under fedvlr_plus."""
    return module.split(".")[1] if "." in module else module


def _unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        for target in _imports(name):
            if target in MODULES and "." in target and _unit(target) != _unit(name):
                graph.setdefault(_unit(name), set()).add(_unit(target))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset]:
    """Strongly connected groups of more than one unit (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(frozenset(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_new_import_cycles_between_subpackages():
    new = [sorted(c) for c in _cycles(_unit_graph()) if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, f"subpackages importing each other in a circle: {new}"


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


@pytest.mark.parametrize("lower, higher", LAYERS)
def test_lower_layers_never_import_higher_ones(lower, higher):
    graph = _unit_graph()
    assert higher not in graph.get(lower, set()), f"{lower} imports {higher}: " + ", ".join(
        f"{m} -> {t}" for m in MODULES if _unit(m) == lower for t in _imports(m) if t in MODULES and _unit(t) == higher
    )
