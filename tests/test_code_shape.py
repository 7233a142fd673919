"""The code stays readable: no function longer than a screen and no file longer than ~600 lines, unless the file
says why at its top. A long function or file fails here with its name and length, so it is split when it grows,
not years later."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedvlr_plus", "adapters", "datasets")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 600
#: a file over the limit must start its docstring's reason with this phrase
LONG_FILE_REASON = "Why this file is long:"


def _sources():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _long_functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                yield f"{path}:{node.lineno} {node.name} ({length} lines)"


def test_no_function_is_longer_than_a_screen():
    found = [f for path in _sources() for f in _long_functions(path)]
    assert not found, f"split these into named steps (<= {MAX_FUNCTION_LINES} lines): {found}"


def test_long_files_say_why_at_their_top():
    found = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_FILE_LINES and LONG_FILE_REASON not in (ast.get_docstring(ast.parse(text)) or ""):
            found.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not found, f"split these along their concepts, or give the reason ({LONG_FILE_REASON!r}): {found}"


@pytest.mark.parametrize("length, fails", [(MAX_FUNCTION_LINES, False), (MAX_FUNCTION_LINES + 1, True)])
def test_the_function_check_counts_lines_as_written(tmp_path, length, fails):
    body = "\n".join(f"    x{i} = {i}" for i in range(length - 1))
    path = tmp_path / "m.py"
    path.write_text(f"def f():\n{body}\n")
    assert bool(list(_long_functions(path))) is fails
